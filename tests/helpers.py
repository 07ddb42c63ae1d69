"""The one way tests run the `port` command.

``port(*args)`` runs the real click command in this process and returns what ``python -m porting``
would: a ``subprocess.CompletedProcess`` with the exit status, stdout and stderr as text. Starting a
process costs ~10 s here (MindSpore, torch and transformers imported again each time); in this process
they are imported once. ``port_process(*args)`` is the real process, for the tests that are about the
process itself: its exit status, signals, resource limits, msrun workers, `python -m porting` wiring,
an environment of its own. Pick ``port`` unless the test is about one of those.

How the in-process run matches the process (so a test of ``port`` asserts what a user would see):

- exit status: ``sys.exit(n)`` gives ``n`` (None: 0; a non-integer is printed on stderr and gives 1, as
  Python does); an exception that escapes the CLI prints its traceback on stderr and gives 1, so a test
  for "no traceback" sees one where the process would have printed one;
- stdout and stderr apart, decoded with universal newlines as ``subprocess.run(text=True)`` does; the
  one-line ``error:`` of porting/cli/__init__.py (model_zoo/errors.py exit codes) as the process writes it;
- ``sys.argv`` as under ``python -m porting`` (port records it in run directories) and click's program
  name ``python -m porting``; the working directory and environment variables given, restored after;
- Python warnings with the interpreter's default filters, and log records that would reach the root
  logger's last-resort handler, written to stderr (pytest would otherwise swallow them);
- what a run leaves in the process is put back: the working directory, ``sys.argv``, environment,
  torch's thread count, the file and stream handlers of port's per-rank training loggers
  (MindSpore's execution mode is reset around each test by tests/conftest.py).

Not the same: output a C++ library writes to file descriptors 1/2 directly (MindSpore's GLOG lines,
which ``port_process`` silences with GLOG_v=3 anyway) is not captured, and import-time warnings appear
only on the first import in this process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
PROG = "python -m porting"
MAIN = str(ROOT / "porting" / "__main__.py")   # sys.argv[0] under `python -m porting`
# The interpreter's default warning filters (https://docs.python.org/3/library/warnings.html#default-warning-filter),
# which pytest replaces with its own (and pyproject's filterwarnings) inside a test.
_DEFAULT_IGNORED = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def _text(raw: bytes) -> str:
    """Bytes as ``subprocess.run(text=True)`` gives them: UTF-8 with universal newlines."""
    return raw.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def _exit_status(code: object) -> int:
    """The status of a process ended by ``SystemExit(code)`` (CPython's handling of the code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else (code % 256)
    sys.stderr.write(f"{code}\n")
    return 1


def _close_training_loggers(before: set[str]) -> None:
    """Close the handlers of the per-rank loggers a `port train` made (porting/rundir/ranklog.py `open_log`):
    the process would close them at exit; here they would keep the run's log file open and a stream
    handler pointing at this call's closed stderr."""
    for name in set(logging.Logger.manager.loggerDict) - before:
        log = logging.getLogger(name)
        if name.startswith("port.train."):
            for h in list(log.handlers):
                log.removeHandler(h)
                h.close()


class _LastResort(logging.Handler):
    """What the interpreter's ``logging.lastResort`` prints (WARNING and up, the bare message, on the
    stderr of the moment) for a record no handler of its logger's chain takes; the root logger's own
    handlers are pytest's here and none in the process."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def filter(self, record: logging.LogRecord) -> bool:
        log: logging.Logger | None = logging.getLogger(record.name)
        while log is not None and log.parent is not None:   # up to, not including, the root
            if log.handlers or not log.propagate:
                return False
            log = log.parent
        return super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(self.format(record) + "\n")


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def port(*args: str | os.PathLike, cwd: Path | str = ROOT, env: dict[str, str | None] | None = None,
         check: bool = False) -> subprocess.CompletedProcess:
    """``port ARGS`` run in this process, in ``cwd`` with ``env`` added to the environment (a None value
    unsets a variable); the exit status, stdout and stderr ``python -m porting ARGS`` would give."""
    from porting.cli import main

    argv = [os.fspath(a) for a in args]
    runner = CliRunner()
    old_argv, old_cwd, threads = sys.argv, os.getcwd(), _torch_threads()
    loggers = set(logging.Logger.manager.loggerDict)
    root = logging.getLogger()
    with runner.isolation(env=env) as (out, err, _), warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        for category in _DEFAULT_IGNORED:
            warnings.simplefilter("ignore", category)
        last_resort = _LastResort()
        root.addHandler(last_resort)
        sys.argv = [MAIN, *argv]
        try:
            os.chdir(cwd)
            main.main(args=argv, prog_name=PROG)   # standalone mode: always ends in SystemExit
            code = 0
        except SystemExit as e:
            code = _exit_status(e.code)
        except Exception:   # escaped the CLI: the interpreter prints the traceback and exits 1
            sys.stderr.write(traceback.format_exc())
            code = 1
        finally:
            root.removeHandler(last_resort)
            sys.argv = old_argv
            os.chdir(old_cwd)
            _close_training_loggers(loggers)
            if threads is not None:
                sys.modules["torch"].set_num_threads(threads)
        for w in caught:
            sys.stderr.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
        sys.stdout.flush()
        sys.stderr.flush()
        p = subprocess.CompletedProcess(["port", *argv], code, _text(out.getvalue()), _text(err.getvalue()))
    if check and p.returncode != 0:
        raise AssertionError(f"port {' '.join(argv)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def port_process(*args: str | os.PathLike, cwd: Path | str = ROOT, env: dict[str, str] | None = None,
                 timeout: float = 600, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """``python -m porting ARGS`` in a process of its own (this checkout on PYTHONPATH, MindSpore's C++
    log quiet): for tests about the process itself (see the module docstring); ``kw`` goes to
    ``subprocess.run``."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "porting", *map(os.fspath, args)], cwd=cwd, capture_output=True,
                       text=True, timeout=timeout, env=full_env, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"port {' '.join(map(os.fspath, args))} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p
