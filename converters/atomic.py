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
from typing import Callable, Iterable, Iterator

from model_zoo.errors import CheckpointError, PortingError, one_line
from model_zoo.files import MAX_JSON_BYTES, read_json_object, swap_in

_TMP_TAG = ".port-tmp-"
_OLD_TAG = ".port-old-"
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs. A zombie (killed, not yet reaped by its parent: a ``kill -9``
    seen by a caller that has not waited) is dead: it writes nothing more, and its temporaries are stale."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
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
    one of the ``protected`` inputs (:func:`check_out` without the port-wrote test, which the converter
    makes itself with its companion files: ``converters.convert.check_replaceable``)."""
    check_out(dest, inputs=protected, force=force, ours=lambda d: True)


def check_out(dest: str | Path, *, inputs: Iterable[str | Path] = (), kind: str = "dir", force: bool | None = None,
              ours: Callable[[Path], bool] | None = None, what: str = "an output port wrote",
              error: type[PortingError] = CheckpointError) -> Path:
    """The one rule for every ``--out`` of every command (and each side file a command writes beside it);
    returns the resolved path. Refused, ``--force`` or not:

    * a symbolic link (the path itself): port never writes through one;
    * an input, a path inside an input directory, or a directory holding an input (compared resolved,
      so ``x/../SRC`` and links name what they reach);
    * for a directory output (``kind="dir"``): an existing file; a non-empty directory unless ``force``
      and ``ours(dir)`` (its manifest says port wrote it); commands without ``--force`` (``force=None``)
      take a new path or an empty directory only;
    * for a file output (``kind="file"``): a directory; an existing file unless ``ours(file)`` (a file port
      wrote of the same kind, such as an earlier baseline; never one of the user's).
    """
    p = Path(dest)
    if p.is_symlink():
        raise error(f"{_shown(p)}: is a symbolic link; pass --out a real path (port does not write through links)")
    r = p.resolve()
    for i in inputs:
        i = Path(i).resolve()
        if r == i or r in i.parents or i in r.parents:
            raise error(f"{_shown(p)}: overlaps the input {_shown(i)}; choose an --out outside the inputs that "
                        "does not hold them")
    if not p.exists():
        return r
    if kind == "file":
        if p.is_dir():
            raise error(f"{_shown(p)}: is a directory; expected a file path for --out")
        if p.is_file() and ours is not None and ours(p):
            return r
        raise error(f"{_shown(p)}: exists and is not {what}; port never overwrites a file it did not write: choose "
                    "another --out or remove it yourself")
    if not p.is_dir():
        raise error(f"{_shown(p)}: exists and is a file; expected a directory path for --out")
    if not any(p.iterdir()):
        return r
    if not force:
        hint = "pass --force to replace it, or choose another --out" if force is not None else (
            "port writes a new or empty directory only: choose another --out")
        raise error(f"{_shown(p)}: exists and is not empty; {hint}")
    if ours is None or not ours(p):
        raise error(f"{_shown(p)}: exists, is not empty and is not {what}; --force replaces only directories port "
                    "wrote. Remove it yourself or choose another --out")
    return r


def json_of_format(*formats: str) -> Callable[[Path], bool]:
    """A test of :func:`check_out`: the file is a regular JSON object port wrote, of one of ``formats``."""
    def test(p: Path) -> bool:
        if p.is_symlink() or not p.is_file():
            return False
        try:
            doc = read_json_object(p, max_bytes=MAX_JSON_BYTES)
        except PortingError:
            return False
        return doc.get("format") in formats
    return test


def _shown(p: Path) -> str:
    return one_line(p)


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
