"""`port train RECIPE --supervise`: a parent process around one node's msrun launch that watches every rank,
keeps the evidence of a fault before anything is killed, diagnoses it, and resumes from the last complete
checkpoint, a bounded number of times.

Watching (every ``poll_s``): msrun's exit code, and a heartbeat per rank, the size of its
``logs/rank_<r>.log`` (port logs a line per step, ``logging.every_steps``). A rank whose log has not grown for
``stall_s`` has stalled; before its first step line the allowance is ``compile_s`` (graph compile), and while
the rank says it is saving a checkpoint it is ``save_s`` (a slow filesystem is not a fault; a save that
never ends is named as one). Both stay under ``HCCL_EXEC_TIMEOUT``, so the other ranks' evidence is still
live when the supervisor looks.

On a fault the supervisor copies every rank's log, msrun's logs, CANN's plog directory where there is one,
the rank table and an environment fingerprint into ``RUN/incidents/<n>/`` first, runs `port diagnose` on the
copy, and only then stops the process group it started (never anything else). It relaunches with
``--resume`` from the last complete checkpoint (or from the start when there is none) until
``max_restarts``; a fault that repeats at the same step with the same verdict stops the run with that
verdict instead of looping. Every incident (when, what was seen, the verdict, what was done, steps and
seconds lost) is a line of ``RUN/incidents.jsonl``, which `port report` shows as stability rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from converters.atomic import _pid_alive
from model_zoo.errors import PortingError
from model_zoo.files import write_atomic
from porting.diagnostics import DiagnosticsError
from porting.diagnostics.diagnose import diagnose
from porting.env import versions
from porting.shrink import apply_shrink
from porting.train.run.lifeline import all_finished
from porting.train.run.nonfinite import log_sizes, stop_line

INCIDENTS_FILE = "incidents.jsonl"
STEP_LINE = re.compile(r" INFO step (\d+)/\d+ loss ")
SAVING_LINE = re.compile(r" INFO saving checkpoint step_(\d+)")
SAVED_LINE = re.compile(r" INFO checkpoint \S")
PID_LINE = re.compile(r" INFO rank \d+ of \d+ \(pid (\d+)\)")
# msrun, when a worker dies: "Worker process 17593 exit with exception. Error code: -9." (then it kills the rest)
WORKER_EXIT = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")
EXIT_DIVERGED = 3        # port train's exit code for a non-finite loss (model_zoo/errors.py DivergenceError)


class SuperviseError(PortingError):
    """The supervised run stopped: a fault that repeats, or more restarts than allowed."""


@dataclasses.dataclass(frozen=True)
class Limits:
    stall_s: float = 600.0
    compile_s: float = 1800.0
    save_s: float = 600.0
    max_restarts: int = 3
    poll_s: float = 1.0
    grace_s: float = 10.0


@dataclasses.dataclass
class Incident:
    n: int
    at: float
    kind: str                  # exit, stall, diverged
    seen: str
    step: int | None           # the last step any rank logged
    verdict: dict[str, Any] | None
    observed_rank: int | None = None   # the rank the supervisor saw go (process gone, log stopped first)
    suspect: int | None = None         # observed_rank, else the diagnosis' first failing rank
    action: str = ""
    resumed_from: int | None = None
    steps_lost: int | None = None
    seconds_lost: float | None = None
    evidence: str = ""
    skip_window: list[int] | None = None   # non-finite steps [first, last] whose data the relaunch skips


@dataclasses.dataclass
class _Beat:
    size: int = 0
    at: float = 0.0
    step: int | None = None
    saving: bool = False
    pid: int | None = None


def derive_limits(plan: dict[str, Any], stall_s: float | None, max_restarts: int) -> Limits:
    """Heartbeat limits from the plan: the step and save time it predicts, bounded below by generous floors
    and above by half of HCCL_EXEC_TIMEOUT (so a stall is seen while the other ranks still wait)."""
    env = (plan.get("launch") or {}).get("env") or {}
    hccl = float(env.get("HCCL_EXEC_TIMEOUT", 1836))
    step = float((plan.get("estimated_step") or {}).get("step_s") or 0.0)
    save = float((plan.get("launch") or {}).get("predicted_save_s") or 0.0)
    cap = max(60.0, hccl / 2)
    stall = stall_s if stall_s is not None else min(cap, max(300.0, 20 * step))
    return Limits(stall_s=stall, compile_s=max(stall, min(cap * 2, 1800.0)), save_s=max(stall, 3 * save + 60),
                  max_restarts=max_restarts)


def _read_tail(path: Path, start: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(1 << 20).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _saving(text: str, before: bool) -> bool:
    """Whether the last of a rank's new lines says a checkpoint save started and has not yet ended."""
    last = {"step": max((m.end() for m in STEP_LINE.finditer(text)), default=-1),
            "saving": max((m.end() for m in SAVING_LINE.finditer(text)), default=-1),
            "saved": max((m.end() for m in SAVED_LINE.finditer(text)), default=-1)}
    if max(last.values()) < 0:
        return before
    return max(last, key=last.get) == "saving"


