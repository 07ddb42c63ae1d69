"""The parent side of the chat-template worker (:mod:`porting.train.data.template_worker`): start it,
send it requests, and kill it past a deadline.

The worker is started once per template (``python -I template_worker.py``: ~0.1 s) and answers every
row's renders over a pipe, so the cost per row is one or two round trips (tens of microseconds) on top
of the Jinja rendering itself. A request that is not answered within :data:`DEADLINE_S` seconds (a
template that loops where no hook sees it) kills the worker and is one error; the worker's memory is
capped by its own ``RLIMIT_AS``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import weakref
from pathlib import Path

WORKER = Path(__file__).with_name("template_worker.py")
DEADLINE_S = 5.0            # one request: a real template renders a row in milliseconds
MAX_ANSWER_BYTES = 1 << 30  # the worker's output cap (64 M characters) in UTF-8 JSON, with room


class WorkerFailure(Exception):
    """The worker exceeded a limit (``kind`` "limit"), could not compile the template ("syntax"), or
    refused a row ("row", "mask"); ``str()`` is the reason, without the template's name."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:
            pass


class TemplateProcess:
    """A running worker for one template; :meth:`ask` sends one request and returns its ``ok`` value."""

    def __init__(self, template: str, variables: dict, deadline_s: float = DEADLINE_S):
        self.deadline_s = deadline_s
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR", "TZ")}
        self.proc = subprocess.Popen([sys.executable, "-I", str(WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True)
        self._finalizer = weakref.finalize(self, _stop, self.proc)
        self._rest = b""
        self.ask({"op": "init", "template": template, "variables": variables})

    def close(self) -> None:
        self._finalizer()

    def ask(self, request: dict):
        if self.proc.poll() is not None:
            raise WorkerFailure("the template worker is no longer running (an earlier request went past a limit)",
                                "limit")
        try:
            self.proc.stdin.write(json.dumps(request, ensure_ascii=False).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            raise WorkerFailure("the template worker stopped (it went past its memory limit)", "limit") from None
        answer = json.loads(self._line())
        if "error" in answer:
            raise WorkerFailure(answer["error"], answer["kind"])
        return answer["ok"] if "renders" not in answer else (answer["ok"], answer["renders"])

    def _line(self) -> bytes:
        """The next answer line, or a WorkerFailure once the deadline passes or the worker dies."""
        fd, end = self.proc.stdout.fileno(), time.monotonic() + self.deadline_s
        parts, size, chunk = [self._rest], len(self._rest), self._rest
        while b"\n" not in chunk:
            left = end - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                self.close()
                raise WorkerFailure(f"rendering took longer than {self.deadline_s:g} s (a loop without bound?)",
                                    "limit")
            chunk = os.read(fd, 1 << 20)
            size += len(chunk)
            if not chunk or size > MAX_ANSWER_BYTES:
                self.close()
                raise WorkerFailure("the template worker stopped (it went past its memory limit)", "limit")
            parts.append(chunk)
        line, _, self._rest = b"".join(parts).partition(b"\n")   # one answer per request: no rest expected
        return line
