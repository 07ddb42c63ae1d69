"""The directory walk of `port diagnose`: which files under LOGDIR are logs, and scanning them (a
process pool for large directories; porting/diagnostics/scan.py scans one file)."""

from __future__ import annotations

import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from porting.diagnostics import DiagnosticsError
from porting.diagnostics.grammar import error_table
from porting.diagnostics.scan import FileScan, scan_file


LOG_SUFFIXES = (".log", ".txt", ".out", ".err")


def list_logs(logdir: Path) -> tuple[list[str], list[str]]:
    """Relative paths of log files under ``logdir`` and problems met while walking."""
    if not logdir.exists():
        raise DiagnosticsError(f"{logdir}: no such directory; pass the job's log directory "
                               f"(msrun --log_dir, a run's logs/, or a CANN log dir)")
    if not logdir.is_dir():
        raise DiagnosticsError(f"{logdir}: is a file; pass the directory that holds the logs")
    if not os.access(logdir, os.R_OK | os.X_OK):
        raise DiagnosticsError(f"{logdir}: directory is not readable (permissions); run as the job's user "
                               f"or copy the logs")
    found: list[str] = []
    problems: list[str] = []

    def onerror(e: OSError) -> None:
        problems.append(f"{e.filename}: unreadable directory ({e.strerror})")

    for dirpath, _dirs, files in os.walk(logdir, onerror=onerror):
        for name in files:
            if name.endswith(LOG_SUFFIXES) or re.match(r"^(plog|device)-\d+_\d+", name):
                full = os.path.join(dirpath, name)
                found.append(os.path.relpath(full, logdir))
    found.sort()
    return found, problems


def scan_dir(logdir: Path, jobs: int | None = None) -> tuple[list[FileScan], list[str]]:
    files, problems = list_logs(logdir)
    if not files:
        raise DiagnosticsError(
            f"{logdir}: no log files found (looked for worker_<r>.log, scheduler.log, rank_<r>.log, "
            f"plog-<pid>_<ts>.log and other *.log/*.txt); pass msrun's --log_dir or the run's logs/")
    root = str(logdir)
    jobs = jobs or min(os.cpu_count() or 1, 8)
    if jobs <= 1 or len(files) < 64:
        scans = [scan_file(root, rel) for rel in files]
    else:
        error_table()   # loaded once here: forked workers inherit it instead of each parsing the YAML
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            scans = list(pool.map(_scan_star, ((root, rel) for rel in files), chunksize=32))
    return [part for sc in scans for part in (sc.parts or [sc])], problems


def _scan_star(args: tuple[str, str]) -> FileScan:
    return scan_file(*args)


# ---------------------------------------------------------------------------------------------