class Watch:
    """Heartbeats of the ranks of this node, from their log files."""

    def __init__(self, logs: Path, ranks: list[int], limits: Limits) -> None:
        self.logs, self.ranks, self.limits = logs, ranks, limits
        now = time.monotonic()
        self.beats = {r: _Beat(size=self._size(r), at=now) for r in ranks}
        self.since = {f"rank_{r}.log": b.size for r, b in self.beats.items()}   # this launch's lines follow

    def _size(self, r: int) -> int:
        try:
            return (self.logs / f"rank_{r}.log").stat().st_size
        except OSError:
            return 0

    def poll(self) -> tuple[int, str, str] | None:
        """(rank, kind, what) of the first rank whose process is gone ("exit") or whose log stopped first
        ("stall"), or None while every rank beats. Every rank's new log lines are read first."""
        now = time.monotonic()
        grew = {r: self._update(r, b, now) for r, b in self.beats.items()}
        for r, b in self.beats.items():
            if b.pid is not None and not _alive(b.pid):
                held = self._stopped()
                if held:   # the others finished or died around a rank that was stopped: that rank is the fault
                    q, how = held[0]
                    return q, "stall", (f"rank {q}: its process {self.beats[q].pid} is {how} (after step "
                                        f"{self.beats[q].step}), while rank {r}'s process is gone")
                return r, "exit", f"rank {r}: its process {b.pid} is gone (after step {b.step})"
        late = []
        for r, b in self.beats.items():
            allowed = (self.limits.save_s if b.saving else self.limits.compile_s if b.step is None
                       else self.limits.stall_s)
            if not grew[r] and now - b.at > allowed:
                what = ("saving a checkpoint" if b.saving else "compiling or before its first step" if b.step is None
                        else f"after step {b.step}")
                late.append((b.at, r, f"rank {r}: no log line for {now - b.at:.0f} s ({what}; limit {allowed:.0f} s)"))
        if not late:
            return None
        stopped = self._stopped()
        if stopped:   # a rank stopped by a signal or stuck in the kernel, while the others wait in a collective
            r, how = stopped[0]
            own = next((w for _, q, w in late if q == r), f"rank {r}: its log has not grown")
            return r, "stall", f"{own}; its process {self.beats[r].pid} is {how}"
        lowest = min(b.step or 0 for b in self.beats.values())
        late.sort(key=lambda x: ((self.beats[x[1]].step or 0) != lowest, x[0]))   # behind first, then stopped first
        _, r, what = late[0]
        return r, "stall", what

    def _stopped(self) -> list[tuple[int, str]]:
        """(rank, how) of ranks whose process is stopped (SIGSTOP, a debugger) or in uninterruptible sleep."""
        out = []
        for r, b in self.beats.items():
            st = _state(b.pid) if b.pid is not None else ""
            if st in ("T", "t"):
                out.append((r, "stopped (SIGSTOP or a debugger)"))
            elif st == "D":
                out.append((r, "in uninterruptible sleep (I/O or driver)"))
        return out

    def _update(self, r: int, b: _Beat, now: float) -> bool:
        """Read rank ``r``'s new log lines (step, saving, pid); whether its log grew."""
        size = self._size(r)
        if size == b.size:
            return False
        text = _read_tail(self.logs / f"rank_{r}.log", b.size)
        steps = [int(m.group(1)) for m in STEP_LINE.finditer(text)]
        b.step = steps[-1] if steps else b.step
        b.saving = _saving(text, b.saving)
        pid = PID_LINE.search(text)
        b.pid = int(pid.group(1)) if pid else b.pid
        b.size, b.at = size, now
        return True

    def first_dead_by_msrun(self, launch_log: Path | None) -> tuple[int, str] | None:
        """(rank, what) of the first worker msrun reports dead in its own output, by the pids the ranks logged.
        msrun kills the other workers within about half a second of the first death, so polling pids alone
        cannot order them; msrun's line can."""
        if launch_log is None or not launch_log.is_file():
            return None
        by_pid = {b.pid: r for r, b in self.beats.items() if b.pid is not None}
        for m in WORKER_EXIT.finditer(_read_tail(launch_log, 0)):
            rank = by_pid.get(int(m.group(1)))
            if rank is not None:
                return rank, f"msrun: rank {rank}'s worker (pid {m.group(1)}) exited with {m.group(2)}"
        return None

    def last_step(self) -> int | None:
        steps = [b.step for b in self.beats.values() if b.step is not None]
        return max(steps) if steps else None


