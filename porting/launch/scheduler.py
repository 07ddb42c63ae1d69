"""msrun's scheduler, watched while the workers run.

MindSpore's msrun polls only its workers while they run; it looks at the scheduler (the process every worker joins
first, started with ``MS_ROLE=MS_SCHED``) after the last worker has ended (``join_processes`` in
mindspore/parallel/cluster/process_entity/_api.py, 2.7.0-2.10.0). A scheduler that fails at once leaves every
worker waiting to join it until ``--cluster_time_out`` (600 s as port launches msrun) with nothing said: found on
this project's machine when another job took the master port between `port train`'s preflight check and msrun's
start (scheduler.log: "Failed to call bind, url: 127.0.0.1:8118 Address already in use"; the two workers waited).

:class:`SchedulerWatch` finds that process among msrun's children while it lives (its environment), and reports
it once it has exited with a non-zero status that msrun has not collected (a zombie: ``/proc/PID/stat`` field 52,
the wait status, proc(5)) and msrun has still not ended ``SETTLE_S`` later (when a worker failed first, the
scheduler exits too and msrun ends by itself with that worker's error). The launch is then stopped with the scheduler log's first error line instead of
waiting out the cluster timeout. A node rank > 0 on the master's own machine (``--join=False``) is not watched:
its scheduler is expected to fail to bind (porting/launch/jobs.py ``same_host_node_argv``).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from model_zoo.errors import PortingError
from porting.launch.proctable import process_table

ROLE = b"MS_ROLE=MS_SCHED"
LOG_TAIL_BYTES = 1 << 20    # the part of scheduler.log read for its reason (the failure is at its start)
SEARCH_S = 300.0            # msrun starts its scheduler first; a launch with none by then has none (one process)
# A scheduler also exits non-zero when the workers failed first (a worker's error takes the cluster down): msrun
# then ends by itself within seconds, with its own exit code and its worker's error, and is left to. Only a
# scheduler gone this long while msrun still runs is the launch's end (the workers wait on it for 600 s).
SETTLE_S = 10.0


class SchedulerDied(PortingError):
    """msrun's scheduler exited with an error while the workers waited to join it."""


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (index 0: field 3, the state), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _is_scheduler(pid: int) -> bool:
    try:
        return ROLE in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def exit_status(pid: int) -> int | None:
    """The exit code of ``pid`` once it has exited and its parent has not collected it (proc(5) field 52), else
    None (running, or gone)."""
    fields = _stat(pid)
    if fields is None or fields[0] != "Z" or len(fields) < 50:
        return None
    return os.waitstatus_to_exitcode(int(fields[49]))


def reason(log: Path) -> str:
    """The scheduler log's first error line, without MindSpore's prefix (bounded read), or ""."""
    try:
        with open(log, "rb") as f:
            text = f.read(LOG_TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""
    bind = [ln for ln in text.splitlines() if "Address already in use" in ln]
    errors = bind or [ln for ln in text.splitlines() if ln.startswith("[ERROR]")]
    return errors[0].rsplit("] ", 1)[-1].strip()[:300] if errors else ""


class SchedulerWatch:
    """The scheduler of the msrun process ``msrun_pid`` (its logs in ``log_dir``)."""

    def __init__(self, msrun_pid: int, argv: list[str]) -> None:
        self.msrun_pid, self.pid = msrun_pid, None
        self.log_dir = Path(d) if (d := _flag(argv, "--log_dir")) else None
        self.master = (_flag(argv, "--master_addr") or "127.0.0.1", _flag(argv, "--master_port"))
        self.until, self.dead_at = time.monotonic() + SEARCH_S, None

    def failed(self) -> str | None:
        """Why the launch cannot go on (the scheduler exited with an error), or None."""
        if self.pid is None:
            if time.monotonic() > self.until:   # no scheduler among its children: not a launch this watches
                return None
            self.pid = next((c for c, (ppid, _, _) in process_table().items()
                             if ppid == self.msrun_pid and _is_scheduler(c)), None)
            if self.pid is None:
                return None
        code = exit_status(self.pid)
        if not code:
            return None
        if self.dead_at is None:
            self.dead_at = time.monotonic()
        if time.monotonic() - self.dead_at < SETTLE_S:
            return None
        log = self.log_dir / "scheduler.log" if self.log_dir is not None else None
        why = reason(log) if log is not None else ""
        addr, port = self.master
        taken = "Address already in use" in why or (port is not None and port.isdigit() and _taken(addr, int(port)))
        hint = (f"; the master port {port} is in use on this host: stop what holds it or set cluster.master_port to "
                "a free port" if taken else "")
        return (f"msrun's scheduler (pid {self.pid}) exited with {code} while the workers waited to join it"
                f"{': ' + why if why else ''}{hint}; its log: {log if log is not None else 'msrun --log_dir'}")


def _flag(argv: list[str], name: str) -> str | None:
    """msrun's ``NAME=VALUE`` in ``argv``."""
    return next((a.split("=", 1)[1] for a in argv if a.startswith(name + "=")), None)


def bind_error(host: str, port: int) -> str | None:
    """Why ``port`` cannot be bound on ``host`` as a server binds it (the OS's words), or None when it can: a listener
    still holding it fails, a closed connection's TIME_WAIT (left by the previous job on the port) does not. The
    preflight's master-port check (porting/cluster/preflight.py) and the dead scheduler's hint both ask this."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def _taken(addr: str, port: int) -> bool:
    """``port`` is bound on this host (the scheduler's address is local: another address is not this host's)."""
    return addr in ("127.0.0.1", "localhost", "0.0.0.0") and bind_error(addr, port) is not None
