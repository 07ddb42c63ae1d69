"""The preflight's smoke test at the run's real shape: every node starts its share of
``worker_num = nodes x devices_per_node`` workers under msrun, node 0 hosting the scheduler, so the
cross-node links, the tensor-parallel and data-parallel groups and the collectives the step uses
(porting/launch/workers/smoke_collectives.py) are exercised before step 1, each timed. A failure names the
node, the rank, the group and the collective it stopped in, read from this node's worker logs; what
those logs cannot explain (a worker that never started) goes to ``explain`` (`port diagnose`).

The smoke scheduler listens on ``cluster.master_port + 1``: the training job's msrun takes
``master_port`` right after, and a worker of the next job must never register with the smoke's
scheduler while it shuts down. Open both ports between the nodes.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from porting.launch.jobs import WORKERS, MsrunJob, MsrunNotFound
from porting.launch.workers.smoke_collectives import ELEMENTS
from porting.train.plan.launch import MsrunSpec, msrun_argv
from porting.train.recipe.schema import Recipe

Explain = Callable[[Path, int], str]
LINE = re.compile(r"smoke rank (\d+) node (\d+) group (\S+)(?: ranks (\S+))? op (.+?) "
                  r"(start|ok ([\d.]+) ms (\d+) bytes|FAILED: (.*))$")
DONE = "smoke collectives ok"
CHECK = "smoke collectives"   # the preflight row's name
MAX_LOG_BYTES = 4 << 20


def smoke_port(recipe: Recipe) -> int:
    return recipe.cluster.master_port + 1


def wants_smoke(recipe: Recipe, smoke: bool | None) -> bool:
    """``smoke=None``: on Ascend, where HCCL links and device state are what fails before step 1 (with
    several nodes, this real-shape test on every node); a CPU job's own first step runs the same MCCL
    collectives within seconds, so `port train` on the CPU runs it only when asked (`port doctor
    --cluster` does by default)."""
    return recipe.cluster.device == "ascend" if smoke is None else smoke


def waited_port(recipe: Recipe, smoke: bool | None) -> int:
    """The port node k > 0 waits for before its launch: node 0's smoke scheduler when the shape smoke
    runs (node 0 starts its training msrun only after it), else the training msrun's."""
    return smoke_port(recipe) if wants_smoke(recipe, smoke) and recipe.cluster.nodes > 1 else recipe.cluster.master_port


def note_port(row: dict, recipe: Recipe, smoke: bool | None) -> dict:
    """A node k > 0 master-address row about the smoke scheduler's port says so (its fix differs)."""
    if waited_port(recipe, smoke) != recipe.cluster.master_port and row.get("status") != "ok":
        row = dict(row, detail=row["detail"] + f"; port {smoke_port(recipe)} is cluster.master_port + 1, where node "
                                               "0's preflight smoke test listens before its training job starts")
    return row


def smoke_spec(recipe: Recipe, node_rank: int, logdir: Path, timeout_s: float,
               elements: int | tuple[int, ...] | None = None) -> MsrunSpec:
    """msrun running smoke_collectives.py on this node's workers; ``elements``: each collective's float32 count
    per rank, or several counts, each collective run at each in one launch."""
    c = recipe.cluster
    target = "CPU" if c.device == "cpu" else "Ascend"
    args = (target, str(recipe.parallel.tensor_parallel), str(node_rank)) + (
        (",".join(map(str, _sizes(elements))),) if elements else ())
    return MsrunSpec(worker_num=recipe.world_size, local_worker_num=c.devices_per_node, master_port=smoke_port(recipe),
                     log_dir=logdir, script=WORKERS / "smoke_collectives.py", args=args, master_addr=c.master_addr,
                     node_rank=node_rank, cluster_time_out=int(timeout_s))


def launch_command(recipe: Recipe, node_rank: int, logdir: Path, timeout_s: float,
                   elements: int | tuple[int, ...] | None = None) -> list[str]:
    """The smoke's msrun command as a user would type it (a rehearsal's record)."""
    return msrun_argv(smoke_spec(recipe, node_rank, logdir, timeout_s, elements))


def _sizes(elements: int | tuple[int, ...] | None) -> tuple[int, ...]:
    if not elements:
        return (ELEMENTS,)
    return (elements,) if isinstance(elements, int) else tuple(elements)


def read_worker_logs(logdir: Path) -> dict[int, dict]:
    """Per rank of this node: its node, its finished collectives (group, op) -> ms, the one it started
    and did not finish, a failure line, whether it finished."""
    ranks: dict[int, dict] = {}
    for log in sorted(logdir.glob("worker_*.log")):
        with open(log, "rb") as f:
            text = f.read(MAX_LOG_BYTES).decode("utf-8", "replace")
        for line in text.splitlines():
            m = LINE.search(line)
            if m:
                r = ranks.setdefault(int(m[1]), {"node": int(m[2]), "ok": {}, "open": None, "failed": None,
                                                 "done": False, "members": {}})
                group, op = m[3], m[5]
                if m[4]:
                    r["members"][group] = m[4]
                if m[6] == "start":
                    r["open"] = (group, op)
                elif m[9] is not None:
                    r["failed"] = (group, op, m[9])
                else:
                    r["ok"][(group, op, int(m[8]))] = float(m[7])
                    r["open"] = None
            elif DONE in line:
                num = re.search(r"rank (\d+)/", line)
                if num:
                    ranks.setdefault(int(num[1]), {"node": -1, "ok": {}, "open": None, "failed": None,
                                                   "done": False, "members": {}})["done"] = True
    return ranks


