"""`port train RECIPE --supervise`: a parent process around one node's launch that watches every rank,
keeps the evidence of a fault before anything is killed, diagnoses it, and resumes from the last complete
checkpoint, a bounded number of times.

Watching (every ``poll_s``, porting/launch/watch.py): the launch's exit code, and a heartbeat per rank with an
allowance per phase (setup and compile, restore, step, save), all under ``HCCL_EXEC_TIMEOUT``, so the other
ranks' evidence is still live when the supervisor looks. Whether a launch that ended finished or failed, and
what a failed one left, is decided once for both launch paths (porting/launch/outcome.py).

On a fault the supervisor copies every rank's log, msrun's logs, CANN's plog directory where there is one,
the rank table and an environment fingerprint into ``RUN/incidents/<n>/`` first, diagnoses the copy (with the
``diagnose`` it is given: `port diagnose`, which sits above this package), and only then stops the process
group it started (never anything else). It relaunches with ``--resume`` from the last complete checkpoint (or
from the start when there is none) until ``max_restarts``; a fault that repeats at the same step with the same
verdict stops the run with that verdict instead of looping. Every incident (when, what was seen, the verdict,
what was done, steps and seconds lost) is a line of ``RUN/incidents.jsonl``, which `port report` shows as
stability rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from model_zoo.errors import DiagnosticsError, PortingError
from model_zoo.files import write_atomic
from porting.env import versions
from porting.launch.children import stop_group
from porting.launch.outcome import Mark, Outcome, launch_outcome, mark
from porting.launch.scheduler import SchedulerWatch
from porting.launch.shrink import apply_shrink
from porting.launch.watch import Limits, Watch
from porting.rundir.paths import RunDir
from porting.rundir.records import RunDirError

EXIT_DIVERGED = 3        # port train's exit code for a non-finite loss (model_zoo/errors.py DivergenceError)
Diagnose = Callable[[Path, int], dict]   # (rank logs, world size) -> `port diagnose`'s verdict


class SuperviseError(PortingError):
    """The supervised run stopped: a fault that repeats, or more restarts than allowed."""


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


def launch_dir(run_dir: Path, node: int) -> Path:
    """Where node ``node``'s supervisor keeps what each of its launches printed (node 0: ``RUN/supervise``)."""
    return RunDir(run_dir).supervise(node)


def snapshot(run_dir: Path, n: int | str, extra: dict[str, Any]) -> Path:
    """Copy the evidence of incident ``n`` into ``RUN/incidents/<n>/`` before anything is stopped: every
    rank's log and msrun's logs, CANN's plog directory where one exists, the rank table, and a fingerprint
    (versions and the HCCL/MindSpore environment)."""
    rd = RunDir(run_dir)
    if rd.incidents.is_symlink() or (rd.incidents.exists() and not rd.incidents.is_dir()):
        raise RunDirError(f"{rd.incidents}: is not a directory of the run (a link or a file); the supervisor keeps "
                          "each incident's evidence there: remove it")
    rd.incidents.mkdir(exist_ok=True)
    dest, k = rd.incidents / str(n), 1
    while dest.exists() or dest.is_symlink():   # a number already there (planted, or an earlier session's): the next
        k += 1
        dest = rd.incidents / f"{n}.{k}"
    dest.mkdir()
    logs = rd.logs
    if logs.is_dir():
        shutil.copytree(logs, RunDir(dest).logs, symlinks=True, ignore_dangling_symlinks=True)
    plog = Path(os.environ.get("ASCEND_PROCESS_LOG_PATH", Path.home() / "ascend" / "log"))
    if plog.is_dir():
        shutil.copytree(plog, dest / "plog", symlinks=True, ignore_dangling_symlinks=True)
    launches = rd.supervise()
    if launches.is_dir():   # msrun's own output, kept apart from the rank logs that port diagnose reads
        shutil.copytree(launches, dest / "launch", symlinks=True, ignore_dangling_symlinks=True)   # links not followed
    table = extra.get("rank_table")
    if table and Path(table).is_file():
        shutil.copyfile(table, RunDir(dest).rank_table)
    env = {k: v for k, v in os.environ.items() if k.startswith(("HCCL_", "MS_", "ASCEND_", "GLOG_", "RANK"))}
    write_atomic(dest / "fingerprint.json", json.dumps({"versions": versions(), "env": env, **extra}, indent=2,
                                                       default=str), error=SuperviseError)
    return dest


def _verdict(diagnose: Diagnose, evidence: Path, world: int) -> dict[str, Any] | None:
    logs = RunDir(evidence).logs
    if not logs.is_dir():
        return None
    try:
        d = diagnose(logs, world)
    except DiagnosticsError as e:
        return {"first_failing_rank": None, "reason": str(e)}
    return {k: d.get(k) for k in ("first_failing_rank", "last_step", "reason", "confidence")}


def _wait(proc: subprocess.Popen, grace_s: float) -> int | None:
    """The launch's exit code once it ends within ``grace_s``, else None."""
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        return None


