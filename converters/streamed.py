"""A conversion whose source is not a file: its tensors are handed over one at a time, and each goes once into
the output.

``port ckpt merge`` and the end-of-run HF export (porting/train/run/checkpoint/export.py) assemble each weight
of a per-rank training checkpoint whole in memory. Until issue 46 every one was written under its MindSpore
name to a staging file, which ``port convert --ms`` then read back and wrote under its HF name: every byte
written twice and read twice. Megatron-Bridge exports in one streamed pass; so does this:

* :func:`described`: the MindSpore-named safetensors file the tensors *would* make (its header and every
  tensor's offsets, laid out as :func:`converters.safetensors_io.encode_header` lays them; ``port ckpt merge
  --ms`` writes exactly this file), as a :class:`converters.sources.Source` that no one opens;
* ``converters.convert.plan_source`` plans it like any MindSpore source: the name map (converters/names.py),
  coverage and shapes against config.json, the fused Phi-3 layouts (converters/fused.py);
* :func:`write`: each tensor, as the caller hands it over in the source's order, is hashed into the source
  file's sha256 (the digest the staged file had) and into its output tensor's sha256, and written at its
  place in the HF file (and, with ``copy``, into the MindSpore-named file itself); the parts of a fused HF
  tensor are held until the last one arrives (``converters.tensor_writer.write_loaded`` does the same);
* ``converters.convert.finish`` writes the companions and ``port_manifest.json``, as for any conversion.

The output is the one the two passes made, byte for byte, manifest included, except what describes the
run rather than the weights: ``created``; ``source.dir`` (the directory the tensors came from, where the
staged copy's pid-named temporary directory was); ``output.bytes_written_by`` (all from user space here).
The directory appears whole or not at all (``converters.atomic.staged_dir``).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from converters import atomic, convert
from converters.fused import FusedInfo
from converters.layout import ConversionLayout, PlannedFile
from converters.safetensors_io import OutTensor, TensorInfo, encode_header
from converters.sources import Source, SourceFile
from converters.tensor_writer import tensor_record
from model_zoo import files
from model_zoo.errors import CheckpointError

# Bytes hashed twice and written per step: small enough to stay in a core's L2 cache between the three uses
# (porting/train/run/checkpoint/format.py SLICE_BYTES measured 1 MiB best for the same hash-and-write).
SLICE_BYTES = 1 << 20
WRITEBACK_BYTES = 32 << 20   # as porting/train/run/checkpoint/format.py's rank files: model_zoo.files.start_writeback
# A source tensor's whole bytes. Called on a thread of its own, one tensor ahead of the one being written, in the
# source's order: a view must stay valid until the call after the next returns (two buffers in turn).
Read = Callable[[TensorInfo], memoryview]


def described(where: Path, name: str, tensors: Sequence[OutTensor], metadata: dict[str, str] | None,
              named: Path) -> tuple[Source, bytes]:
    """The safetensors file ``where/name`` that would hold ``tensors`` in this order, and its header bytes.
    ``named``: the file that describes the tensors, named in the plan's errors (nothing opens either)."""
    header = encode_header(list(tensors), metadata)
    infos, pos = [], len(header)
    for t in tensors:
        infos.append(TensorInfo(t.name, t.dtype, t.shape, pos, pos + t.nbytes))
        pos += t.nbytes
    f = SourceFile(name, named, tuple(infos), metadata, len(header))
    return Source("safetensors", where, (f,), None, None), header


