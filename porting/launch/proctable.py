"""The process table (/proc): who runs what, from where, under which launcher and node rank, which files each
holds open, which process descends from which, and in what state each is. The preflight's stale-process check and
the supervisor read it. Every read is bounded and tolerant of a process that ends while it is read."""

from __future__ import annotations

import os
from pathlib import Path


def process_table() -> dict[int, tuple[int, list[str], str]]:
    """pid -> (parent pid, argv, cwd) of the processes this user can read."""
    table = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            cwd = "/"
        if argv and argv[-1] == "":
            argv = argv[:-1]
        table[int(entry.name)] = (ppid, argv, cwd)
    return table


def is_worker(argv: list[str]) -> bool:
    """A rank of `port train` (porting/launch/workers/train.py), by its command line."""
    return any(a.endswith(os.path.join("porting", "launch", "workers", "train.py")) for a in argv[:3])


def node_of(argv: list[str]) -> int | None:
    """The node rank a launcher's command line names (`--launch-node N`, msrun's `--node_rank=N`)."""
    for i, a in enumerate(argv):
        for flag in ("--launch-node", "--node_rank"):
            value = a[len(flag) + 1:] if a.startswith(flag + "=") else (argv[i + 1] if a == flag and
                                                                          i + 1 < len(argv) else None)
            if value is not None and value.lstrip("-").isdigit():
                return int(value)
    return None


def descends(pid: int, roots: set[int], procs: dict) -> bool:
    seen = set()
    while pid > 1 and pid not in seen:
        if pid in roots:
            return True
        seen.add(pid)
        pid = procs.get(pid, (0,))[0]
    return False


def names_dir(argv: list[str], cwd: str, target: Path) -> bool:
    """An argument (or the value after `=`) that is ``target`` or a path inside it."""
    for a in argv[1:]:
        value = a.rsplit("=", 1)[-1]
        if not value or "/" not in value and value != target.name:
            continue
        path = Path(os.path.normpath(os.path.join(cwd, value)))
        if path == target or target in path.parents:
            return True
    return False


def holds(pid: int, match) -> bool:
    """Whether one of the process's open files (``/proc/PID/fd``, the first 4,096) satisfies ``match``."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())[:4096]
    except OSError:
        return False
    for fd in fds:
        try:
            if match(Path(os.readlink(fd))):
                return True
        except OSError:
            continue
    return False


def state(pid: int) -> str:
    """The process state letter of /proc/<pid>/stat (R, S, D, T, Z...), '' when unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie child of an exited msrun is gone for our purpose)."""
    return state(pid) not in ("Z", "")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree (its children, theirs, ...), by parent pid."""
    table = process_table()
    return sorted(p for p in table if p != pid and descends(p, {pid}, table))