def _same_fault(a: Incident, b: Incident) -> bool:
    """Two incidents are one deterministic fault: the same kind at the same step, naming the same rank."""
    if a.kind == "diverged":   # every rank sees the same non-finite loss: which exits first does not matter
        return b.kind == "diverged" and a.step == b.step
    return a.kind == b.kind and a.step == b.step and a.suspect == b.suspect


@dataclasses.dataclass
class Launch:
    """One launch under watch: its process, its mark on the run directory and its heartbeats."""

    proc: subprocess.Popen
    before: Mark
    watch: Watch
    started: float
    outcome: Outcome | None = None   # decided once its processes are gone (porting/launch/outcome.py)
    sched: SchedulerWatch | None = None   # msrun's scheduler (porting/launch/scheduler.py); None: no msrun of its own


@dataclasses.dataclass(frozen=True)
class Supervised:
    """What the supervisor drives (porting/launch/session.py builds it): ``launch(resume, skip_windows)`` starts the
    next launch; ``latest_step()`` is the step of the last complete checkpoint (None: none); ``diagnose(logs,
    world)`` is `port diagnose` on an incident's copied logs (the CLI's hook); ``preflight()`` runs before a relaunch;
    ``shrink(incident)``, when given, may move the next launch onto fewer devices (porting/launch/shrink.py): it
    returns the new ranks, world size and what it did, or None to relaunch as before; ``peers``
    (porting/launch/nodes.Peers): this is one node's supervisor of several, which report their faults to each other
    and relaunch on node 0's decision; ``extra``: what each incident's fingerprint records beside the versions."""

    launch: Callable[[bool, list[tuple[int, int]]], subprocess.Popen]
    latest_step: Callable[[], int | None]
    ranks: list[int]
    world: int
    diagnose: Diagnose
    preflight: Callable[[], None] | None = None
    shrink: Callable[[Incident], tuple[list[int], int, str] | None] | None = None
    peers: Any = None   # porting.launch.nodes.Peers (which imports this module for SuperviseError)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def supervise(target: Supervised, run_dir: Path, limits: Limits, *, resume: bool = False,
              echo: Callable[[str], None] = print, now: Callable[[], float] = time.monotonic) -> int:
    """Run ``target``'s launches until one finishes, recovering from faults (see the module docstring); ``now``: the
    watch's clock. Returns the restarts made."""
    launch, latest_step, ranks, world = target.launch, target.latest_step, target.ranks, target.world
    diagnose, preflight, shrink, peers, extra = (target.diagnose, target.preflight, target.shrink, target.peers,
                                                 target.extra)
    node = peers.node if peers is not None else 0
    tag = f"-node{node}" if node else ""   # node k's own evidence and record, beside node 0's
    incidents: list[Incident] = []
    windows: list[tuple[int, int]] = []    # data windows skipped after a non-finite rollback
    restarts = 0
    while True:
        before = mark(run_dir)
        proc = launch(resume, windows)
        run = Launch(proc, before, Watch(run_dir, ranks, limits, now), now(),
                     sched=SchedulerWatch(proc.pid, proc.args) if isinstance(proc.args, list) else None)
        fault = _watch(run, run_dir, ranks, limits, peers, restarts)
        if fault is None:
            if run.outcome is not None and run.outcome.crashed_at_exit:
                echo(f"supervise: the launch exited with {run.outcome.code} after every rank had logged the end of "
                     "its run (a worker crashed at exit, in MindSpore's teardown); the run's files are complete")
            return restarts
        inc = Incident(n=len(incidents) + 1, at=time.time(), kind=fault[0], seen=fault[1], step=run.watch.last_step(),
                       verdict=None, observed_rank=fault[2])
        evidence = snapshot(run_dir, f"{inc.n}{tag}", {"seen": inc.seen, **extra})
        inc.evidence = str(evidence.relative_to(run_dir))
        _nonfinite_window(inc, run.outcome)
        inc.verdict = _verdict(diagnose, evidence, world)
        _name_suspect(inc)
        if peers is not None and inc.kind != "peer":
            peers.report(restarts, inc)
        stop_group(run.proc, limits.grace_s)
        if run.outcome is None or run.outcome.code is None:   # stopped here: decided (and cleaned) now it is gone
            run.outcome = launch_outcome(run_dir, before, run.proc.returncode, ranks, clean=node == 0)
            if inc.skip_window is None and run.outcome.stop is not None:
                _nonfinite_window(inc, run.outcome)
                _name_suspect(inc)
        decide = lambda i, c: _action(i, incidents, restarts, limits, c, windows)   # noqa: E731
        if peers is None:
            ck = latest_step()
            inc.resumed_from, inc.steps_lost, inc.action = ck, (inc.step or 0) - (ck or 0), decide(inc, ck)
        else:   # node 0 settles the incident and the resume step for every node
            inc, ck = peers.settle(restarts, inc, decide, latest_step, windows)
        inc.seconds_lost = round(now() - run.started, 1)
        incidents.append(inc)
        if shrink is not None:
            ranks, world = apply_shrink(shrink, inc, ranks, world)
        _conclude(run_dir, node, inc, echo)
        if preflight is not None:
            _preflight_when_released(preflight, limits)
        restarts += 1
        resume = ck is not None