def launch_dir(run_dir: Path, node: int) -> Path:
    """Where node ``node``'s supervisor keeps what each of its launches printed (node 0: ``RUN/supervise``)."""
    return run_dir / "supervise" / (f"node{node}" if node else "")


def snapshot(run_dir: Path, n: int | str, extra: dict[str, Any]) -> Path:
    """Copy the evidence of incident ``n`` into ``RUN/incidents/<n>/`` before anything is stopped: every
    rank's log and msrun's logs, CANN's plog directory where one exists, the rank table, and a fingerprint
    (versions and the HCCL/MindSpore environment)."""
    dest = run_dir / "incidents" / str(n)
    dest.mkdir(parents=True, exist_ok=False)
    logs = run_dir / "logs"
    if logs.is_dir():
        shutil.copytree(logs, dest / "logs", symlinks=True, ignore_dangling_symlinks=True)
    plog = Path(os.environ.get("ASCEND_PROCESS_LOG_PATH", Path.home() / "ascend" / "log"))
    if plog.is_dir():
        shutil.copytree(plog, dest / "plog", symlinks=True, ignore_dangling_symlinks=True)
    launches = run_dir / "supervise"
    if launches.is_dir():   # msrun's own output, kept apart from the rank logs that port diagnose reads
        shutil.copytree(launches, dest / "launch")
    table = extra.get("rank_table")
    if table and Path(table).is_file():
        shutil.copyfile(table, dest / "rank_table.json")
    env = {k: v for k, v in os.environ.items() if k.startswith(("HCCL_", "MS_", "ASCEND_", "GLOG_", "RANK"))}
    write_atomic(dest / "fingerprint.json", json.dumps({"versions": versions(), "env": env, **extra}, indent=2,
                                                       default=str), error=SuperviseError)
    return dest


def _descendants(pid: int) -> list[int]:
    try:
        import psutil   # deferred: only a supervised run needs it

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:   # the process is gone already
        return []


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop what this supervisor started: msrun's process group and every descendant of msrun (workers that
    left the group), SIGTERM, then SIGKILL after ``grace_s``. Nothing else is signalled."""
    pids = _descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=grace_s)
            if not any(_alive(p) for p in pids):
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.2)


def _state(pid: int) -> str:
    """The process state letter of /proc/<pid>/stat (R, S, D, T, Z...), '' when unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie child of an exited msrun is gone for our purpose)."""
    return _pid_alive(pid) and _state(pid) not in ("Z", "")


def _diagnose(evidence: Path, world: int) -> dict[str, Any] | None:
    logs = evidence / "logs"
    if not logs.is_dir():
        return None
    try:
        d = diagnose(logs, jobs=1, world_size=world)
    except DiagnosticsError as e:
        return {"first_failing_rank": None, "reason": str(e)}
    return {k: d.get(k) for k in ("first_failing_rank", "last_step", "reason", "confidence")}


def _exits_cleanly(proc: subprocess.Popen, grace_s: float) -> bool:
    """A rank's process is gone: the launch either ends with 0 within ``grace_s`` (a finished run) or not."""
    try:
        return proc.wait(timeout=grace_s) == 0
    except subprocess.TimeoutExpired:
        return False


