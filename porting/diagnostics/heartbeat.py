"""HCCL's cluster heartbeat, read on every rank's log: the crimer it names is the culprit.

HCCL keeps maintenance links between neighbouring ranks and spreads every abnormal event over the cluster, so
the run log of *any* rank carries the fault's root (CANN 9.0 HCCL user guide, "cluster heartbeat",
hcclug_000054/000055; hicann/hccl docs fault_diagnosis/task_exec_stage.md):

* run log (INFO): ``[HeartbeatAbnormal]local rank [IP/L]: crimer rank [IP/C] status[S] by informer rank [IP/I]``
  (C is the root, I the rank that detected it, L the rank whose log this is);
* debug log (ERROR), the events HCCL ranks most likely: ``Cluster Exception Location[IP/ID]:[IP/C], Arrival
  Time:[...], Discoverer:[IP/I], ExceptionType:[Heartbeat Lost Occurred | Stuck Occurred | Error cqe Occurred]``.

Priority (the guide's table): ERROR CQE (the RoCE driver's retransmissions went over the limit: network or the
remote process) > STUCK (operator counters did not move for 1/3 of HCCL_EXEC_TIMEOUT) > LOST (no heartbeat
for 30 s: the process exited). Within one status the earliest report wins: a later loss can be the fallout of
the first. A crimer line is a line that says who the culprit is, so the verdict names that rank.
"""

from __future__ import annotations

from porting.diagnostics.grammar import Event
from porting.diagnostics.outcome import Verdict

# status (run log) and ExceptionType (debug log) -> the guide's priority (lower first) and what it means
STATUS = {
    "ERROR CQE": (0, "ERROR CQE: the RoCE link to it dropped packets past the retransmission limit (network, or its "
                     "process gone)"),
    "STUCK": (1, "STUCK: its operator counters stopped moving (host process or device task stuck)"),
    "LOST": (2, "LOST: no heartbeat from it for 30 s (its process exited, or its network is down)"),
}
OCCURRED = {"Error cqe Occurred": "ERROR CQE", "Stuck Occurred": "STUCK", "Heartbeat Lost Occurred": "LOST"}
OTHER_PRIORITY = 3   # statuses the guide does not rank (NOTIFY, INCONSISTENT, ...)


def status_of(e: Event) -> str:
    """The heartbeat status a report carries: ERROR CQE, STUCK, LOST, or what else HCCL printed."""
    t = str(e.facts.get("exception_type", ""))
    t = t.removeprefix("heartbeat status ").strip()
    return OCCURRED.get(t, t.upper() if t.upper() in STATUS else t)


def reports(views: dict) -> list[tuple[object, Event]]:
    return [(v, e) for v in views.values() for e in v.events if "located_rank" in e.facts]


def from_heartbeat(views: dict) -> Verdict | None:
    """The crimer of the highest-priority heartbeat status, the earliest report of it; None without reports."""
    found = reports(views)
    if not found:
        return None

    def key(item):
        _v, e = item
        return (STATUS.get(status_of(e), (OTHER_PRIORITY,))[0], e.ts is None, e.ts or 0.0, e.source, e.line)
    found.sort(key=key)
    _v, e = found[0]
    r, status = e.facts["located_rank"], status_of(e)
    top = [x for _, x in found if status_of(x) == status]
    culprits = sorted({x.facts["located_rank"] for x in top})
    others = sorted({x.facts["located_rank"] for _, x in found} - {r})
    meaning = STATUS.get(status, (OTHER_PRIORITY, f"status {status}"))[1]
    crimer = " as the crimer" if e.facts.get("crimer") else ""
    reason = (f"located: HCCL's heartbeat report names rank {r}{crimer} ({e.facts.get('exception_type')}, address "
              f"{e.facts.get('located_ip')}): {meaning}")
    why = (f"HCCL's heartbeat report names rank {r} in {sum(x.facts['located_rank'] == r for x in top)} "
           f"report(s) of status {status}; the HCCL guide ranks ERROR CQE > STUCK > LOST and the earliest report "
           f"of the top status is the root")
    if len(culprits) > 1:
        why += f"; not high: status {status} also names rank(s) {[c for c in culprits if c != r][:8]}"
    elif others:
        why += f"; lower-priority or later reports name rank(s) {others[:8]}"
    collect = (f"rank {r}'s own log and plog: did its process exit (its last lines), hang (py-spy dump), or its "
               f"network go down (`hccn_tool -i <device> -link_stat -g`)?",)
    cause = e.cause or "process_exit"
    suspect = {"entity": "rank", "id": r, "text": f"rank {r}", "via": "heartbeat crimer"}
    if "Time out nodes" in e.text:
        # msrun's scheduler (mindspore/parallel/cluster/process_entity/_api.py), not HCCL: the worker stopped
        # reporting to it; that it is the one that failed is sure, why is not (hung, exited, host unreachable)
        reason = (f"located: msrun's scheduler names rank {r} as a timed-out node ({e.text.strip()[-80:]}): it stopped "
                  f"reporting to the scheduler (its process hung or exited, or its host became unreachable)")
        why = f"msrun's scheduler names rank {r} as timed out; not high: the scheduler does not say why"
        collect = (f"worker_{r}.log of msrun's --log_dir (its last lines and traceback) and scheduler.log",)
        return Verdict(r, None, reason, "comm_timeout", (e.as_dict(),), "medium", why, collect,
                       dict(suspect, via="msrun scheduler"), cause, "lost")
    return Verdict(r, None, reason, "comm_timeout", (e.as_dict(),), "high" if len(culprits) == 1 else "medium",
                   why, collect, suspect, cause, e.fault or {"ERROR CQE": "error_cqe", "STUCK": "stuck"}.get(status, "lost"))
