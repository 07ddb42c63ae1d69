"""Streaming safetensors: a validating header parser, memory-mapped tensor reads, and a writer that
puts the header down first and then the tensor bytes one chunk at a time.

The format (huggingface/safetensors): 8 bytes little-endian header length N, N bytes of JSON
``{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}``, then the
data; offsets are relative to the end of the header. MindSpore's own reader
(``mindspore.parallel.transform_safetensors.read_metadata``) additionally wants the JSON entries in
data order, contiguous from 0 and ending at the end of the file: our writer always produces that,
laid out byte for byte like the safetensors library's writer (compact JSON, ``__metadata__`` first,
header padded with spaces to a multiple of 8), so a file it wrote round-trips to identical bytes.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import mmap
import os
import struct
from pathlib import Path
from typing import BinaryIO, Iterator

from converters import dtypes
from model_zoo.errors import CheckpointError

MAX_HEADER_BYTES = 100_000_000  # the limit both safetensors and MindSpore enforce
CHUNK_BYTES = 64 << 20
_PAGE = mmap.PAGESIZE


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors code
    shape: tuple[int, ...]
    begin: int  # absolute offsets in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclasses.dataclass(frozen=True)
class Header:
    path: Path
    header_bytes: int  # 8 + N: where the data starts
    file_bytes: int
    metadata: dict[str, str] | None
    tensors: tuple[TensorInfo, ...]  # in data order

    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


def _bad(path: Path, what: str, tensor: str | None = None) -> CheckpointError:
    where = f"{path}: tensor {tensor}" if tensor else str(path)
    return CheckpointError(f"{where}: {what}")


def _entry(path: Path, name: str, raw: object, base: int, file_bytes: int) -> TensorInfo:
    if not isinstance(raw, dict) or not {"dtype", "shape", "data_offsets"} <= raw.keys():
        raise _bad(path, "header entry must be an object with dtype, shape and data_offsets; the file is "
                         "corrupt, re-export it", name)
    code, shape, offs = raw["dtype"], raw["shape"], raw["data_offsets"]
    if code not in dtypes.BY_CODE:
        raise _bad(path, f"unsupported dtype {code!r}; expected one of {', '.join(dtypes.CONVERTIBLE)}", name)
    if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                               for d in shape)):
        raise _bad(path, f"shape {shape!r} is not a list of non-negative integers; the header is corrupt", name)
    if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) and not isinstance(o, bool)
                                                                for o in offs)):
        raise _bad(path, f"data_offsets {offs!r} is not [begin, end]; the header is corrupt", name)
    begin, end = offs
    need = math.prod(shape) * dtypes.BY_CODE[code].itemsize
    if begin < 0 or end < begin:
        raise _bad(path, f"data_offsets {offs} out of range (begin must be >= 0 and <= end); the header is "
                         "corrupt", name)
    if end - begin != need:
        raise _bad(path, f"data_offsets {offs} span {end - begin} bytes, but {code} {shape} needs {need}; "
                         "the header is corrupt", name)
    if base + end > file_bytes:
        raise _bad(path, f"data_offsets {offs} run past the end of the file ({file_bytes - base} data bytes "
                         "present); the file is truncated or the header is corrupt, re-download or re-export "
                         "it", name)
    return TensorInfo(name, code, tuple(shape), base + begin, base + end)


def read_header(path: str | os.PathLike) -> Header:
    """Parse and validate a safetensors header; every problem is one CheckpointError naming the file
    (and the tensor). Nothing beyond the header is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, f"file has {size} bytes, too short for a safetensors header (8-byte length "
                                 "first); the file is truncated or not safetensors")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise _bad(path, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit; the file is "
                                 "corrupt or not safetensors")
            if 8 + n > size:
                raise _bad(path, f"header length {n} runs past the end of the {size}-byte file; the file is "
                                 "truncated or corrupt")
            blob = f.read(n)
    except OSError as e:
        raise _bad(path, f"cannot read ({e.strerror})") from None
    dups: list[str] = []

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
        counts = collections.Counter(k for k, _ in pairs)
        dups.extend(sorted(k for k, n in counts.items() if n > 1))
        return dict(pairs)
    try:
        raw = json.loads(blob.decode("utf-8"), object_pairs_hook=no_duplicates)
    # RecursionError: nested too deep; ValueError: JSONDecodeError, or an integer past CPython's 4,300 digits
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(path, f"header is not valid JSON ({e}); the file is corrupt or not safetensors") from None
    if dups:
        raise _bad(path, "listed twice in the header; the file is corrupt, re-export it", dups[0])
    if not isinstance(raw, dict):
        raise _bad(path, "header is not a JSON object; the file is corrupt or not safetensors")
    meta = raw.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise _bad(path, "__metadata__ must map strings to strings; the header is corrupt")
    base = 8 + n
    tensors = sorted((_entry(path, k, v, base, size) for k, v in raw.items()), key=lambda t: (t.begin, t.end))
    for a, b in zip(tensors, tensors[1:]):
        if b.begin < a.end:
            raise _bad(path, f"data_offsets overlap those of {a.name} ([{a.begin - base}, {a.end - base}] and "
                             f"[{b.begin - base}, {b.end - base}]); the header is corrupt", b.name)
    return Header(path, base, size, meta, tuple(tensors))


