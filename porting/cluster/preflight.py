"""`port doctor --cluster RECIPE`: catch a bad cluster before step 1.

Checks, each one row (ok / warn / fail / info) with what was found and how to fix it:

* **ports**: the master port is free on the master node (a previous job may still hold it);
* **master**: the master address resolves and answers (a refused connection still proves the host is
  there; a timeout or no route does not);
* **rank table**: the recipe's ``cluster.rank_table_file`` (or ``--rank-table``) passes every documented
  rule and agrees with ``cluster.nodes`` x ``cluster.devices_per_node``;
* **stale processes**: training processes (msrun, torchrun, `port train`) left running hold devices
  and ports (the EJ0001 case);
* **env fingerprint**: each node writes its HCCL/Ascend knobs and versions to a shared directory;
  node 0 compares them (a knob that differs between nodes makes timeouts and links disagree);
* **smoke all-reduce**: msrun runs one real AllReduce with a short timeout; a failure is diagnosed by
  `port diagnose` (its grammar and verdict);
* **disk space**: the free space of the run directory's filesystem against the plan's need at its peak (the
  checkpoints kept, one more while a save completes, the HF export: porting/train/plan/checkpoint_io.py); ok or fail.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

from model_zoo.errors import DiagnosticsError
from model_zoo.files import read_json_object, write_atomic
from porting.cluster import hccl_timeouts
from porting.cluster.smoke_shape import finished as smoke_finished
from porting.cluster.smoke_shape import note_port, smoke_at_shape, waited_port, wants_smoke
from porting.launch.jobs import WORKERS, MsrunJob, MsrunNotFound
from porting.launch.msrun import launch_devices
from porting.launch.proctable import descends, holds, is_worker, names_dir, node_of, process_table
from porting.launch.scheduler import bind_error
from porting.train.plan.launch import MsrunSpec
from porting.train.recipe.hardware import address_problem, check_node_rank
from porting.train.recipe.schema import Recipe

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
STALE_LAUNCHERS = ("msrun", "torchrun")   # argv[0] of a launcher
STALE_SEQUENCES = (("porting", "train"), ("port", "train"), ("-m", "torch.distributed.run"))
FINGERPRINT_PREFIXES = ("HCCL_", "ASCEND_", "MS_", "GLOG_")
FINGERPRINT_IGNORED = ("MS_NODE_ID", "MS_ROLE", "MS_WORKER_NUM", "MS_SCHED_HOST", "MS_SCHED_PORT")


def _row(check: str, status: str, detail: str) -> dict:
    return {"check": check, "status": status, "detail": detail}


def _is_local(addr: str) -> bool:
    try:
        ip = socket.gethostbyname(addr)
    except OSError:
        return False
    if ip.startswith("127.") or ip == "0.0.0.0":
        return True
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def check_port_free(port: int, host: str = "0.0.0.0") -> dict:
    why = bind_error(host, port)
    if why is not None:
        return _row("master port", FAIL, f"port {port} is in use on this host ({why}): a previous job or "
                                         f"another service holds it; stop it or set cluster.master_port")
    return _row("master port", OK, f"port {port} is free")


def check_master_reachable(addr: str, port: int, timeout_s: float = 3.0, wait_s: float = 0.0) -> dict:
    """Node 0's scheduler at ``addr:port``, as the other nodes see it.

    No answer within ``timeout_s`` (a dropped SYN, no route) fails. A refused connection proves the
    host is there but nothing listens: with ``wait_s`` 0 (`port doctor` before the job starts) that is
    a warning; with ``wait_s`` > 0 (`port train` on node k > 0, node 0 being started too) the check
    retries until ``wait_s`` has passed and then fails. Every wait is bounded."""
    problem = address_problem(addr)
    if problem:   # "" resolves to 0.0.0.0, which "answers": refuse it before any lookup
        return _row("master address", FAIL, f"cluster.master_addr {problem}")
    try:
        ip = socket.gethostbyname(addr)
    except OSError as e:
        return _row("master address", FAIL, f"{addr} does not resolve ({e}); set cluster.master_addr to node 0's "
                                            f"address as every node sees it")
    deadline = time.monotonic() + max(wait_s, 0.0)
    while True:
        try:
            with socket.create_connection((ip, port), timeout=timeout_s):
                return _row("master address", OK, f"{addr}:{port} ({ip}) is reachable and listening")
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))
        except OSError as e:
            why = "no answer" if isinstance(e, (socket.timeout, TimeoutError)) else (e.strerror or str(e))
            return _row("master address", FAIL, f"{addr}:{port} ({ip}) unreachable: {why} within {timeout_s:g} s; "
                                                f"check that cluster.master_addr is node 0's address as this node "
                                                f"sees it, and the route and firewall from this node to it")
    if wait_s <= 0:
        return _row("master address", WARN, f"{addr} ({ip}) answers but nothing listens on port {port} yet: "
                                            f"expected before node 0's job starts (`port train` on this node "
                                            f"waits for it)")
    return _row("master address", FAIL, f"{addr}:{port} ({ip}) refused connections for {wait_s:g} s: nothing "
                                        f"listens there; start node 0 first (its msrun scheduler listens on "
                                        f"cluster.master_port), or set cluster.master_addr/master_port to node 0's")


def check_rank_table(path: str | None, nodes: int, per_node: int) -> dict:
    if not path:
        return _row("rank table", INFO, "no rank table (msrun dynamic networking)")
    from porting.cluster import ranktable

    try:
        errs = ranktable.errors_of(ranktable.check(ranktable.load(path), nodes=nodes, cards_per_node=per_node))
    except DiagnosticsError as e:
        return _row("rank table", FAIL, str(e))
    if errs:
        return _row("rank table", FAIL, f"{path}: {len(errs)} error(s); first: {errs[0].where}: {errs[0].message}")
    return _row("rank table", OK, f"{path}: every documented rule holds for {nodes} node(s) x {per_node} device(s)")


def stale_processes(own: set[int] | None = None) -> list[tuple[int, str]]:
    """(pid, command line) of training processes other than this one and its ancestors."""
    own = set(own or ()) | _ancestors()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if _is_training(argv):
            found.append((int(entry.name), " ".join(argv).strip()[:160]))
    return sorted(found)


def _is_training(argv: list[str]) -> bool:
    """A launcher (msrun, torchrun) or a `port train` / torch.distributed.run process, by its argv."""
    if not argv or not argv[0]:
        return False
    if os.path.basename(argv[0]) in STALE_LAUNCHERS or any(os.path.basename(a) in STALE_LAUNCHERS for a in argv[1:2]):
        return True
    names = [os.path.basename(a) for a in argv]
    return any(tuple(names[i:i + len(seq)]) == seq for seq in STALE_SEQUENCES for i in range(len(names)))


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def check_stale() -> dict:
    procs = stale_processes()
    if not procs:
        return _row("stale processes", OK, "no training process (msrun, torchrun, port train) is running")
    listing = "; ".join(f"pid {p}: {c}" for p, c in procs[:4])
    return _row("stale processes", FAIL, f"{len(procs)} training process(es) still running, holding devices and ports "
                                         f"(HCCP then fails with EJ0001): {listing}; stop them (kill PID) first")


def fingerprint(environ: dict[str, str] | None = None) -> dict:
    """This node's HCCL/Ascend/MindSpore knobs and versions (what must agree across nodes)."""
    from porting import env

    environ = os.environ if environ is None else environ
    knobs = {k: v for k, v in sorted(environ.items())
             if k.startswith(FINGERPRINT_PREFIXES) and k not in FINGERPRINT_IGNORED}
    v = env.versions()
    return {"host": socket.gethostname(), "knobs": knobs,
            "versions": {"python": v.get("python"), "cann": v.get("cann"), **v.get("packages", {})}}


