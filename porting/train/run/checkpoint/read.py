"""Reading a per-rank checkpoint (porting/train/run/checkpoint/format.py) into any layout, by byte ranges.

:func:`read_record` (porting/train/run/checkpoint/record.py) checks and bounds ``layout.json``. :class:`RankFiles`
reads byte ranges of rank files (opened without following a symbolic link; each header once, validated
by ``converters.safetensors_io.read_header``), checks every chunk it reads against the sha256 the record
holds for it before any byte is used, and counts every byte it reads. :func:`Source.assemble` cuts one
flat range of one parameter's TP-local slice, in the new layout, out of the pieces of the old one by
arithmetic: a TP slice of a tensor split along axis ``k`` is, row by row of the full tensor (a row: the
elements of ``shape[k:]``), one run of ``row / tp`` elements at offset ``t * row / tp``; a piece is a flat
range of such runs, so the overlap of a stored piece and a wanted range is at most four partial rows and
two blocks of whole rows, each copied as one strided NumPy assignment (no per-element index arrays).
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from numpy.lib.stride_tricks import as_strided

from converters import dtypes
from converters.safetensors_io import read_header
from model_zoo.errors import CheckpointError
from porting.train.run.checkpoint.progress import Progress, group_of
from porting.train.run.checkpoint.record import read_record
from porting.train.run.checkpoint.format import (CODES, Layout, ParamSpec, identity, live_layout, needed, owned_ranges,
                                           piece_bytes, piece_key, rss, zero_ranges)

__all__ = ["read_record", "open_checkpoint", "restore", "restore_weights", "full_state", "check_same_run", "Source",
           "RankFiles", "NATIVE"]
_HASHERS = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1))   # hashlib releases the GIL on large inputs
NATIVE = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}   # own dtype (bf16: its bits)


def _sha(views: list[memoryview]) -> str:
    h = hashlib.sha256()
    for v in views:
        h.update(v)
    return h.hexdigest()


def _segments(bufs: list[memoryview], lo: int, a: int, b: int) -> list[memoryview]:
    """The views of bytes [a, b) of a read at file offset ``lo`` that filled ``bufs`` in turn."""
    out = []
    for v in bufs:
        if a < lo + v.nbytes and b > lo:
            out.append(v[max(a - lo, 0):min(b - lo, v.nbytes)])
        lo += v.nbytes
    return out


class RankFiles:
    """Byte-range reads of a checkpoint's rank files, each chunk checked against its recorded sha256 before
    use. ``bytes_read``: the bytes served (headers included); ``check_bytes``: the bytes read only to check a
    chunk that a read touched in part (read again when a later read uses them); ``hashed_bytes``: every byte
    checked (each chunk once)."""

    def __init__(self, ckdir: Path, table: dict[str, dict], verify: bool = True):
        self.dir, self.table, self.verify = ckdir, table, verify
        self.bytes_read = self.header_bytes = self.check_bytes = self.hashed_bytes = 0
        self._heads, self._fds, self._good = {}, {}, {}   # by file: header, descriptor, chunks checked
        self._lock = threading.RLock()   # readers on several threads (reshard): one open per file, exact counts
        self._tls = threading.local()    # one read buffer per thread (_fetch)

    def _fd(self, name: str) -> int:
        path = self.dir / name
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise CheckpointError(f"{path}: is a symbolic link; a checkpoint's rank files are its own, refused "
                                      "(copy the file itself into the checkpoint)") from None
            raise CheckpointError(f"{path}: cannot read ({e.strerror}); the checkpoint is incomplete") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != self.table[name]["bytes"]:
            os.close(fd)
            raise CheckpointError(f"{path}: {info.st_size} bytes, the layout record says {self.table[name]['bytes']}"
                                  "; the file is truncated or was changed, resume from another checkpoint")
        return fd

    def _open(self, name: str) -> dict:
        with self._lock:
            return self._open_locked(name)

    def _open_locked(self, name: str) -> dict:
        if name not in self._heads:
            fd = self._fd(name)
            self._fds[name], self._good[name] = fd, set()
            entry = self.table[name]
            if self.verify and "chunks" not in entry:   # a record from before chunk digests: the whole file
                self._check_whole(name, fd, entry)
            head = read_header(self.dir / name)
            if os.stat(self.dir / name).st_ino != os.fstat(fd).st_ino:
                raise CheckpointError(f"{self.dir / name}: was replaced while it was read; resume again")
            self._fetch(name, 0, head.header_bytes)   # the header's own bytes are checked too
            self.bytes_read += head.header_bytes
            self.header_bytes += head.header_bytes
            self._heads[name] = head.by_name()
        return self._heads[name]

    def _check_whole(self, name: str, fd: int, entry: dict) -> None:
        h, off = hashlib.sha256(), 0
        while off < entry["bytes"]:
            block = os.pread(fd, min(16 << 20, entry["bytes"] - off), off)
            if not block:
                break
            h.update(block)
            off += len(block)
        self.check_bytes += off
        self.hashed_bytes += off
        if h.hexdigest() != entry["sha256"]:
            raise CheckpointError(f"{self.dir / name}: its sha256 differs from the one layout.json records; the file "
                                  "was changed or damaged after it was written, resume from another checkpoint")

    def _fetch(self, name: str, begin: int, end: int, slot: Any = None, into: memoryview | None = None) -> memoryview:
        """Bytes [begin, end) of ``name``, every chunk they touch checked (once per file), in ``slot.buf``; with
        ``into`` (end - begin bytes), read straight there (the rest of the chunks around it into ``slot.buf``)."""
        fd, entry = self._fds[name], self.table[name]
        if end <= begin:
            return memoryview(b"")
        good = self._good[name]
        chunk = entry.get("chunk_bytes", 0)
        todo = [] if not (self.verify and chunk) else \
            [k for k in range(begin // chunk, (end - 1) // chunk + 1) if k not in good]
        lo, hi = (todo[0] * chunk, min(entry["bytes"], (todo[-1] + 1) * chunk)) if todo else (begin, end)
        lo, hi = min(lo, begin), max(hi, end)
        # this thread's buffer (or the caller's), reused (a fresh one faults every 4 KiB): valid until its next read
        if len(buf := getattr(slot := slot or self._tls, "buf", b"")) < hi - lo:
            buf = slot.buf = bytearray(max(hi - lo, len(buf) * 3 // 2))
        view = memoryview(buf)[:hi - lo]
        bufs = [view] if into is None else [view[:begin - lo], into, view[begin - lo:hi - end + begin - lo]]
        if os.preadv(fd, bufs, lo) != hi - lo:
            raise CheckpointError(f"{self.dir / name}: short read at byte {lo}; the file is truncated")
        if todo:
            parts = [_segments(bufs, lo, k * chunk, min(entry["bytes"], (k + 1) * chunk)) for k in todo]
            sums = list(_HASHERS.map(_sha, parts)) if len(parts) > 1 else [_sha(parts[0])]
            for k, got in zip(todo, sums):
                if got != entry["chunks"][k]:
                    raise CheckpointError(
                        f"{self.dir / name}: bytes {k * chunk}-{min(entry['bytes'], (k + 1) * chunk)} do not match "
                        f"the sha256 layout.json records for chunk {k}; the file was changed or damaged after it "
                        "was written, resume from another checkpoint")
            with self._lock:
                good.update(todo)
                self.check_bytes += (hi - lo) - (end - begin)
                self.hashed_bytes += sum(len(x) for p in parts for x in p)
        return view[begin - lo:end - lo] if into is None else into

    def read(self, name: str, key: str, code: str, lo: int, hi: int, native: bool = False, slot: Any = None,
             into: memoryview | None = None) -> np.ndarray:
        """Elements [lo, hi) of the piece ``key`` of file ``name``, as float32 (``native``: in their own dtype,
        :data:`NATIVE`); valid until this thread's next read (or ``slot``'s: an object whose ``buf`` is used).
        ``into``: a buffer of their bytes to read them into, without a copy (with ``native``)."""
        info = self._open(name).get(key)
        size = CODES[code]
        if info is None or info.dtype != code or info.nbytes % size or not 0 <= lo <= hi <= info.nbytes // size:
            found = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
            raise CheckpointError(f"{self.dir / name}: tensor {key} is {found}, the layout record needs {code} with "
                                  f"elements [{lo}, {hi}); the checkpoint is damaged or mismatched, resume from "
                                  "another one")
        if into is not None and (not native or into.nbytes != (hi - lo) * size):
            raise ValueError(f"read into {into.nbytes} bytes: {(hi - lo) * size} native bytes expected")
        raw = self._fetch(name, info.begin + lo * size, info.begin + hi * size, slot, into)
        with self._lock:
            self.bytes_read += len(raw)
        if code == "F32" or native:
            return np.frombuffer(raw, NATIVE[code])
        return dtypes.to_numpy_f32(code, raw, (hi - lo,))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _run(spec: ParamSpec, axis: int | None, tp: int, t: int, row: int) -> tuple[int, int]:
    """(run length, in-row offset) of TP slice ``t`` of ``tp`` split along ``axis`` in rows of ``row``."""
    if axis is None or tp == 1:
        return row, 0
    return row // tp, t * (row // tp)


def _blocks(have: tuple[int, int, int, int], want: tuple[int, int, int, int]) -> Iterator[tuple[int, int, int, int]]:
    """(rows, n, start in ``have``'s local range, start in ``want``'s) of every block the two share. Each side is
    (run length L, in-row offset, a, b): its local element l sits in row l // L at in-row offset + l % L."""
    (l0, f0, a0, b0), (l1, f1, a1, b1) = have, want
    c0, c1 = max(f0, f1), min(f0 + l0, f1 + l1)
    lo, hi = max(a0 // l0, a1 // l1), min((b0 - 1) // l0, (b1 - 1) // l1)
    if c0 >= c1 or lo > hi:
        return
    prev = lo
    for o in sorted({o for o in (a0 // l0, (b0 - 1) // l0, a1 // l1, (b1 - 1) // l1) if lo <= o <= hi}):
        if prev < o:   # whole rows between the partial ones
            yield o - prev, c1 - c0, prev * l0 + c0 - f0, prev * l1 + c0 - f1
        s = max(c0, a0 - o * l0 + f0, a1 - o * l1 + f1)
        e = min(c1, b0 - o * l0 + f0, b1 - o * l1 + f1)
        if s < e:
            yield 1, e - s, o * l0 + s - f0, o * l1 + s - f1
        prev = o + 1
    if prev <= hi:
        yield hi + 1 - prev, c1 - c0, prev * l0 + c0 - f0, prev * l1 + c0 - f1


def _copy(dst: np.ndarray, d: int, src: np.ndarray, s: int, rows: int, n: int, ls: int, ld: int) -> None:
    if rows == 1:
        dst[d:d + n] = src[s:s + n]
        return
    isz = src.itemsize
    as_strided(dst[d:], (rows, n), (ld * isz, isz), writeable=True)[...] = \
        as_strided(src[s:], (rows, n), (ls * isz, isz), writeable=False)


class Source:
    """An old checkpoint's pieces by (kind, parameter name): where each one is stored."""

    def __init__(self, ckdir: Path, layout: Layout, table: dict[str, dict], verify: bool = True):
        self.layout, self.files = layout, RankFiles(ckdir, table, verify)
        self.where: dict[tuple[str, str], list[tuple[str, int, int, int]]] = {}
        for d, i, a, b in owned_ranges(layout):
            for t in range(layout.tp):
                for kind in layout.kinds:
                    self.where.setdefault((kind, layout.params[i].name), []).append(
                        (f"rank_{d * layout.tp + t:05d}.safetensors", t, a, b))
        self.specs = {p.name: p for p in layout.params}

    def assemble(self, kind: str, name: str, tp: int, t: int, a: int, b: int, axis: int | None = None,
                 out: np.ndarray | None = None, native: bool = False) -> np.ndarray:
        """Local elements [a, b) of TP slice ``t`` of ``tp`` (split along ``axis``) of parameter ``name``'s state
        ``kind``, float32 (``native``: its own dtype); into ``out`` (that dtype, >= b - a elements) when given."""
        spec, old = self.specs[name], self.layout
        new_axis = axis if tp > 1 else None
        if new_axis is not None and old.tp > 1 and spec.axis not in (None, new_axis):
            raise CheckpointError(f"{self.files.dir}: {name} is split along axis {spec.axis} in the checkpoint, "
                                  f"along {new_axis} in this layout; resume with the model it was written with")
        ax = new_axis if new_axis is not None else (spec.axis if old.tp > 1 else None)
        row = math.prod(spec.shape[ax:]) if ax is not None else spec.local_numel(1)
        want = (*_run(spec, new_axis, tp, t, row), a, b)
        code = spec.dtype if kind == "param" else "F32"
        out = np.empty(b - a, NATIVE[code] if native else np.float32) if out is None else out[:b - a]
        filled = 0
        for fname, t0, a0, b0 in self.where.get((kind, name), []):
            if spec.axis is None and t0 != t % old.tp:
                continue   # replicated: every TP rank stored a copy; one is read
            have = (*_run(spec, spec.axis, old.tp, t0, row), a0, b0)
            blocks = list(_blocks(have, want))
            if not blocks:
                continue
            lo = min(s for _, _, s, _ in blocks)
            hi = max(s + (r - 1) * have[0] + n for r, n, s, _ in blocks)
            piece = self.files.read(fname, piece_key(kind, name, t0, a0, b0), code, lo - a0, hi - a0, native)
            for r, n, s, w in blocks:
                _copy(out, w - a, piece, s - lo, r, n, have[0], want[0])
                filled += r * n
        if filled != b - a:
            raise CheckpointError(f"{self.files.dir}: {kind} of {name} covers {filled} of the {b - a} elements this "
                                  "layout needs; the checkpoint is incomplete, resume from another one")
        return out

    def full(self, kind: str, name: str, out: np.ndarray | None = None, native: bool = False) -> np.ndarray:
        """The whole (unsharded) tensor, float32 (``native``, ``out``: as :meth:`assemble`)."""
        spec = self.specs[name]
        return self.assemble(kind, name, 1, 0, 0, spec.local_numel(1), None, out, native).reshape(spec.shape)


def open_checkpoint(ckdir: Path) -> tuple[Source, dict]:
    """The checkpoint's pieces and its identity record."""
    layout, ident, table = read_record(ckdir)
    return Source(ckdir, layout, table), ident


def _differs(a: Any, b: Any, path: str = "") -> str | None:
    """The first key path where two JSON values differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _differs(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    return None if a == b else f"{path} (checkpoint {str(a)[:40]}, this run {str(b)[:40]})"


SAME_RUN_FIX = ("resume with the recipe and model the checkpoint was written with (only cluster, parallel, "
                "execution, batching.micro_batch_size/grad_accum_steps with the same global batch, "
                "schedule.max_steps, checkpointing, logging and nonfinite may change)")


def check_same_run(ckdir: Path, saved: dict, now: dict) -> None:
    """Refuse in one line a checkpoint of another model, seed, global batch or recipe (``saved``: its
    identity record; ``now``: this run's, :func:`porting.train.run.checkpoint.format.identity_of`)."""
    if saved.get("model_config_sha256") != now["model_config_sha256"]:
        raise CheckpointError(f"{ckdir}: is a checkpoint of another model (config.json differs); {SAME_RUN_FIX}")
    what = _differs({k: saved.get(k) for k in ("seed", "global_batch", "recipe")},
                    {k: now[k] for k in ("seed", "global_batch", "recipe")})
    if what:
        raise CheckpointError(f"{ckdir}: cannot continue exactly: {what}; {SAME_RUN_FIX}")


def check_identity(ckdir: Path, old: Layout, saved: dict, new: Layout, now: dict) -> None:
    """Refuse in one line what cannot continue exactly: another model, seed, global batch or recipe."""
    fix = SAME_RUN_FIX
    a = [(p.name, p.shape, p.dtype) for p in old.params]
    b = [(p.name, p.shape, p.dtype) for p in new.params]
    if a != b:
        first = next((f"{x} vs {y}" for x, y in zip(a, b) if x != y), f"{len(a)} vs {len(b)} tensors")
        raise CheckpointError(f"{ckdir}: is a checkpoint of another model ({first}); {fix}")
    check_same_run(ckdir, saved, now)
    if old.masters != new.masters:
        raise CheckpointError(f"{ckdir}: fp32 master weights {'present' if old.masters else 'absent'} in the "
                              f"checkpoint, {'needed' if new.masters else 'not kept'} by this run; {fix}")


def restore(trainer, ckdir: Path, opened: tuple[Source, dict] | None = None) -> int:
    """Fill a running Trainer's weights and optimizer state from ``ckdir`` in its own layout (any saved
    layout); returns the bytes this rank read (headers included). ``opened``: what :func:`restore_weights`
    returned when the model was built from this checkpoint: the weights are in place, so only the optimizer
    state is read, through the same open files (each header read and each chunk checked once, every byte of
    the rank's share read once). One log line per parameter group, one summary line."""
    src, saved = opened if opened is not None else open_checkpoint(ckdir)
    if src.files.dir != ckdir:
        raise ValueError(f"restore: the weights came from {src.files.dir}, not {ckdir}")
    t0 = time.perf_counter()
    try:
        new = live_layout(trainer)
        check_identity(ckdir, src.layout, saved, new, identity(trainer))
        bar = Progress(trainer.log.info, f"resume {ckdir.name} param", lambda: src.files.bytes_read)
        if opened is None:
            _fill(trainer.model.trainable_params(), src, new, trainer.grid.tp_rank, bar)
        _fill_optimizer(trainer, src, new, bar)
    finally:
        src.files.close()
    shard = piece_bytes(new, needed(new, trainer.rank))
    mem = rss()
    peak = f"; peak host RSS since start {mem[1]} bytes" if mem else ""
    if (src.layout.world, src.layout.tp, src.layout.zero) != (new.world, new.tp, new.zero):
        peak += "; the layout changed: every piece was re-cut exactly for this one (same model, seed, recipe)"
    f = src.files
    when = "the weights while the model was built, then the optimizer state" if opened is not None else \
        "weights and optimizer state"
    trainer.log.info(f"resume read {f.bytes_read} bytes of {ckdir} ({when}; {f.header_bytes} of them file headers; "
                     f"this rank's shard {shard} bytes, ratio {f.bytes_read / max(shard, 1):.3f}) in "
                     f"{time.perf_counter() - t0:.1f} s; {f.hashed_bytes} bytes checked against their chunks' sha256 "
                     f"({f.check_bytes} read only for the check); saved layout world {src.layout.world} tp "
                     f"{src.layout.tp} zero {src.layout.zero}, this run world {new.world} tp {new.tp} zero "
                     f"{new.zero}{peak}")
    return f.bytes_read


def _fill(params, src: Source, new: Layout, t: int, bar: Progress) -> None:
    """Every weight of this rank's tensor-parallel slice ``t`` from ``src``, re-cut for ``new``."""
    from mindspore import Tensor  # deferred: the launcher checks a checkpoint without loading MindSpore

    for i, p in enumerate(params):
        spec = new.params[i]
        bar.step(group_of(spec.name))
        arr = src.assemble("param", spec.name, new.tp, t, 0, spec.local_numel(new.tp), spec.axis)
        p.set_data(Tensor(arr.reshape(spec.local_shape(new.tp))).astype(p.dtype))
    bar.done()


def _fill_optimizer(trainer, src: Source, new: Layout, bar: Progress) -> None:
    """This rank's masters, m and v (its ZeRO share, or every tensor of its slice) from ``src``."""
    from mindspore import Tensor  # deferred: the launcher checks a checkpoint without loading MindSpore

    tp, t, d, opt = new.tp, trainer.grid.tp_rank, trainer.grid.dp_rank, trainer.optimizer
    states = {"master": opt.masters, "adam_m": opt.m, "adam_v": opt.v}
    ranges = list(zero_ranges(new, d)) if new.zero else []
    for kind in new.kinds[1:]:
        bar.what = f"resume {src.files.dir.name} {kind}"
        if new.zero:   # one bucket's shard in host memory at a time; the padding stays zero
            for k, (_, padded) in enumerate(new.buckets):
                bar.step(f"bucket {k + 1} of {len(new.buckets)}")
                buf = np.zeros(padded // new.dp, np.float32)
                for _, i, a, b, pos in (x for x in ranges if x[0] == k):
                    spec = new.params[i]
                    buf[pos:pos + b - a] = src.assemble(kind, spec.name, tp, t, a, b, spec.axis)
                states[kind][k].set_data(Tensor(buf))
            bar.done()
            continue
        for i, spec in enumerate(new.params):
            bar.step(group_of(spec.name))
            arr = src.assemble(kind, spec.name, tp, t, 0, spec.local_numel(tp), spec.axis)
            states[kind][i].set_data(Tensor(arr.reshape(spec.local_shape(tp))))
        bar.done()


def restore_weights(model, ckdir: Path, tp: int, tp_rank: int, log: Callable[[str], None] | None = None
                    ) -> tuple[Source, dict]:
    """A resume's weights straight from its per-rank checkpoint into a model built without them
    (model_zoo.llama ``build(defer_init=True)``): the HF checkpoint is not read at all (at 13B TP 8, 3.3 GB
    per rank from the shared filesystem). Returns the checkpoint still open: :func:`restore` reads the
    optimizer state through it and checks the identity, and does not read the weights again."""
    from mindspore import Tensor  # deferred: the launcher checks a checkpoint without loading MindSpore
    from model_zoo.parallel import shard_layout  # deferred: imports the parallel cells

    src, ident = open_checkpoint(ckdir)
    axes = shard_layout(model) if tp > 1 else {}
    try:
        bar = Progress(log, f"resume {ckdir.name} weights", lambda: src.files.bytes_read)
        for p in model.trainable_params():
            axis = axes.get(p.name)
            full = tuple(n * tp if i == axis else n for i, n in enumerate(p.shape))
            spec = src.specs.get(p.name)
            if spec is None or spec.shape != full:
                found = "missing" if spec is None else f"shape {list(spec.shape)}"
                raise CheckpointError(f"{ckdir}: is a checkpoint of another model ({p.name}: {found}, this model "
                                      f"{list(full)}); {SAME_RUN_FIX}")
            bar.step(group_of(p.name))
            arr = src.assemble("param", p.name, tp, tp_rank, 0, math.prod(p.shape), axis)
            p.set_data(Tensor(arr.reshape(p.shape)).astype(p.dtype))
        bar.done()
    except BaseException:
        src.files.close()
        raise
    return src, ident


def full_state(ckdir: Path) -> dict[str, np.ndarray]:
    """Every state tensor whole, float32: ``<param>``, ``master.<param>``, ``adam_m.<param>``, ``adam_v.<param>``."""
    src, _ = open_checkpoint(ckdir)
    try:
        return {(p.name if kind == "param" else f"{kind}.{p.name}"): src.full(kind, p.name)
                for kind in src.layout.kinds for p in src.layout.params}
    finally:
        src.files.close()