def write(plan: ConversionLayout, header: bytes, read: Read, out_dir: Path, *, inputs: list[Path],
          companions: dict[str, Path | bytes], force: bool = False, command: list[str] | None = None,
          versions: dict | None = None, copy: Path | None = None) -> dict:
    """Write ``plan`` (one source file, described by :func:`described` with ``header``) to ``out_dir`` from
    ``read``, in one pass; ``inputs``: what ``out_dir`` may not overlap; ``companions``: name -> a file to
    copy or its bytes; ``copy``: also write the source file itself there (fsynced). Returns the manifest."""
    if len(plan.files) != 1:
        raise ValueError("a streamed conversion has one source file")
    convert.check_companions([p for p in companions.values() if isinstance(p, Path)])
    out_dir = convert.check_output(plan, out_dir, force, inputs, list(companions.values()))
    pf = plan.files[0]
    with atomic.staged_dir(out_dir, force) as tmp:
        digest, records, written = _stream(pf, header, read, tmp / pf.out_name, out_dir / pf.out_name, copy)
        size = len(header) + sum(t.nbytes for t in pf.src.tensors)
        src = [convert.source_record(pf, size, digest, "computed")]
        return convert.finish(plan, out_dir, tmp, records, src, companions, {"copy_file_range": 0, "write": written},
                              command=command, versions=versions)


def _homes(pf: PlannedFile) -> dict[str, tuple[int, FusedInfo | None, int]]:
    """Source tensor name -> (its output's index in ``pf.tensors``, the fused tensor it is part of, which part)."""
    homes = {}
    for j, (t, o) in enumerate(pf.tensors):
        parts = t.parts if isinstance(t, FusedInfo) else (t,)
        if any(p.dtype != o.dtype for p in parts):   # the export keeps the trained dtype; a cast is port convert's
            raise ValueError(f"{o.name}: a streamed conversion does not cast ({parts[0].dtype} -> {o.dtype})")
        for k, p in enumerate(parts):
            homes[p.name] = (j, t if isinstance(t, FusedInfo) else None, k)
    return homes


def _stream(pf: PlannedFile, header: bytes, read: Read, path: Path, shown: Path,
            copy: Path | None) -> tuple[str, list[dict], int]:
    """Every source tensor once, in the source's order (the source file's digest is over that order); returns
    (the source file's sha256, the output tensors' records, the data bytes written)."""
    homes, out_head = _homes(pf), pf.header
    at, pos = [], len(out_head)
    for _, o in pf.tensors:
        at.append(pos)
        pos += o.nbytes
    digests: list[str | None] = [None] * len(pf.tensors)
    held: dict[int, dict[int, bytes]] = {}
    source = hashlib.sha256(header)
    tensors = pf.src.tensors
    with _Files(path, shown, copy) as out, ThreadPoolExecutor(2) as hashers, ThreadPoolExecutor(1) as ahead:
        out.write(out_head, 0, header)
        coming = ahead.submit(read, tensors[0]) if tensors else None
        for i, t in enumerate(tensors):   # tensor i is hashed and written while tensor i + 1 is read
            view = coming.result()
            coming = ahead.submit(read, tensors[i + 1]) if i + 1 < len(tensors) else None
            if view.nbytes != t.nbytes:
                raise CheckpointError(f"{pf.src.path}: tensor {t.name}: {view.nbytes} bytes handed over, "
                                      f"{t.nbytes} expected; the source changed while it was read")
            j, group, k = homes.get(t.name, (None, None, 0))
            if j is None or group is None:   # a whole output tensor (or a skipped one: the source digest only)
                tensor = hashlib.sha256() if j is not None else None
                _feed(view, (source, tensor), out, at[j] if j is not None else None, hashers)
                if tensor is not None:
                    digests[j] = tensor.hexdigest()
                continue
            _feed(view, (source,), out, None, hashers)
            parts = held.setdefault(j, {})
            parts[k] = bytes(view)
            if len(parts) == len(group.parts):   # the last part is in: the fused tensor, rows in order
                data = memoryview(b"".join(parts[n] for n in range(len(group.parts))))
                fused_hash = hashlib.sha256()
                _feed(data, (fused_hash,), out, at[j], hashers, copy_too=False)
                digests[j] = fused_hash.hexdigest()
                del held[j]
        out.finish(pos)
    records = [tensor_record(o, d, pf.out_name, t, pf.src.name) for (t, o), d in zip(pf.tensors, digests)]
    return source.hexdigest(), records, pos - len(out_head)