class MappedFile:
    """A read-only memory map of one file. Chunks already consumed are dropped from this process's
    resident set (MADV_DONTNEED), so reading a 13 GiB checkpoint does not grow RSS by 13 GiB."""

    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "rb")
        size = os.fstat(self._f.fileno()).st_size
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.size = size

    def chunks(self, begin: int, end: int, chunk: int = CHUNK_BYTES) -> Iterator[memoryview]:
        """Views of [begin, end) in pieces of at most ``chunk`` bytes (a multiple of 8)."""
        pos = begin
        while pos < end:
            stop = min(end, pos + chunk)
            view = memoryview(self._mm)[pos:stop]
            try:
                yield view
            finally:  # also when the consumer stops early (zip() leaves the longer generator suspended)
                view.release()
                self._drop(pos, stop)
            pos = stop

    def fileno(self) -> int:
        return self._f.fileno()

    def view(self, begin: int, end: int) -> memoryview:
        """A view of [begin, end) that the caller owns (and releases)."""
        return memoryview(self._mm)[begin:end]

    def drop(self, begin: int, end: int) -> None:
        """Let the kernel unmap [begin, end) from this process (the page cache keeps the data)."""
        self._drop(begin, end)

    def read(self, begin: int, end: int) -> bytes:
        return bytes(self._mm[begin:end]) if self._mm is not None else b""

    def _drop(self, begin: int, end: int) -> None:
        lo = begin - begin % _PAGE
        hi = end - end % _PAGE
        if hi > lo and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view is still referenced (e.g. by an in-flight traceback):
                pass  # the mapping goes when the last view does
        self._f.close()

    def __enter__(self) -> "MappedFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtypes.BY_CODE[self.dtype].itemsize


def encode_header(tensors: list[OutTensor], metadata: dict[str, str] | None, align_with: int | None = None) -> bytes:
    """The 8-byte length and JSON header for ``tensors`` laid out contiguously in the given order,
    formatted exactly as the safetensors library writes it (padded with spaces to a multiple of 8).
    ``align_with``: another file's header length; when it is a multiple of 8, more spaces make the data
    start at the same offset within a page as there, so copying the data from that file moves whole
    pages (a page-misaligned copy_file_range costs half as much again)."""
    body: dict[str, object] = {}
    if metadata:
        body["__metadata__"] = metadata
    pos = 0
    for t in tensors:
        body[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [pos, pos + t.nbytes]}
        pos += t.nbytes
    blob = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    if align_with is not None and align_with % 8 == 0:
        blob += b" " * ((align_with - 8 - len(blob)) % _PAGE)
    return struct.pack("<Q", len(blob)) + blob


def write_all(f: BinaryIO, data: memoryview | bytes) -> None:
    """Write all of ``data`` (raw, unbuffered files may write less than asked)."""
    total = data.nbytes if isinstance(data, memoryview) else len(data)
    done = f.write(data)
    while done < total:
        with memoryview(data) as view, view.cast("B") as flat, flat[done:] as rest:
            n = f.write(rest)
        if not n:
            raise OSError(f"short write: {done} of {total} bytes")
        done += n
