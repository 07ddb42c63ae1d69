"""The processes `port train` starts die with it, whatever kills it.

msrun puts every worker in a session of its own (``subprocess.Popen(..., preexec_fn=os.setsid)`` in
mindspore/parallel/cluster/process_entity/_api.py, ``_ComputeGraphNode.run``), so neither port's process
group nor msrun's holds the workers, and a ``kill -9`` of port (or of its whole group) used to leave them
training. Three layers, each enough for the common case, together enough for ``kill -9``:

1. :func:`run_msrun` starts msrun in a new session (one process group: msrun, its scheduler, its ``tail``
   processes) with a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGINT)``, prctl(2)): when port dies,
   even by SIGKILL, the kernel sends msrun SIGINT, and msrun's own SIGINT handler (``join_processes``)
   kills its workers' groups and the scheduler.
2. Every process running ``worker.py`` (the workers and msrun's scheduler, which runs the same script)
   watches port: :func:`watch_parent` polls the pid in ``PORT_PARENT`` together with its start time
   (``/proc/<pid>/stat`` field 22, proc(5), so a reused pid is not taken for port) and exits the process
   once port is gone. This holds when msrun is gone too, or died before its handler was installed.
3. On SIGINT/SIGTERM port tears down what it started (msrun's group and msrun's descendants, SIGTERM then
   SIGKILL: the caller's ``stop``, `port train` passes :func:`porting.supervise.stop`) and exits with one
   line. Nothing port did not start is signalled.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from model_zoo.errors import PortingError
from porting.cluster.proctable import process_table
from porting.train.run.nonfinite import gained

ENV = "PORT_PARENT"            # "pid:start time" of the `port` process a worker belongs to
PR_SET_PDEATHSIG = 1           # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36     # linux/prctl.h
POLL_S = 0.5
GRACE_S = 10.0


class Interrupted(PortingError):
    """`port train` was stopped by SIGINT or SIGTERM; what it started was stopped with it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum   # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); None when the process is gone
    or a zombie (exited, not yet reaped: gone for our purpose)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read(4096).rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def token(pid: int | None = None) -> str:
    """``PORT_PARENT``'s value for the process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid) or '?'}"


def alive(tok: str) -> bool:
    """The process ``tok`` names still runs (same pid, same start time)."""
    pid, _, start = tok.partition(":")
    return pid.isdigit() and start_time(int(pid)) == start


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, int(value), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent thread exits (Linux; False elsewhere)."""
    return _prctl(PR_SET_PDEATHSIG, sig)


def _children() -> set[int]:
    """This process's child pids."""
    me = os.getpid()
    return {pid for pid, (ppid, _, _) in process_table().items() if ppid == me}


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_detached_workers(msrun_pid: int, before: set[int], rc: int) -> int:
    """msrun ``--join=False`` (a node rank > 0 on the loopback master's machine, run/launch.py) returns once
    its workers are started; they stay this node's job, so `port train` waits for them and returns the
    first failing exit code. As a child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER) this process inherits
    them when msrun exits, so their exit codes are its to collect. msrun's own group (its ``tail -f`` log
    followers) is stopped; the workers each run in a session of their own."""
    _kill_group(msrun_pid, signal.SIGTERM)
    worst = rc
    for pid in sorted(_children() - before):
        try:
            if os.getpgid(pid) == msrun_pid:   # a log follower of msrun's
                os.waitpid(pid, 0)
                continue
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except (ChildProcessError, ProcessLookupError):
            continue
        worst = worst or code
    return worst


def _die_with(parent: int) -> Callable[[], None]:
    def preexec() -> None:   # runs in the child between fork and exec
        parent_death_signal(signal.SIGINT)
        if os.getppid() != parent:   # port died before the prctl: the signal will never come
            os._exit(1)
    return preexec


def watch_parent(environ: dict[str, str] | None = None, poll_s: float = POLL_S) -> threading.Thread | None:
    """In a worker: a daemon thread that exits this process once the `port` of ``PORT_PARENT`` is gone.
    No ``PORT_PARENT`` (a worker started by hand under msrun): nothing is watched."""
    tok = (os.environ if environ is None else environ).get(ENV, "")
    if not tok or not alive(tok):
        if tok:   # port is already gone: do not start training at all
            _exit_orphan(tok)
        return None

    def loop() -> None:
        while alive(tok):
            time.sleep(poll_s)
        _exit_orphan(tok)

    t = threading.Thread(target=loop, name="port-lifeline", daemon=True)
    t.start()
    return t


def _exit_orphan(tok: str) -> None:
    try:
        print(f"error: port (pid {tok.partition(':')[0]}) is gone; this process (pid {os.getpid()}) stops too",
              file=sys.stderr, flush=True)
    finally:
        os._exit(1)   # no cleanup: checkpoints are written atomically, a half-written one is never loaded


def run_msrun(argv: list[str], env: dict[str, str], stop: Callable[[subprocess.Popen, float], None]) -> int:
    """Run msrun (``argv``) as laid out in the module docstring; its exit code. SIGINT/SIGTERM ``stop`` it
    and everything it started (the caller's: the supervisor's teardown is above porting/train), then raise
    :class:`Interrupted`."""
    env = dict(env, **{ENV: token()})
    caught: list[int] = []

    def on_signal(signum, frame) -> None:
        caught.append(signum)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()   # only the main thread may set handlers
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    proc = None
    detached = "--join=False" in argv
    before = _children() if detached else set()
    try:
        if detached:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        proc = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_die_with(os.getpid()))
        rc = proc.wait()
        return _wait_detached_workers(proc.pid, before, rc) if detached else rc
    except KeyboardInterrupt:
        signum = caught[0] if caught else signal.SIGINT
        for s in old:   # a second Ctrl-C must not cut the teardown short
            signal.signal(s, signal.SIG_IGN)
        if proc is not None:
            stop(proc, GRACE_S)
        raise Interrupted(f"stopped by {signal.Signals(signum).name}: msrun (pid {proc.pid if proc else '-'}) and "
                          "its workers were stopped; the run directory keeps its last complete checkpoint, "
                          "continue with --resume", signum) from None
    finally:
        if detached:
            for pid in _children() - before:   # interrupted while waiting: what msrun left is ours to stop
                _kill_group(pid, signal.SIGKILL)
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
        for s, h in old.items():
            signal.signal(s, h)


# The last line every rank logs once its run has ended and every file it writes is complete. A worker can
# still crash after it: 2 of ~1,000 msrun workers here (MindSpore 2.10, CPU) segfaulted (exit -11) in the
# teardown of MindSpore's communication threads at interpreter exit, and msrun then reports the job failed.
# MindSpore's cluster is finalized only in that teardown (no API finalizes it sooner: os._exit after
# mindspore.communication.release() left the scheduler timing the workers out), so the launcher reads
# this line instead: a launch whose ranks all logged it finished its run, whatever msrun's exit code.
FINISHED = "run finished: every file of this rank is written"


def all_finished(logs: Path, since: dict[str, int], ranks: Iterable[int]) -> bool:
    """Whether every rank in ``ranks`` logged :data:`FINISHED` in ``logs/rank_<r>.log`` after ``since`` (the
    logs' sizes before the launch, porting.train.run.nonfinite.log_sizes). Only each log's last 4 KiB is read."""
    for r in ranks:
        tail = gained(Path(logs) / f"rank_{r}.log", since, 4096)
        if tail is None or not tail.rstrip().endswith(FINISHED):
            return False
    return True
