"""The supervisor's watch over the ranks of one node: a heartbeat per rank, with an allowance per phase.

Every ``poll_s`` the supervisor asks :meth:`Watch.poll`. A rank shows life when its heartbeat record
(porting/rundir/heartbeat.py: phase, step, pid) changes or its log (``logs/rank_<r>.log``) grows; a rank that
shows none for its phase's allowance has stalled:

==========================  ===============  ==================================================================
phase                       allowance        why
==========================  ===============  ==================================================================
setup, compile              ``compile_s``    data, model, every shape's graph compiled before step 1
restore                     ``restore_s``    a resume reads its share of the checkpoint before it compiles
step                        ``stall_s``      a step line every ``logging.every_steps``
save                        ``save_s``       a slow filesystem is not a fault; a save that never ends is one
finished                    ``save_s``       a rank that ended may wait at exit while rank 0 writes the HF export
==========================  ===============  ==================================================================

Each comes from the plan (``TrainPlan.allowances``, porting/train/plan/allowances.py: the graphs to compile, the
bytes to restore and to save at the filesystem's measured speed, the estimated step), through
:func:`derive_limits`; ``--stall-timeout`` sets the step's and is the least of every phase's. The step's stays
under half of ``HCCL_EXEC_TIMEOUT``, so the other ranks' evidence is still live when the supervisor looks.
A rank whose process is gone, or stopped (SIGSTOP, a debugger) or in uninterruptible sleep,
is named from its pid. The watch reads time from ``now`` (default ``time.monotonic``): its tests move a clock
instead of sleeping.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Callable

from porting.launch.proctable import alive, state
from porting.rundir.heartbeat import read_beat
from porting.rundir.paths import RunDir
from porting.rundir.ranklog import SAVE_PARTS, read_tail
from porting.train.plan.allowances import Allowances

# msrun, when a worker dies: "Worker process 17593 exit with exception. Error code: -9." (then it kills the rest)
WORKER_EXIT = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")
DOING = {"setup": "compiling or before its first step", "compile": "compiling or before its first step",
         "restore": "restoring a checkpoint", "save": "saving a checkpoint", "finished": "after its run ended"}


@dataclasses.dataclass(frozen=True)
class Limits:
    stall_s: float = 600.0
    compile_s: float = 1800.0
    save_s: float = 600.0
    restore_s: float = 600.0
    max_restarts: int = 3
    poll_s: float = 1.0
    grace_s: float = 10.0

    def allowance(self, phase: str) -> float:
        """Seconds a rank in ``phase`` may go without a sign of life (the module docstring's table)."""
        return {"setup": self.compile_s, "compile": self.compile_s, "restore": self.restore_s,
                "save": self.save_s, "finished": self.save_s}.get(phase, self.stall_s)


def derive_limits(a: Allowances, stall_s: float | None, max_restarts: int) -> Limits:
    """The watch's allowances from the plan's (porting/train/plan/allowances.py, ``TrainPlan.allowances``): each the
    longest silence the plan expects in the phase with its margin (one graph, one restored group, not the phase's
    total); the setup and compile phases share one limit here, the larger of the plan's ``setup_s`` (joining the
    cluster, one HF-load group) and ``compile_s`` (one graph). ``stall_s`` (``--stall-timeout``) replaces the
    step's and no phase allows less."""
    stall = float(stall_s if stall_s is not None else a.step_s)
    return Limits(stall_s=stall, compile_s=max(stall, float(a.setup_s), float(a.compile_s)),
                  save_s=max(stall, float(a.save_s)), restore_s=max(stall, float(a.restore_s)),
                  max_restarts=max_restarts)


@dataclasses.dataclass
class _Beat:
    size: int = 0                       # the rank log's size when last read
    seen: tuple[int, int] | None = None  # (pid, seq) of the last heartbeat record read
    at: float = 0.0                     # when (the watch's clock) the rank last showed life
    phase: str = "setup"                # before its first record of this launch, a rank is in setup
    step: int | None = None
    pid: int | None = None
    part: str | None = None             # the part of a save it is in (ranklog.SAVE_PARTS), None outside a save

    def doing(self) -> str:
        if self.phase == "save" and self.part in SAVE_PARTS:
            return f"in checkpoint step {self.step}'s save: {SAVE_PARTS[self.part]}"
        return DOING.get(self.phase) or f"after step {self.step}"

    def waits(self) -> bool:
        """At a save's barrier: it waits for the others, so it is not the rank that froze."""
        return self.phase == "save" and self.part in ("wait", "barrier")


class Watch:
    """Heartbeats of ``ranks`` of the run in ``run_dir`` (this node's), from this launch on."""

    def __init__(self, run_dir: Path, ranks: list[int], limits: Limits,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.run, self.ranks, self.limits, self.now = RunDir(run_dir), ranks, limits, now
        t = now()
        self.beats = {r: _Beat(size=self._size(r), seen=self._key(r), at=t) for r in ranks}   # an earlier launch's

    def _size(self, r: int) -> int:
        try:
            return self.run.rank_log(r).stat().st_size
        except OSError:
            return 0

    def _key(self, r: int) -> tuple[int, int] | None:
        rec = read_beat(self.run.heartbeat(r))
        return (rec.pid, rec.seq) if rec is not None else None

    def poll(self) -> tuple[int, str, str] | None:
        """(rank, kind, what) of the first rank whose process is gone ("exit") or whose heartbeat stopped first
        ("stall"), or None while every rank beats. Every rank's heartbeat is read first."""
        now = self.now()
        grew = {r: self._update(r, b, now) for r, b in self.beats.items()}
        for r, b in self.beats.items():
            if b.pid is not None and not alive(b.pid):
                held = self._stopped()
                if held:   # the others finished or died around a rank that was stopped: that rank is the fault
                    q, how = held[0]
                    return q, "stall", (f"rank {q}: its process {self.beats[q].pid} is {how} (after step "
                                        f"{self.beats[q].step}), while rank {r}'s process is gone")
                return r, "exit", f"rank {r}: its process {b.pid} is gone (after step {b.step})"
        late = []
        for r, b in self.beats.items():
            allowed = self.limits.allowance(b.phase)
            if not grew[r] and now - b.at > allowed:
                late.append((b.at, r, f"rank {r}: no heartbeat or log line for {now - b.at:.0f} s ({b.doing()}; limit "
                                      f"{allowed:.0f} s)"))
        if not late:
            return None
        stopped = self._stopped()
        if stopped:   # a rank stopped by a signal or stuck in the kernel, while the others wait in a collective
            r, how = stopped[0]
            own = next((w for _, q, w in late if q == r), f"rank {r}: its heartbeat has stopped")
            return r, "stall", f"{own}; its process {self.beats[r].pid} is {how}"
        lowest = min(b.step or 0 for b in self.beats.values())
        # in a save, a rank at the barrier waits for the others: the one still in its own part froze; then behind
        # first, then stopped first
        late.sort(key=lambda x: (self.beats[x[1]].waits(), (self.beats[x[1]].step or 0) != lowest, x[0]))
        _, r, what = late[0]
        waiting = sorted(q for q, b in self.beats.items() if q != r and b.waits())
        if waiting and not self.beats[r].waits():
            what += f", while rank(s) {waiting[:8]} reached the save's barrier and wait for it"
        return r, "stall", what

    def _stopped(self) -> list[tuple[int, str]]:
        """(rank, how) of ranks whose process is stopped (SIGSTOP, a debugger) or in uninterruptible sleep."""
        out = []
        for r, b in self.beats.items():
            st = state(b.pid) if b.pid is not None else ""
            if st in ("T", "t"):
                out.append((r, "stopped (SIGSTOP or a debugger)"))
            elif st == "D":
                out.append((r, "in uninterruptible sleep (I/O or driver)"))
        return out

    def _update(self, r: int, b: _Beat, now: float) -> bool:
        """Read rank ``r``'s heartbeat record and its log's size; whether it showed life since the last poll."""
        size = self._size(r)
        rec = read_beat(self.run.heartbeat(r))
        beat = rec is not None and (rec.pid, rec.seq) != b.seen
        if beat:
            b.seen, b.phase, b.pid, b.part = (rec.pid, rec.seq), rec.phase, rec.pid, rec.part
            b.step = rec.step if rec.step is not None else b.step
        if not beat and size == b.size:
            return False
        b.size, b.at = size, now
        return True

    def first_dead_by_msrun(self, launch_log: Path | None) -> tuple[int, str] | None:
        """(rank, what) of the first worker msrun reports dead in its own output, by the pids the ranks' heartbeats
        hold. msrun kills the other workers within about half a second of the first death, so polling pids alone
        cannot order them; msrun's line can."""
        if launch_log is None or not launch_log.is_file():
            return None
        by_pid = {b.pid: r for r, b in self.beats.items() if b.pid is not None}
        for m in WORKER_EXIT.finditer(read_tail(launch_log, 0)):
            rank = by_pid.get(int(m.group(1)))
            if rank is not None:
                return rank, f"msrun: rank {rank}'s worker (pid {m.group(1)}) exited with {m.group(2)}"
        return None

    def last_step(self) -> int | None:
        steps = [b.step for b in self.beats.values() if b.step is not None]
        return max(steps) if steps else None