def _same_fault(a: Incident, b: Incident) -> bool:
    """Two incidents are one deterministic fault: the same kind at the same step, naming the same rank."""
    if a.kind == "diverged":   # every rank sees the same non-finite loss: which exits first does not matter
        return b.kind == "diverged" and a.step == b.step
    return a.kind == b.kind and a.step == b.step and a.suspect == b.suspect


def supervise(launch: Callable[[bool, list[tuple[int, int]]], subprocess.Popen], run_dir: Path, ranks: list[int],
              world: int, limits: Limits, latest_step: Callable[[], int | None], preflight: Callable[[], None] | None = None,
              resume: bool = False, extra: dict[str, Any] | None = None, echo: Callable[[str], None] = print,
              shrink: Callable[[Incident], tuple[list[int], int, str] | None] | None = None, peers: Any = None) -> int:
    """Run ``launch(resume, skip_windows)`` until it exits 0, recovering from faults (see the module docstring).
    ``latest_step()`` is the step of the last complete checkpoint (None: none). ``shrink(incident)``, when
    given, may move the next launch onto fewer devices (porting/shrink.py): it returns the new ranks, world
    size and what it did, or None to relaunch as before. ``peers`` (porting/supervise_nodes.Peers): this is one
    node's supervisor of several, which report their faults to each other and relaunch on node 0's decision.
    Returns the restarts made."""
    node = peers.node if peers is not None else 0
    tag = f"-node{node}" if node else ""   # node k's own evidence and record, beside node 0's
    incidents: list[Incident] = []
    windows: list[tuple[int, int]] = []    # data windows skipped after a non-finite rollback
    restarts = 0
    while True:
        started, before = time.monotonic(), log_sizes(run_dir / "logs")
        proc, ended = launch(resume, windows), lambda: all_finished(run_dir / "logs", before, ranks)
        watch, fault = Watch(run_dir / "logs", ranks, limits), None
        while fault is None:
            code = proc.poll()
            if code is not None:
                if code == 0 or ended():   # ended: every rank logged its run's end (a crash at exit: lifeline.py)
                    return restarts
                kind = "diverged" if code == EXIT_DIVERGED else "exit"
                fault = (kind, f"the launch exited with {code}", None)
                break
            late = watch.poll()
            if late is not None and late[1] == "exit" and (_exits_cleanly(proc, limits.grace_s) or ended()):
                return restarts          # the ranks finished and the launch is ending
            if late is not None:
                fault = (late[1], late[2], late[0])
                break
            peer = peers.peer_fault(restarts) if peers is not None else None
            if peer is not None:   # another node's rank failed: this node's ranks would wait in a collective
                fault = ("peer", f"node {peer['node']} saw a fault: {peer.get('seen')}", peer.get("observed_rank"))
                break
            time.sleep(limits.poll_s)
        if fault[0] == "exit":   # msrun names the worker that died first; pid polling may see several gone
            launches = sorted(launch_dir(run_dir, node).glob("launch_*.log"), key=lambda p: p.stat().st_mtime)
            first = watch.first_dead_by_msrun(launches[-1] if launches else None)
            if first:
                kind = "diverged" if first[1].endswith(f"exited with {EXIT_DIVERGED}") else "exit"
                fault = (kind, first[1], first[0])
        inc = Incident(n=len(incidents) + 1, at=time.time(), kind=fault[0], seen=fault[1], step=watch.last_step(),
                       verdict=None, observed_rank=fault[2])
        evidence = snapshot(run_dir, f"{inc.n}{tag}", {"seen": inc.seen, **(extra or {})})
        inc.evidence = str(evidence.relative_to(run_dir))
        _nonfinite_window(inc, evidence, watch.since)
        inc.verdict = _diagnose(evidence, world)
        named = (inc.verdict or {}).get("first_failing_rank")
        inc.suspect = inc.observed_rank if inc.observed_rank is not None else named if isinstance(named, int) else None
        inc.suspect = None if inc.skip_window is not None else inc.suspect   # every rank saw the same values
        if peers is not None and inc.kind != "peer":
            peers.report(restarts, inc)
        stop(proc, limits.grace_s)
        decide = lambda i, c: _action(i, incidents, restarts, limits, c, windows)   # noqa: E731
        if peers is None:
            ck = latest_step()
            inc.resumed_from, inc.steps_lost, inc.action = ck, (inc.step or 0) - (ck or 0), decide(inc, ck)
        else:   # node 0 settles the incident and the resume step for every node
            inc, ck = peers.settle(restarts, inc, decide, latest_step, windows)
        inc.seconds_lost = round(time.monotonic() - started, 1)
        incidents.append(inc)
        who = _who(inc)
        if shrink is not None:
            ranks, world = apply_shrink(shrink, inc, ranks, world)
        _record(run_dir / (f"supervise/incidents_node{node}.jsonl" if node else INCIDENTS_FILE), inc)
        echo(f"supervise: incident {inc.n}: {inc.kind}: {inc.seen}; diagnosis: {who}; {inc.action} "
             f"(evidence {run_dir / inc.evidence})")
        if inc.action.startswith("stopped"):
            raise SuperviseError(f"supervised run stopped after incident {inc.n} ({inc.kind} at step {inc.step}): "
                                 f"{who}; evidence in {run_dir / inc.evidence}")
        if preflight is not None:
            _preflight_when_released(preflight, limits)
        restarts += 1
        resume = ck is not None


