"""Reading and writing small files the one way the whole project does it.

* ``read_text`` / ``read_json`` / ``read_json_object``: bounded in size and nesting depth, decoded as
  UTF-8, and every failure is one ``PortingError`` line that names the file and says how to fix it
  (never a ``UnicodeDecodeError``, ``RecursionError`` or ``MemoryError`` traceback).
* ``write_atomic``: a file appears whole or not at all (temporary file in the same directory, fsync,
  ``os.replace``). The old file stays in place until the new one is complete.
* ``sha256_file``: the digest of a whole file, streamed.

It lives in the lowest package so that ``model_zoo``, ``converters`` and ``porting`` share it while
imports keep going one way. Whole output *directories* are staged by ``converters.atomic``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from model_zoo.errors import PortingError

MAX_JSON_BYTES = 64 << 20     # config.json, manifests, rank tables, run records: far below this
MAX_JSON_DEPTH = 64           # the deepest real document here (a rank table) nests 6 levels
MAX_INT_DIGITS = 40           # 2**128 has 39 digits: no step, byte count or size port reads comes near


class _HugeInt(ValueError):
    pass


def _bounded_int(text: str) -> int:
    """JSON integers, refused past ``MAX_INT_DIGITS`` digits: CPython raises a bare ValueError past 4,300
    digits, and a 401-digit count overflows every float it meets later (a report's plot, a ratio)."""
    digits = len(text) - (text[:1] == "-")
    if digits > MAX_INT_DIGITS:
        raise _HugeInt(digits)
    return int(text)


def read_text(path: str | Path, *, what: str = "file", max_bytes: int = MAX_JSON_BYTES,
              error: type[PortingError] = PortingError, follow_links: bool = True) -> str:
    """The text of a regular file (without a leading UTF-8 byte-order mark), refused (one line) when
    missing, too large, not a regular file, or not UTF-8. ``follow_links=False``: a symbolic link is refused,
    and the file is opened with ``O_NOFOLLOW`` (a link swapped in after the check is not followed either)."""
    p = Path(path)
    if not follow_links and p.is_symlink():
        raise error(f"{p}: the {what} is a symbolic link; port reads this file only as itself, never through a link "
                    "(replace the link with the file)")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise error(f"{p}: {what} not found; check the path") from None
    except OSError as e:
        raise error(f"{p}: cannot read the {what} ({e.strerror}); check the path and its permissions") from None
    if not p.is_file():
        raise error(f"{p}: expected a regular file for the {what}, found something else (a directory, FIFO or "
                    "device); pass the file itself")
    if st.st_size > max_bytes:
        raise error(f"{p}: the {what} is {st.st_size:,} bytes, more than the {max_bytes:,} allowed; "
                    f"this is not a {what} port can read")
    try:
        raw = _read_at_most(p, max_bytes, follow_links)
    except OSError as e:
        raise error(f"{p}: cannot read the {what} ({e.strerror}); check its permissions") from None
    if raw is None:
        raise error(f"{p}: the {what} grew past {max_bytes:,} bytes while being read")
    try:
        # a leading byte-order mark (Windows editors, Excel's "CSV UTF-8") is not text: "utf-8-sig" drops it
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{p}: the {what} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                    "save it as UTF-8") from None


READ_CHUNK = 1 << 20


