"""The checkpoint filesystem's write bandwidth, measured as a save uses it: ``processes`` writers at once
(as many as a node runs workers), each writing its own file in large blocks and ``fsync``-ing it, the
aggregate being the bytes of all of them over the time until the last one's fsync returned.

``checkpointing.fs_gib_per_s`` is the aggregate bandwidth all ranks of the cluster share
(porting/train/plan/comm.py ``save_seconds``). One node's measurement is an upper bound of the cluster's
on a filesystem whose bandwidth does not grow with the clients (a NAS, an NFS server, SFS Turbo: its
documented maximum is per file system); measure on every node at once for the cluster's figure.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
from pathlib import Path

from porting.train.recipe.schema import Recipe
BLOCK = 16 << 20
MAX_BYTES_PER_PROCESS = 64 << 30


def _writer(path: str, nbytes: int, start, done) -> None:
    block = os.urandom(1 << 20) * (BLOCK >> 20)   # incompressible, as checkpoint data is
    start.wait()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, BLOCK)
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    done.put(time.perf_counter())


def measure_write_bandwidth(folder: Path, processes: int, bytes_per_process: int = 256 << 20,
                            timeout_s: float = 600.0) -> dict:
    """``{"gib_per_s", "processes", "bytes", "seconds"}``: ``processes`` concurrent writers of
    ``bytes_per_process`` each into a temporary folder under ``folder`` (removed after, whatever happens)."""
    if not 1 <= processes <= 256 or not 1 <= bytes_per_process <= MAX_BYTES_PER_PROCESS:
        raise ValueError(f"processes {processes} (1-256) or bytes_per_process {bytes_per_process} out of range")
    work = Path(tempfile.mkdtemp(prefix=".port-fs-speed-", dir=folder))
    ctx = mp.get_context("spawn")
    start, done = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(work / f"w{i}"), bytes_per_process, start, done), daemon=True)
             for i in range(processes)]
    try:
        for p in procs:
            p.start()
        t0 = time.perf_counter()
        start.set()
        ends = [done.get(timeout=timeout_s) for _ in procs]
        seconds = max(ends) - t0
        total = processes * bytes_per_process
        return {"gib_per_s": round(total / seconds / (1 << 30), 3), "processes": processes, "bytes": total,
                "seconds": round(seconds, 3)}
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
        shutil.rmtree(work, ignore_errors=True)


def doctor_row(recipe: Recipe, folder: Path, bytes_per_process: int = 64 << 20) -> dict:
    """A `port doctor --cluster` row (porting/cluster/preflight.py's shape: check, status, detail): this node's
    aggregate write bandwidth into ``folder`` (the run's checkpoint filesystem: its nearest existing folder,
    nothing is created) from as many writers as the node runs workers, against the recipe's
    ``checkpointing.fs_gib_per_s``; "warn" when slower."""
    where = next((p for p in [folder, *folder.parents] if p.is_dir()), Path("."))
    try:
        got = measure_write_bandwidth(where, recipe.cluster.devices_per_node, bytes_per_process)
    except (OSError, ValueError) as e:
        return {"check": "checkpoint filesystem", "status": "warn", "detail": f"{where}: not measured ({e})"}
    said = recipe.checkpointing.fs_gib_per_s
    detail = (f"{got['gib_per_s']:g} GiB/s aggregate: {got['processes']} writers x {bytes_per_process >> 20} MiB "
              f"with fsync in {got['seconds']:g} s into {where}; the recipe plans with checkpointing.fs_gib_per_s "
              f"{said:g} (the whole cluster's)")
    if got["gib_per_s"] < said:
        return {"check": "checkpoint filesystem", "status": "warn",
                "detail": detail + f"; set --set checkpointing.fs_gib_per_s={got['gib_per_s']:g} or lower"}
    return {"check": "checkpoint filesystem", "status": "ok", "detail": detail}