def _nonfinite_window(inc: Incident, evidence: Path, since: dict[str, int]) -> None:
    """A run stopped past its non-finite caps says so on every rank (porting/train/run/nonfinite.py): the
    window of steps it skipped, and the reason, become the incident's."""
    found = stop_line(evidence / "logs", since)
    if found is not None:
        line, window = found
        # every rank stopped on the same all-reduced values: which process went first names no culprit
        inc.kind, inc.step, inc.skip_window, inc.observed_rank = "diverged", window[1], list(window), None
        inc.seen = f"{inc.seen}; {line}"


def _action(inc: Incident, before: list[Incident], restarts: int, limits: Limits, ck: int | None,
            windows: list[tuple[int, int]]) -> str:
    """What is done about ``inc``: stop (a repeat, or out of restarts), roll back once past a non-finite
    window skipping its data, or relaunch."""
    if inc.skip_window is not None and any(i.skip_window for i in before):
        return f"stopped: non-finite steps again after the rollback (steps {inc.skip_window[0]}..{inc.skip_window[1]})"
    if inc.skip_window is None and any(_same_fault(i, inc) for i in before):
        return f"stopped: the same fault again at step {inc.step} ({_who(inc)})"
    if restarts >= limits.max_restarts:
        return f"stopped: {restarts} restart(s) made, supervise.max_restarts is {limits.max_restarts}"
    if inc.skip_window is not None:
        windows.append((inc.skip_window[0], inc.skip_window[1]))
        frm = f"step {ck} (the last complete checkpoint)" if ck is not None else "the start (no checkpoint yet)"
        return (f"rolled back to {frm}, skipping the data of steps {inc.skip_window[0]}..{inc.skip_window[1]} "
                "(nonfinite.skip_steps)")
    return f"relaunched with --resume from step {ck}" if ck is not None else "relaunched from the start"


def _preflight_when_released(preflight: Callable[[], None], limits: Limits, wait_s: float = 90.0) -> None:
    """The preflight before a relaunch; the stopped launch's master port can take a while to be released
    (its scheduler's socket), so a failing preflight is retried for ``wait_s`` before it stops the run."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            preflight()
            return
        except PortingError:
            if time.monotonic() > deadline:
                raise
            time.sleep(max(limits.poll_s, 2.0))


def _who(inc: Incident) -> str:
    v = inc.verdict or {}
    reason = str(v.get("reason") or "no verdict")
    seen = f"rank {inc.suspect}" if inc.suspect is not None else "no rank named"
    return f"{seen} ({inc.seen}); port diagnose: {reason[:300]}"


def _record(path: Path, inc: Incident) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(dataclasses.asdict(inc), default=str) + "\n")