def write_fingerprint(directory: Path, node_rank: int, fp: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"node_{node_rank}.json"
    write_atomic(path, json.dumps(fp, indent=2, sort_keys=True), error=DiagnosticsError)
    return path


def _read_fingerprint(path: Path) -> dict:
    """One node's fingerprint, every key typed: ``knobs`` and ``versions`` objects of strings (or null)."""
    fp = read_json_object(path, what="node fingerprint", max_bytes=1 << 20, error=DiagnosticsError)
    for section in ("knobs", "versions"):
        v = fp.get(section, {})
        if not isinstance(v, dict) or not all(isinstance(x, (str, type(None))) for x in v.values()):
            found = type(v).__name__ if not isinstance(v, dict) else "an object with non-string values"
            raise DiagnosticsError(f"{path}: key '{section}' is {found}, expected an object of strings; delete the "
                                   "file and rerun `port doctor --cluster --fingerprint-dir` on that node")
    return fp


def compare_fingerprints(directory: Path, nodes: int) -> dict:
    prints = {}
    for n in range(nodes):
        p = directory / f"node_{n}.json"
        if p.is_file():
            prints[n] = _read_fingerprint(p)
    missing = [n for n in range(nodes) if n not in prints]
    if missing:
        return _row("env fingerprint", WARN, f"no fingerprint yet from node(s) {missing} in {directory}; run "
                                             f"`port doctor --cluster` on every node with the same --fingerprint-dir")
    ref = prints[0]
    diffs = []
    for n, fp in prints.items():
        for section in ("knobs", "versions"):
            keys = set(ref.get(section, {})) | set(fp.get(section, {}))
            for k in sorted(keys):
                a, b = ref.get(section, {}).get(k), fp.get(section, {}).get(k)
                if a != b:
                    diffs.append(f"{k}: node 0 {a!r}, node {n} {b!r}")
    if diffs:
        return _row("env fingerprint", FAIL, f"{len(diffs)} difference(s) between nodes: " + "; ".join(diffs[:6])
                    + "; set the same values on every node")
    return _row("env fingerprint", OK, f"{len(prints)} node(s) agree on {len(ref.get('knobs', {}))} knob(s) and versions")


Explain = Callable[[Path, int], str]   # (msrun log dir, workers) -> why the run failed, in one line


def smoke_allreduce(workers: int, port: int, timeout_s: float = 60.0, device: str = "CPU",
                    explain: Explain | None = None) -> dict:
    """msrun runs one real AllReduce on ``workers`` local workers; a failure comes with ``explain``'s
    diagnosis of its logs (the caller's: `port diagnose`, above this package)."""
    logdir = Path(tempfile.mkdtemp(prefix="port_smoke_"))
    spec = MsrunSpec(worker_num=workers, local_worker_num=workers, master_port=port, log_dir=logdir,
                     script=WORKERS / "smoke_allreduce.py", args=(device,), cluster_time_out=int(timeout_s))
    job = MsrunJob.make("smoke all-reduce", spec, overrides={"MS_CPU_COMM_OP_TIMEOUT": "10", "MS_NODE_TIMEOUT": "10"})
    try:
        ended = job.run(timeout_s=timeout_s + 30, output=Path(os.devnull))
    except MsrunNotFound:
        return _row("smoke all-reduce", FAIL, "msrun not found (it comes with mindspore); pip install mindspore")
    return allreduce_verdict(logdir, workers, -1 if ended.timed_out else ended.code, explain)


def allreduce_verdict(logdir: Path, workers: int, rc: int, explain: Explain | None = None) -> dict:
    """The smoke all-reduce's row: ok when every worker's log in ``logdir`` says it agreed, whatever msrun's exit
    code ``rc`` (porting/cluster/smoke_shape.py ``finished``)."""
    def agreed(r: int) -> bool:
        p = logdir / f"worker_{r}.log"
        if not p.is_file():
            return False
        with open(p, "rb") as f:
            return b"smoke all-reduce ok" in f.read(4 << 20)

    if all(agreed(r) for r in range(workers)):
        return _row("smoke all-reduce", OK, f"{workers} worker(s) under msrun agreed on one AllReduce"
                                            f"{smoke_finished(rc, logdir)}")
    why = explain(logdir, workers) if explain else "not diagnosed (port diagnose LOG_DIR explains it)"
    return _row("smoke all-reduce", FAIL, f"the AllReduce under msrun failed; diagnosis: {why} (logs: {logdir})")


def run_preflight(recipe_path: str | os.PathLike, *, node_rank: int = 0, fingerprint_dir: Path | None = None,
                  rank_table: str | None = None, smoke: bool = True, overrides: list[str] | None = None,
                  explain: Explain | None = None) -> dict:
    """Every check for this node; ``ok`` is False when one fails."""
    from porting.train.recipe.schema import load_recipe

    recipe = load_recipe(recipe_path, overrides, check_files=False)
    c = recipe.cluster
    check_node_rank(node_rank, c.nodes, "--node-rank")
    rows = []
    master_here = _is_local(c.master_addr)
    if master_here:
        rows.append(check_port_free(c.master_port))
    else:
        rows.append(check_master_reachable(c.master_addr, c.master_port))
    rows.append(check_rank_table(rank_table or c.rank_table_file, c.nodes, c.devices_per_node))
    if recipe.world_size > 1:   # HCCL_CONNECT_TIMEOUT < HCCL_EXEC_TIMEOUT, as the HCCL guide asks (hccl_timeouts.py)
        rows.append(hccl_timeouts.check(os.environ))
    # scoped as `port train`'s: its run directory, and on Ascend its NPUs (other jobs on a shared machine
    # are not stale); check_stale() lists every training process on the machine
    rows.append(check_stale_for_run(Path(recipe.output_dir), node_rank, launch_devices(recipe)))
    if fingerprint_dir is not None:
        write_fingerprint(fingerprint_dir, node_rank, fingerprint())
        rows.append(compare_fingerprints(fingerprint_dir, c.nodes) if node_rank == 0 else
                    _row("env fingerprint", INFO, f"written to {fingerprint_dir}/node_{node_rank}.json; node 0 compares"))
    else:
        rows.append(_row("env fingerprint", INFO, "pass --fingerprint-dir SHARED_DIR on every node to compare knobs"))
    if smoke and c.nodes > 1:   # every node joins the real-shape smoke test (porting/cluster/smoke_shape.py)
        rows.append(smoke_at_shape(recipe, node_rank, explain=explain, port_check=check_port_free))
    elif smoke and rows[0]["status"] != FAIL and master_here:
        workers = min(2, c.devices_per_node) if c.device == "cpu" else c.devices_per_node
        port = free_port()
        rows.append(smoke_allreduce(max(workers, 2), port, device="CPU" if c.device == "cpu" else "Ascend",
                                    explain=explain))
    elif smoke:
        rows.append(_row("smoke all-reduce", INFO, "run on the master node (or fix the rows above first)"))
    rows.append(disk_row(recipe, Path(recipe.output_dir)))
    if smoke:   # the checkpoint filesystem's bandwidth, written as a save writes it
        from porting.train.plan.fs_speed import doctor_row  # deferred: only a measuring preflight needs it

        rows.append(doctor_row(recipe, Path(recipe.output_dir)))
    return {"recipe": str(recipe_path), "node_rank": node_rank, "master": f"{c.master_addr}:{c.master_port}",
            "world_size": recipe.world_size, "checks": rows, "ok": not any(r["status"] == FAIL for r in rows)}


def disk_row(recipe: Recipe, folder: Path) -> dict:
    """The free space of the filesystem of ``folder`` (the run directory: its nearest existing folder, nothing
    created) against the plan's need at its peak (porting/train/plan/checkpoint_io.py ``disk_plan``); ok or fail."""
    import shutil

    from model_zoo.errors import PortingError
    from porting.train import plan_config  # deferred: the planner (the model's config), for this row only
    from porting.train.plan import sharding  # deferred: as above
    from porting.train.plan.checkpoint_io import GIB, disk_plan, gib_text  # deferred: as above

    folder = folder.absolute()
    where = next((p for p in [folder, *folder.parents] if p.is_dir()), Path("/"))
    try:
        cfg, _ = plan_config(recipe)
        need = disk_plan(recipe, cfg, sharding.layout_for(recipe, cfg))
        free = shutil.disk_usage(where).free / GIB
    except (PortingError, OSError) as e:
        return _row("disk space", FAIL, f"{where}: not planned ({e})")
    detail = (f"{gib_text(need.need_gib)} needed at the peak ({need.peak_during}: {need.formula}), {gib_text(free)} "
              f"free on the filesystem of {where}")
    if free < need.need_gib:
        return _row("disk space", FAIL, detail + "; free space there, lower checkpointing.keep_last, or set output_dir "
                                                 "on a larger filesystem (shared by every node)")
    return _row("disk space", OK, detail)


def run_train_preflight(recipe: Recipe, run_dir: Path, node_rank: int = 0, smoke: bool | None = None,
                        explain: Explain | None = None) -> dict:
    """What `port train` checks on this node before it launches, cheap unless a cluster is involved.

    Always: no training process uses this run directory, and on Ascend no process holds this node's
    NPUs; the rank table against the recipe when there is one. Under msrun: the
    master port is free on node 0 (which hosts the scheduler at master_addr, so master_addr must be
    this machine), or node 0's scheduler answers from node k > 0 (waited for, bounded by
    ``cluster_time_out`` and 120 s). The smoke test (``smoke=None``: on Ascend, where HCCL links are
    what fails): with several nodes every node joins the real-shape test
    (porting/cluster/smoke_shape.py: world, TP and DP groups, each collective timed; node k > 0 first
    waits for node 0's smoke scheduler); on one node, the all-reduce on node 0."""
    c = recipe.cluster
    check_node_rank(node_rank, c.nodes, "--launch-node")
    rows = []
    if recipe.world_size > 1 and node_rank == 0:
        rows.append(check_port_free(c.master_port) if _is_local(c.master_addr) else
                    _row("master address", FAIL, f"node 0 hosts the msrun scheduler at cluster.master_addr, but "
                                                 f"{c.master_addr} is not an address of this machine; run node 0 "
                                                 f"on {c.master_addr} or set cluster.master_addr to this machine"))
    elif recipe.world_size > 1:   # with the shape smoke, node 0's smoke scheduler listens first, on its port
        rows.append(note_port(check_master_reachable(c.master_addr, waited_port(recipe, smoke),
                                                     wait_s=min(c.cluster_time_out, 120)), recipe, smoke))
    if c.rank_table_file:
        rows.append(check_rank_table(c.rank_table_file, c.nodes, c.devices_per_node))
    rows.append(check_stale_for_run(Path(run_dir), node_rank, launch_devices(recipe)))
    want_smoke = wants_smoke(recipe, smoke)
    # one node too when the run has groups (ZeRO's ReduceScatter/AllGather, TP): every collective it runs, on its
    # groups, at its fused bucket's size (float32, the gradients' reduction dtype), before step 1 meets them
    grouped = recipe.world_size > 1 and (recipe.parallel.optimizer_sharding or recipe.parallel.tensor_parallel > 1)
    if want_smoke and (c.nodes > 1 or grouped) and not any(r["status"] == FAIL for r in rows):
        from porting.train.plan.memory import fusion_buffer_bytes  # deferred: the plan's bucket size

        # the bucket's size on one node and on Ascend (a CPU test of a multi-node shape keeps 1 MiB: 4 workers of
        # 64 MiB collectives on two cores outlast the smoke test's timeout)
        big = grouped and (c.nodes == 1 or c.device == "ascend")
        rows.append(smoke_at_shape(recipe, node_rank, explain=explain, port_check=check_port_free,
                                   elements=int(fusion_buffer_bytes(recipe)) // 4 if big else None))
    elif want_smoke and node_rank == 0 and c.devices_per_node > 1 and not any(r["status"] == FAIL for r in rows):
        rows.append(smoke_allreduce(c.devices_per_node if c.device == "ascend" else 2, free_port(),
                                    device="Ascend" if c.device == "ascend" else "CPU", explain=explain))
    return {"node_rank": node_rank, "master": f"{c.master_addr}:{c.master_port}", "world_size": recipe.world_size,
            "checks": rows, "ok": not any(r["status"] == FAIL for r in rows)}


def check_stale_for_run(run_dir: Path, node_rank: int, devices: list[int] | None = None) -> dict:
    """Processes that would collide with a launch into ``run_dir`` from this node: training processes
    naming the run directory in their command line or holding a file in it open (two jobs writing one
    run directory), and, with ``devices`` (Ascend), any process holding one of those NPUs open
    (``/dev/davinciN``: HCCP then fails with EJ0001). The other node ranks of the same job started on
    this machine (``--launch-node M`` / ``--node_rank=M``, and their children) are not stale."""
    target = Path(os.path.abspath(run_dir))
    nodes = {f"/dev/davinci{d}" for d in devices or ()}
    procs = process_table()
    siblings = {pid for pid, (_, argv, _) in procs.items() if node_of(argv) not in (None, node_rank)}
    own = _ancestors()
    found = []
    for pid, (_, argv, cwd) in procs.items():
        if pid in own or descends(pid, siblings, procs):
            continue
        training = _is_training(argv) or is_worker(argv)
        if (training and (names_dir(argv, cwd, target) or holds(pid, lambda p: p == target or target in p.parents))
                or nodes and holds(pid, lambda p: str(p) in nodes)):
            found.append((pid, " ".join(argv).strip()[:160]))
    if not found:
        return _row("stale processes", OK, f"no training process on {target}"
                    + (f", no process on NPU(s) {sorted(devices or ())}" if nodes else ""))
    listing = "; ".join(f"pid {p}: {cmd}" for p, cmd in sorted(found)[:4])
    return _row("stale processes", FAIL, f"{len(found)} process(es) still running on {target}"
                + (f" or NPU(s) {sorted(devices or ())} (HCCP then fails with EJ0001)" if nodes else "")
                + f": {listing}; stop them (kill PID) or choose another --run-dir")


def free_port() -> int:
    """A TCP port free on this machine now (the OS picks it); port's one helper for it (tests use it too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_preflight(rep: dict) -> str:
    out = [f"port doctor --cluster {rep['recipe']}: node {rep['node_rank']}, master {rep['master']}, "
           f"world size {rep['world_size']}"]
    out += [f"  [{r['status']:>4}] {r['check']:<18} {r['detail']}" for r in rep["checks"]]
    out.append("result: " + ("ok" if rep["ok"] else "problems found (see [fail] above)"))
    return "\n".join(out)
