"""The processes `port train` starts die with it, whatever kills it: the launcher's side.

msrun puts every worker in a session of its own (``subprocess.Popen(..., preexec_fn=os.setsid)`` in
mindspore/parallel/cluster/process_entity/_api.py, ``_ComputeGraphNode.run``), so neither port's process
group nor msrun's holds the workers, and a ``kill -9`` of port (or of its whole group) used to leave them
training. Three layers, each enough for the common case, together enough for ``kill -9``:

1. :func:`run_msrun` starts msrun in a new session (one process group: msrun, its scheduler, its ``tail``
   processes) with a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGINT)``, prctl(2)): when port dies,
   even by SIGKILL, the kernel sends msrun SIGINT, and msrun's own SIGINT handler (``join_processes``)
   kills its workers' groups and the scheduler.
2. Every process running ``worker.py`` watches port (``PORT_PARENT``, the worker's side:
   porting/train/run/lifeline.py ``watch_parent``) and exits once port is gone.
3. On SIGINT/SIGTERM port tears down what it started (the caller's ``stop``, porting/launch/children.py
   ``stop_group``: msrun's group and msrun's descendants, SIGTERM then SIGKILL) and exits with one line.
   Nothing port did not start is signalled.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Mapping

from model_zoo.errors import PortingError
from porting.launch.children import signal_group, stop_group
from porting.launch.proctable import process_table
from porting.launch.scheduler import SchedulerDied, SchedulerWatch
from porting.train.run.lifeline import ENV, token

PR_SET_PDEATHSIG = 1           # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36     # linux/prctl.h
GRACE_S = 10.0
POLL_S = 0.5            # how often a running msrun's scheduler is looked at


class Interrupted(PortingError):
    """`port train` was stopped by SIGINT or SIGTERM; what it started was stopped with it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum   # the shell's convention: 130 for SIGINT, 143 for SIGTERM


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


def _wait_detached_workers(msrun_pid: int, before: set[int], rc: int, deadline: float | None = None) -> int | None:
    """msrun ``--join=False`` (a node rank > 0 on the loopback master's machine, porting/launch/msrun.py
    ``same_host_node_argv``) returns once
    its workers are started; they stay this node's job, so `port train` waits for them and returns the
    first failing exit code. As a child subreaper (prctl(2) PR_SET_CHILD_SUBREAPER) this process inherits
    them when msrun exits, so their exit codes are its to collect. msrun's own group (its ``tail -f`` log
    followers) is stopped; the workers each run in a session of their own."""
    signal_group(msrun_pid, signal.SIGTERM)
    worst = rc
    for pid in sorted(_children() - before):
        try:
            if os.getpgid(pid) == msrun_pid:   # a log follower of msrun's
                os.waitpid(pid, 0)
                continue
            status = _waitpid_until(pid, deadline)
        except (ChildProcessError, ProcessLookupError):
            continue
        if status is None:   # the deadline: the caller stops what is left (run_msrun's finally)
            return None
        worst = worst or os.waitstatus_to_exitcode(status)
    return worst


def _wait_msrun(proc: subprocess.Popen, deadline: float | None, sched: SchedulerWatch | None,
                stop: Callable[[subprocess.Popen, float], None]) -> int | None:
    """msrun's exit code; None at ``deadline`` (stopped). ``sched``: msrun's scheduler, whose failure msrun does not
    see while its workers wait (porting/launch/scheduler.py): the job is stopped and :class:`SchedulerDied` raised."""
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            stop(proc, GRACE_S)
            return None
        try:
            return proc.wait(timeout=POLL_S if left is None else min(POLL_S, left))
        except subprocess.TimeoutExpired:
            why = sched.failed() if sched is not None else None
            if why is not None:
                stop(proc, GRACE_S)
                raise SchedulerDied(why) from None


def _waitpid_until(pid: int, deadline: float | None) -> int | None:
    """``pid``'s wait status, or None at ``deadline`` (monotonic; None: no deadline)."""
    if deadline is None:
        return os.waitpid(pid, 0)[1]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def _die_with(parent: int) -> Callable[[], None]:
    def preexec() -> None:   # runs in the child between fork and exec
        # `nohup port train ... &` (the usual way to leave a long run) starts port with SIGINT ignored (POSIX: a
        # shell's background job ignores SIGINT and SIGQUIT), an ignored disposition survives exec, and the parent
        # death signal below would then reach msrun ignored: it would outlive port. The child starts with the default.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        parent_death_signal(signal.SIGINT)
        if os.getppid() != parent:   # port died before the prctl: the signal will never come
            os._exit(1)
    return preexec


def start(argv: list[str], env: Mapping[str, str], sink: IO[bytes] | None = None) -> subprocess.Popen:
    """Start msrun (or the one process of a launch) in a session of its own that dies with this process (layer 1 of
    the module docstring); its output to ``sink`` (None: this process's)."""
    return subprocess.Popen(argv, env=dict(env, **{ENV: token()}), start_new_session=True,
                            preexec_fn=_die_with(os.getpid()), stdout=sink,
                            stderr=subprocess.STDOUT if sink is not None else None)


def run_msrun(argv: list[str], env: Mapping[str, str],
              stop: Callable[[subprocess.Popen, float], None] = stop_group, *, timeout_s: float | None = None,
              output: IO[bytes] | None = None) -> int | None:
    """Run msrun (``argv``, with ``env``: :func:`porting.launch.children.child_env`'s) as laid out in the module
    docstring; its exit code, or None when it ran past ``timeout_s`` and was stopped with everything it started.
    SIGINT/SIGTERM ``stop`` it and everything it started, then raise :class:`Interrupted`. ``output``: where
    msrun's own output goes (None: this process's)."""
    caught: list[int] = []

    def on_signal(signum, frame) -> None:
        caught.append(signum)
        if proc is not None:   # before msrun is started (inside Popen) only noted: raised once it has a pid to stop
            raise KeyboardInterrupt

    proc = None
    main = threading.current_thread() is threading.main_thread()   # only the main thread may set handlers
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    detached = "--join=False" in argv
    before = _children() if detached else set()
    try:
        if detached:
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        proc = start(argv, env, output)
        if caught:   # a signal while msrun was being started (one CI run: its child ran on, nobody stopped it)
            raise KeyboardInterrupt
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        rc = _wait_msrun(proc, deadline, None if detached else SchedulerWatch(proc.pid, argv), stop)
        if rc is None:
            return None
        return _wait_detached_workers(proc.pid, before, rc, deadline) if detached else rc
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
                signal_group(pid, signal.SIGKILL)
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
        for s, h in old.items():
            signal.signal(s, h)
