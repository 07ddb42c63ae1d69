"""Output directories that appear whole or not at all.

Everything is written into a hidden temporary directory beside the destination (same filesystem, so
the final step is one ``rename``). A crash, ``kill -9`` or full disk leaves nothing at the destination;
the next run removes temporary directories whose writer process is gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from model_zoo.errors import CheckpointError
from model_zoo.files import swap_in

_TMP_TAG = ".port-tmp-"
_OLD_TAG = ".port-old-"
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(dest: Path) -> list[Path]:
    """Remove temporary directories of earlier runs for ``dest`` whose process no longer exists."""
    removed = []
    for tag in (_TMP_TAG, _OLD_TAG):
        for p in dest.parent.glob(f".{dest.name}{tag}*"):
            pid = p.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def check_destination(dest: Path, force: bool, protected: list[Path]) -> None:
    """Refuse a destination that is a file, a non-empty directory (unless ``force``), or holds or is inside
    one of the ``protected`` inputs."""
    if dest.exists() and not dest.is_dir():
        raise CheckpointError(f"{dest}: exists and is a file; expected a directory path for --out")
    for p in protected:
        p = p.resolve()
        if dest == p or dest in p.parents or p in dest.parents:
            raise CheckpointError(f"{dest}: overlaps the input {p}; choose an --out outside the source directory")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise CheckpointError(f"{dest}: exists and is not empty; pass --force to replace it, or choose another --out")


def check_free_space(dest: Path, need_bytes: int) -> None:
    """Refuse early when the disk that will hold ``dest`` (its nearest existing ancestor) is too small."""
    probe = next(p for p in [dest.parent, *dest.parent.parents] if p.exists())
    free = shutil.disk_usage(probe).free
    if need_bytes > free:
        raise CheckpointError(f"{dest.parent}: not enough free disk space: the output needs {need_bytes} bytes "
                              f"({need_bytes / 2**30:.3g} GiB), {free} bytes free; free space or choose --out on "
                              "another disk")


@contextlib.contextmanager
def staged_dir(dest: Path, force: bool) -> Iterator[Path]:
    """Yield a fresh temporary directory; on normal exit it replaces ``dest``, on any error it is removed."""
    tmp = dest.parent / f".{dest.name}{_TMP_TAG}{os.getpid()}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise CheckpointError(f"{e.filename or dest.parent}: cannot create the output directory ({e.strerror}); "
                              "choose another --out") from None
    try:
        yield tmp
        _commit(tmp, dest, force)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in DISK_FULL_ERRNOS:
            raise CheckpointError(f"{e.filename or dest}: disk full while writing ({e.strerror}); nothing was "
                                  f"written to {dest}. Free space or choose --out on another disk") from None
        raise CheckpointError(f"{e.filename or dest}: {e.strerror or e}; nothing was written to {dest}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _commit(tmp: Path, dest: Path, force: bool) -> None:
    if dest.exists() and any(dest.iterdir()) and not force:  # appeared while we were writing
        raise CheckpointError(f"{dest}: became non-empty during the conversion; pass --force to replace it")
    swap_in(tmp, dest, dest.parent / f".{dest.name}{_OLD_TAG}{os.getpid()}")