def diagnose(ranks: dict[int, dict], node_rank: int, local: int, per_node: int) -> str | None:
    """One line naming the first rank of this node that failed or stopped, its group and collective."""
    for rank in sorted(ranks):
        r = ranks[rank]
        where = r["failed"] or (r["open"] + ("did not complete (a peer never joined it, or its link is down)",)
                                if r["open"] else None)
        if where is None:
            continue
        group, op, why = where
        members = r["members"].get(group, "")
        nodes = sorted({int(x) // per_node for x in members.split(",") if x.isdigit()})
        return (f"node {node_rank}, rank {rank}: group {group} (ranks {members or '?'}, node(s) "
                f"{', '.join(map(str, nodes)) or '?'}) {op}: {why}")
    missing = local - sum(1 for r in ranks.values() if r["done"])
    return None if missing <= 0 else f"node {node_rank}: {missing} of {local} worker(s) did not finish"


def timings(ranks: dict[int, dict], nbytes: int) -> dict[str, float]:
    """'group kind op' -> slowest median milliseconds over this node's ranks (tp_0, tp_2 -> tp), of the
    collectives run at ``nbytes`` per rank."""
    out: dict[str, float] = {}
    for r in ranks.values():
        for (group, op, size), ms in r["ok"].items():
            if size == nbytes:
                key = f"{group.split('_')[0]} {op}"
                out[key] = max(out.get(key, 0.0), ms)
    return out


def smoke_at_shape(recipe: Recipe, node_rank: int, timeout_s: float = 90.0, explain: Explain | None = None,
                   port_check: Callable[[int], dict] | None = None, elements: int | None = None) -> dict:
    """This node's share of the real-shape smoke test; a preflight row (check, status, detail) plus
    ``collectives``: the slowest time of each (group, collective) on this node, in milliseconds.
    ``port_check`` (the preflight's ``check_port_free``) first checks the smoke port on node 0; ``elements``
    sets each collective's float32 count per rank (default smoke_collectives.ELEMENTS, 1 MiB); several counts run
    in one launch, ``collectives`` then the first count's times and ``collectives_at`` every count's, by bytes
    per rank."""
    logdir = Path(tempfile.mkdtemp(prefix=f"port_smoke_node{node_rank}_"))
    if node_rank == 0 and port_check is not None and port_check(smoke_port(recipe))["status"] == "fail":
        return {"check": CHECK, "status": "fail", "detail": f"port {smoke_port(recipe)} (cluster.master_port + 1, the "
                "smoke test's scheduler) is in use on node 0; free it or choose another cluster.master_port"}
    job = MsrunJob.make("smoke collectives", smoke_spec(recipe, node_rank, logdir, timeout_s, elements),
                        overrides={"MS_CPU_COMM_OP_TIMEOUT": "15", "MS_NODE_TIMEOUT": "30",
                                   "HCCL_CONNECT_TIMEOUT": "120", "HCCL_EXEC_TIMEOUT": "120"})
    try:   # a same-host node rank > 0 runs --join=False and its workers are awaited (porting/launch/jobs.py)
        ended = job.run(timeout_s=timeout_s + 60, output=Path(os.devnull))
    except MsrunNotFound:
        return {"check": CHECK, "status": "fail", "detail": "msrun not found (it comes with mindspore)"}
    return verdict(recipe, node_rank, -1 if ended.timed_out else ended.code, logdir, _sizes(elements), explain)


def finished(rc: int, logdir: Path) -> str:
    """For a smoke whose every worker logged its end: msrun's exit code ``rc`` does not decide, as for a training
    launch (porting/launch/outcome.py). A worker whose exit reaches the scheduler late (past MS_NODE_TIMEOUT on a
    loaded host) makes msrun exit 1 after every collective agreed: the row says so and the logs in ``logdir`` are
    kept; with ``rc`` 0 they are removed. Returns what the row's detail adds ("" for ``rc`` 0)."""
    if rc == 0:
        shutil.rmtree(logdir, ignore_errors=True)
        return ""
    return (f"; msrun exited {rc} after every worker had finished (its scheduler saw a worker's exit late; "
            f"logs: {logdir})")


def verdict(recipe: Recipe, node_rank: int, rc: int, logdir: Path, sizes: tuple[int, ...],
            explain: Explain | None = None) -> dict:
    """The smoke row from this node's worker logs in ``logdir`` and msrun's exit code ``rc``: ok when every worker
    ran every collective and logged its end, whatever ``rc`` (removing ``logdir`` when ``rc`` is 0 too)."""
    c = recipe.cluster
    ranks = read_worker_logs(logdir)
    why = diagnose(ranks, node_rank, c.devices_per_node, c.devices_per_node)
    at = {4 * e: timings(ranks, 4 * e) for e in sizes}
    times = at[4 * sizes[0]]
    if why is None:   # every worker of this node ran every collective and logged its end (``diagnose``)
        late = finished(rc, logdir)
        shape = (f"{recipe.world_size} worker(s), {c.nodes} node(s), TP {recipe.parallel.tensor_parallel} x DP "
                 f"{recipe.data_parallel_size}")
        listing = "; ".join(f"{k} {v:.2f} ms" for k, v in sorted(times.items()))
        size = f"{sizes[0] * 4 >> 20} MiB"
        return {"check": CHECK, "status": "ok", "collectives": times, "collectives_at": at,
                "detail": f"node {node_rank} of {shape}: every group's collectives agreed ({listing}; {size} each, "
                          f"slowest rank of this node){late}"}
    if explain is not None and not any(r["failed"] or r["open"] for r in ranks.values()):
        why += f" ({explain(logdir, c.devices_per_node)})"   # no collective named: a worker that never started
    return {"check": CHECK, "status": "fail", "collectives": times, "collectives_at": at,
            "detail": f"{why}; msrun exit {rc} (logs: {logdir}; `port diagnose {logdir}`)"}
