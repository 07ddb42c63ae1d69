"""A worker's side of its lifeline: every process running ``worker.py`` (the msrun workers and msrun's
scheduler, which runs the same script) and a one-device `port train` started by a supervisor exit by
themselves once the `port` that launched them is gone.

:func:`watch_parent` polls the pid in ``PORT_PARENT`` together with its start time (``/proc/<pid>/stat``
field 22, proc(5), so a reused pid is not taken for port) and exits the process once port is gone. This holds
when msrun is gone too, or died before its own handler was installed. The launcher's side (msrun in a session
of its own with a parent-death signal, the teardown on SIGINT/SIGTERM) is porting/launch/lifeline.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time

ENV = "PORT_PARENT"            # "pid:start time" of the `port` process a worker belongs to
POLL_S = 0.5


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