def _read_at_most(p: Path, max_bytes: int, follow_links: bool = True) -> bytes | None:
    """The bytes of ``p``, or None once more than ``max_bytes`` were seen. Read in chunks: ``f.read(n)``
    allocates ``n`` bytes up front, so one read of a 16 GiB bound would ask for 16 GiB of address space
    whatever the file's size (a MemoryError under ``ulimit -v``)."""
    parts, total = [], 0
    flags = os.O_RDONLY | (0 if follow_links else os.O_NOFOLLOW)
    with open(p, "rb", opener=lambda path, _: os.open(path, flags)) as f:
        while block := f.read(min(READ_CHUNK, max_bytes + 1 - total)):
            parts.append(block)
            total += len(block)
            if total > max_bytes:
                return None
    return b"".join(parts)


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, counted iteratively and stopping once past ``limit``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(text: str, *, where: str, what: str = "JSON", max_depth: int = MAX_JSON_DEPTH,
               error: type[PortingError] = PortingError) -> Any:
    """``json.loads`` with a depth bound and one-line errors; ``where`` names the file (and row)."""
    try:
        value = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise error(f"{where}: invalid {what} at line {e.lineno} column {e.colno} ({e.msg}); fix the syntax") from None
    except _HugeInt as e:
        raise error(f"{where}: the {what} holds an integer of {e.args[0]:,} digits, more than the "
                    f"{MAX_INT_DIGITS} any count or size port reads can have; the file was edited or is "
                    "not one port can read") from None
    except RecursionError:
        raise error(f"{where}: the {what} nests deeper than {max_depth} levels; this is not a {what} port "
                    "can read") from None
    if json_depth(value, max_depth) > max_depth:
        raise error(f"{where}: the {what} nests deeper than {max_depth} levels; this is not a {what} port can read")
    return value


def read_json(path: str | Path, *, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH, error: type[PortingError] = PortingError) -> Any:
    """A JSON document from a file, bounded in size and depth, with one-line errors."""
    text = read_text(path, what=what, max_bytes=max_bytes, error=error)
    return parse_json(text, where=str(path), what=what, max_depth=max_depth, error=error)


def read_json_object(path: str | Path, *, what: str = "JSON file", max_bytes: int = MAX_JSON_BYTES,
                     max_depth: int = MAX_JSON_DEPTH, error: type[PortingError] = PortingError) -> dict:
    """Like ``read_json``, and the top level must be an object."""
    value = read_json(path, what=what, max_bytes=max_bytes, max_depth=max_depth, error=error)
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object at the top level of the {what}, found "
                    f"{type(value).__name__}")
    return value


def write_atomic(path: str | Path, data: bytes | str, *, error: type[PortingError] = PortingError) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    The temporary file sits in the destination directory (same filesystem, so the rename is atomic) and is
    removed on any failure; the destination is never deleted first."""
    p = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".port-tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise error(f"{e.filename or p}: cannot write {p.name} ({e.strerror}); check that the directory exists, "
                    "is writable and has free space") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def swap_in(staged: Path, dest: Path, old: Path) -> None:
    """Put the complete directory ``staged`` in place of ``dest``: the existing ``dest`` is moved aside to
    ``old`` first, not deleted (a crash between the two renames leaves it recoverable), then removed. Both
    renames are within one directory, so each is atomic."""
    if dest.exists():
        os.replace(dest, old)
    os.replace(staged, dest)
    shutil.rmtree(old, ignore_errors=True)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """sha256 of a whole file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def plain_name(name: Any, *, where: str, key: str, error: type[PortingError] = PortingError) -> str:
    """``name`` when it is a plain file name (no directory part, not ``.``/``..``, no NUL), else one error.

    Every file name read from a file (a manifest, an index, a rank table) goes through this, so a name
    can never point outside the directory it is confined to (``../x``, ``/etc/x``, ``a/b``)."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name
            or "\x00" in name or len(name) > 255):
        raise error(f"{where}: {key}: found {name!r}, expected a plain file name (no directory part, no '..'); "
                    "the file was edited or is not one port wrote")
    return name


@functools.lru_cache(maxsize=None)
def _sync_file_range():
    """libc's sync_file_range, looked up on the first write that asks (not at import: every command imports
    this module), or None."""
    try:
        import ctypes  # deferred: only a writer of large files needs it

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):   # not Linux (or no such symbol): no early start, fsync does it all
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE_WRITE = 2   # <linux/fs.h>: start writeback of dirty pages in the range, do not wait


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing bytes [offset, offset + nbytes) of ``fd`` to disk and return at once (Linux
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, sync_file_range(2)): the disk writes while the caller
    prepares the next bytes, and the fsync at the end waits only for what is left. A hint: it makes nothing
    durable (fsync still does) and a failure or a platform without it changes nothing."""
    fn = _sync_file_range() if nbytes > 0 else None
    if fn is not None:
        fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)