def _feed(view: memoryview, hashes: tuple, out: "_Files", offset: int | None, pool: ThreadPoolExecutor,
          copy_too: bool = True) -> None:
    """``view`` in cache-sized slices: each slice goes into every one of ``hashes`` (None: skipped), one per
    thread of ``pool``, while this thread writes it at ``offset`` of the output (None: not to the output) and
    appends it to the copy. Measured on the wide checkpoint of benchmarks/merge_speed.py (2 busy cores): a
    merge took 1.5-4.0 s this way against 2.2-6.6 s with one digest on this thread, and whole tensors hashed
    and written at once cost 1.0-1.4 CPU-s more of system time."""
    flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    for i in range(0, flat.nbytes, SLICE_BYTES):
        part = flat[i:i + SLICE_BYTES]
        pending = [pool.submit(h.update, part) for h in hashes if h is not None]
        try:
            if offset is not None:
                out.pwrite(part, offset + i)
            if copy_too:
                out.append_copy(part)
        finally:   # never return (or raise) while a thread still reads the slice
            for p in pending:
                p.result()


class _Files:
    """The output file (written at offsets) and the optional copy of the source (appended); an OSError names
    the output file (``shown``: its final path), never the staging one."""

    def __init__(self, path: Path, shown: Path, copy: Path | None):
        self.shown, self.copy_path = shown, copy
        self.fd = self.copy_fd = -1
        self.started: dict[int, list[int]] = {}   # fd -> [bytes whose disk write was started, bytes written]
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            if copy is not None:
                self.copy_fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            self.close()
            raise OSError(e.errno, e.strerror, str(shown if self.fd < 0 else copy)) from None

    def __enter__(self) -> "_Files":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, out_head: bytes, offset: int, copy_head: bytes) -> None:
        self.pwrite(memoryview(out_head), offset)
        self.append_copy(memoryview(copy_head))

    def pwrite(self, data: memoryview, offset: int) -> None:
        _all(lambda v, done: os.pwrite(self.fd, v, offset + done), data, self.shown)
        self._written(self.fd, offset + data.nbytes)

    def append_copy(self, data: memoryview) -> None:
        if self.copy_fd >= 0:
            _all(lambda v, done: os.write(self.copy_fd, v), data, self.copy_path)
            self._written(self.copy_fd, self.started.get(self.copy_fd, [0, 0])[1] + data.nbytes)

    def _written(self, fd: int, end: int) -> None:
        """Start the disk write of every WRITEBACK_BYTES written (outputs are written in offset order): the
        disk works while the next tensors are hashed, and a later fsync or sync waits only for the rest."""
        mark = self.started.setdefault(fd, [0, 0])
        mark[1] = max(mark[1], end)
        if mark[1] - mark[0] >= WRITEBACK_BYTES:
            files.start_writeback(fd, mark[0], mark[1] - mark[0])
            mark[0] = mark[1]

    def finish(self, size: int) -> None:
        """Check the output's size; the copy is made durable (the MindSpore directory a user keeps)."""
        if os.fstat(self.fd).st_size != size:
            raise CheckpointError(f"{self.shown}: {os.fstat(self.fd).st_size} bytes written, {size} planned; "
                                  "a tensor was not handed over")
        if self.copy_fd >= 0:
            try:
                os.fsync(self.copy_fd)
            except OSError as e:
                raise OSError(e.errno, e.strerror, str(self.copy_path)) from None

    def close(self) -> None:
        for fd in (self.fd, self.copy_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.copy_fd = -1


def _all(call: Callable[[memoryview, int], int], data: memoryview, shown: Path | None) -> None:
    """``call`` until all of ``data`` is written (a write may take less than asked)."""
    done = 0
    try:
        while done < data.nbytes:
            n = call(data[done:], done)
            if n <= 0:
                raise OSError(5, "short write")
            done += n
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(shown)) from None