def _watch(run: Launch, run_dir: Path, ranks: list[int], limits: Limits, peers: Any,
           restarts: int) -> tuple[str, str, int | None] | None:
    """Poll the launch until it finishes (None) or a fault is seen: (kind, what was seen, the rank seen go).
    ``run.outcome`` is decided as soon as the launch has exited, or a rank's process is gone."""
    node = peers.node if peers is not None else 0
    while True:
        code, late = run.proc.poll(), None
        if code is None:
            late = run.watch.poll()
            if late is not None and late[1] == "exit":   # a rank's process is gone: the launch is ending, somehow
                code = _wait(run.proc, limits.grace_s)
        if code is not None or (late is not None and late[1] == "exit"):
            run.outcome = launch_outcome(run_dir, run.before, code, ranks, clean=node == 0)
            if run.outcome.finished:   # exit 0, or every rank logged its run's end (a crash at exit)
                if code is None:      # the ranks ended and msrun lingers: it is stopped, nothing else
                    stop_group(run.proc, limits.grace_s)
                return None
        if late is not None:
            return _first_dead(run, run_dir, node, (late[1], late[2], late[0]))
        if code is not None:
            kind = "diverged" if code == EXIT_DIVERGED else "exit"
            return _first_dead(run, run_dir, node, (kind, f"the launch exited with {code}", None))
        why = run.sched.failed() if run.sched is not None else None
        if why is not None:   # the workers would wait to join it until msrun's cluster timeout
            return "exit", why, None
        peer = peers.peer_fault(restarts) if peers is not None else None
        if peer is not None:   # another node's rank failed: this node's ranks would wait in a collective
            return "peer", f"node {peer['node']} saw a fault: {peer.get('seen')}", peer.get("observed_rank")
        time.sleep(limits.poll_s)


def _first_dead(run: Launch, run_dir: Path, node: int, fault: tuple[str, str, int | None]) -> tuple[str, str, int | None]:
    """msrun names the worker that died first; pid polling may see several gone."""
    if fault[0] != "exit":
        return fault
    launches = sorted(launch_dir(run_dir, node).glob("launch_*.log"), key=lambda p: p.stat().st_mtime)
    first = run.watch.first_dead_by_msrun(launches[-1] if launches else None)
    if first:
        kind = "diverged" if first[1].endswith(f"exited with {EXIT_DIVERGED}") else "exit"
        return kind, first[1], first[0]
    return fault


def _name_suspect(inc: Incident) -> None:
    named = (inc.verdict or {}).get("first_failing_rank")
    named = named if isinstance(named, int) else None
    # the first process to exit can be one that waited and gave up (a frozen rank never exits; msrun kills it last):
    # a diagnosis that names its culprit with high confidence (a rank frozen inside a save) wins over an observed exit
    sure = named is not None and inc.kind == "exit" and (inc.verdict or {}).get("confidence") == "high"
    inc.suspect = named if sure else inc.observed_rank if inc.observed_rank is not None else named
    inc.suspect = None if inc.skip_window is not None else inc.suspect   # every rank saw the same values


def _conclude(run_dir: Path, node: int, inc: Incident, echo: Callable[[str], None]) -> None:
    """Record the incident (node 0: ``RUN/incidents.jsonl``), say what was done, and stop where it says so."""
    who = _who(inc)
    rd = RunDir(run_dir)
    _record(rd.supervise() / f"incidents_node{node}.jsonl" if node else rd.incidents_file, inc)
    echo(f"supervise: incident {inc.n}: {inc.kind}: {inc.seen}; diagnosis: {who}; {inc.action} "
         f"(evidence {run_dir / inc.evidence})")
    if inc.action.startswith("stopped"):
        raise SuperviseError(f"supervised run stopped after incident {inc.n} ({inc.kind} at step {inc.step}): "
                             f"{who}; evidence in {run_dir / inc.evidence}")


def _nonfinite_window(inc: Incident, outcome: Outcome | None) -> None:
    """A run stopped past its non-finite caps says so on every rank (porting/train/run/step/nonfinite.py): the
    window of steps it skipped, and the reason, become the incident's."""
    if outcome is not None and outcome.stop is not None:
        line, window = outcome.stop
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
    """One line appended to ``path``, opened without following a link planted in the run (O_NOFOLLOW) and only
    under a real directory of it."""
    if path.parent.is_symlink():
        raise RunDirError(f"{path.parent}: is a link; the supervisor writes {path.name} only inside the run: remove it")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        raise RunDirError(f"{path}: cannot be appended to ({e.strerror}; a link planted in the run is never "
                          "followed): remove it") from None
    with open(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(dataclasses.asdict(inc), default=str) + "\n")
