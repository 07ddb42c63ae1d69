"""What port's own runs say beyond any field log: which part of a checkpoint save each rank is in, and what msrun's
scheduler saw.

* **A rank frozen inside a save.** `port train` announces every part of a save on each rank's log and heartbeat
  (porting/rundir/ranklog.py ``SAVE_PARTS``: "wait" for the others, "write" its own file, "barrier" once written,
  "record" on rank 0, "done"). Every rank's phase says "save" until the save ends, so the phase alone cannot tell a
  rank that froze while writing from the ranks waiting for it; the part can: at the same save, a rank whose last
  part is "write" or "record" while others reached "wait" or "barrier" is the one they wait for.
* **msrun's scheduler lost a heartbeat.** MindSpore's scheduler declares a worker timed out when its heartbeat to
  the scheduler stops (mindspore/ccsrc/cluster/topology/meta_server_node.cc: "The node: N is timed out"; the
  process froze, was stopped, died, or its host went away). A rank that fell silent without an error of its own and
  that the scheduler lost is the culprit (``process_exit`` / ``lost``), not a rank whose collective then timed out.
"""

from __future__ import annotations

from porting.diagnostics.grammar import fmt_ts
from porting.diagnostics.outcome import Scheduler, Verdict
from porting.diagnostics.ranks import RankView, corrected, sort_key
from porting.rundir.ranklog import SAVE_PARTS

WAITING = ("wait", "barrier")
WORKING = ("write", "record")


def frozen_saver(views: dict[int | str, RankView], sched: Scheduler) -> tuple[RankView, Verdict] | None:
    """(the rank's view, the verdict) when, at one save, some ranks wait at a barrier while others are still in their
    own part; None otherwise."""
    parts = {v.rank: v for v in views.values() if isinstance(v.rank, int) and v.save_part is not None}
    if len(parts) < 2:
        return None
    step = max(v.save_part[0] for v in parts.values())
    at = [v for v in parts.values() if v.save_part[0] == step]
    waiting = sorted((v for v in at if v.save_part[1] in WAITING), key=lambda v: sort_key(v.rank))
    working = sorted((v for v in at if v.save_part[1] in WORKING),
                     key=lambda v: (corrected(v.save_part[2], v.offset) or 0.0, sort_key(v.rank)))
    if not waiting or not working:
        return None
    first = working[0]
    part, since = first.save_part[1], fmt_ts(corrected(first.save_part[2], first.offset))
    reached = ", ".join(f"rank {v.rank} at {fmt_ts(corrected(v.save_part[2], v.offset))}" for v in waiting[:8])
    lost = first.rank in sched.timed_out
    reason = (f"frozen in a save: rank {first.rank} stopped inside checkpoint step {step}'s save, "
              f"{SAVE_PARTS[part]} (since {since}), while the others reached the save's barrier and waited for it "
              f"({reached})" + ("; msrun's scheduler then lost its heartbeat" if lost else "")
              + (f"; rank(s) {[v.rank for v in working[1:8]]} were in their own part too" if len(working) > 1 else ""))
    why = (f"the save's parts on every rank's log: rank {first.rank}'s last is '{part}', the others' "
           f"'{waiting[0].save_part[1]}' at the same step {step}" + ("; msrun's scheduler lost its heartbeat" if lost
                                                                      else "")
           + ("" if len(working) == 1 else f"; not high: {len(working)} ranks had not reached the barrier"))
    collect = (f"rank {first.rank}'s process: a py-spy dump (or its state in /proc: stopped, D-state I/O) while it "
               f"hangs, `dmesg` on its host, the checkpoint filesystem's health (a write that never returns)",)
    return first, Verdict(first.rank, first.last_step, reason, "stall", (), "high" if len(working) == 1 else "medium",
                          why, collect, {"entity": "rank", "id": first.rank, "text": f"rank {first.rank}",
                                         "via": "save parts"}, "process_exit", "stuck", "culprit")


def scheduler_lost(rank: int | str, sched: Scheduler) -> str:
    """A clause for a rank that msrun's scheduler lost, '' when it did not."""
    if rank not in sched.timed_out:
        return ""
    first = " first" if sched.first == rank else ""
    return (f"; msrun's scheduler lost its heartbeat{first} (its process stopped, froze or died): the culprit, not a "
            f"rank that waited")
