"""Reading a per-rank checkpoint (porting/train/run/ckpt_shards.py) into any layout, by byte ranges.

:func:`read_record` checks ``layout.json`` (bounded, every key typed and ranged, every file name a
plain ``rank_<r>.safetensors`` inside the checkpoint directory). :class:`RankFiles` reads byte ranges
of rank files (each header once, validated by ``converters.safetensors_io.read_header``) and counts
every byte it reads. :func:`assemble` cuts one flat range of one parameter's TP-local slice, in the
new layout, out of the pieces of the old one: where both slices are contiguous in the full tensor
(replicated, split along axis 0, or no tensor parallel on either side) by offsets alone; a row-parallel
weight (split along axis 1) whose TP size changed through the pieces' global element indices.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from mindspore import Tensor

from converters import dtypes
from converters.safetensors_io import read_header
from model_zoo import files
from model_zoo.errors import CheckpointError
from porting.train.run.ckpt_shards import (CODES, FORMAT, LAYOUT_FILE, MAX_LAYOUT_BYTES, MAX_WORLD, RANK_FILE, Layout,
                                           ParamSpec, identity, live_layout, needed, owned, piece_bytes, piece_key,
                                           rss, zero_ranges)


def _int(doc: dict, key: str, where: str, low: int, high: int) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise CheckpointError(f"{where}: key '{key}' is {str(v)[:40] if key in doc else 'missing'}, expected an "
                              f"integer in [{low}, {high}]; the checkpoint is damaged, resume from another one")
    return v


def _param(raw: Any, where: str) -> ParamSpec:
    ok = (isinstance(raw, dict) and isinstance(raw.get("name"), str) and 0 < len(raw["name"]) < 512
          and isinstance(raw.get("shape"), list) and len(raw["shape"]) <= 8
          and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < (1 << 40) for d in raw["shape"])
          and raw.get("dtype") in CODES
          and (raw.get("axis") is None or (isinstance(raw["axis"], int) and 0 <= raw["axis"] < len(raw["shape"]))))
    if not ok:
        raise CheckpointError(f"{where}: entry {str(raw)[:80]} is not {{name, shape, axis, dtype}}; the checkpoint "
                              "is damaged, resume from another one")
    return ParamSpec(raw["name"], tuple(raw["shape"]), raw["axis"], raw["dtype"])


def _layout(doc: Any, where: str) -> Layout:
    if not isinstance(doc, dict):
        raise CheckpointError(f"{where}: key 'layout' is not an object; the checkpoint is damaged")
    world, tp = _int(doc, "world", where, 1, MAX_WORLD), _int(doc, "tp", where, 1, MAX_WORLD)
    zero = _int(doc, "zero", where, 0, 2)
    if world % tp or not isinstance(doc.get("masters"), bool) or not isinstance(doc.get("params"), list) \
            or not isinstance(doc.get("buckets"), list) or len(doc["params"]) > 100_000:
        raise CheckpointError(f"{where}: layout world {world}, tp {tp}, masters, params or buckets malformed; the "
                              "checkpoint is damaged, resume from another one")
    params = tuple(_param(p, where) for p in doc["params"])
    for p in params:
        if p.axis is not None and p.shape[p.axis] % tp:
            raise CheckpointError(f"{where}: {p.name} shape {list(p.shape)} does not split into tp {tp} on axis "
                                  f"{p.axis}; the checkpoint is damaged")
    buckets, seen = [], []
    for b in doc["buckets"] if zero else []:
        idx = b.get("params") if isinstance(b, dict) else None
        if not isinstance(idx, list) or not all(isinstance(i, int) and 0 <= i < len(params) for i in idx):
            raise CheckpointError(f"{where}: bucket {str(b)[:80]} names parameters outside the list; damaged")
        n = sum(params[i].local_numel(tp) for i in idx)
        padded = _int(b, "padded", where, n, n + world)
        if padded % (world // tp):
            raise CheckpointError(f"{where}: bucket padded {padded} is not a multiple of dp {world // tp}; damaged")
        buckets.append((tuple(idx), padded))
        seen += idx
    if zero and sorted(seen) != list(range(len(params))):
        raise CheckpointError(f"{where}: the buckets do not hold every parameter exactly once; damaged")
    return Layout(world, tp, zero, doc["masters"], params, tuple(buckets))


def read_record(ckdir: Path) -> tuple[Layout, dict, dict[str, dict]]:
    """(layout, identity, files) of ``ckdir/layout.json``; every defect is one line naming the key."""
    path = ckdir / LAYOUT_FILE
    where = str(path)
    doc = files.read_json_object(path, what="checkpoint layout record", max_bytes=MAX_LAYOUT_BYTES,
                                 error=CheckpointError)
    if doc.get("format") != FORMAT:
        raise CheckpointError(f"{where}: key 'format' is {str(doc.get('format'))[:20]}, expected {FORMAT}; written "
                              "by another port version")
    layout = _layout(doc.get("layout"), where)
    ident = doc.get("identity")
    table = doc.get("files")
    if not isinstance(ident, dict) or not isinstance(table, dict):
        raise CheckpointError(f"{where}: keys 'identity' and 'files' must be objects; the checkpoint is damaged")
    for name, entry in table.items():
        m = RANK_FILE.match(name) if isinstance(name, str) else None
        if m is None or not isinstance(entry, dict) or entry.get("rank") != int(m.group(1)):
            raise CheckpointError(f"{where}: key 'files' names {str(name)[:80]!r}, expected rank_<5 digits>"
                                  ".safetensors (a file inside the checkpoint directory) with its rank; refused")
        _int(entry, "bytes", where, 8, 1 << 50)
        if not (isinstance(entry.get("sha256"), str) and len(entry["sha256"]) == 64):
            raise CheckpointError(f"{where}: {name}: key 'sha256' malformed; the checkpoint is damaged")
    want = {f"rank_{r:05d}.safetensors" for r in range(layout.world) if owned(layout, r)}
    if set(table) != want:
        raise CheckpointError(f"{where}: key 'files' lists {sorted(table)[:4]}, the layout needs {sorted(want)[:4]}"
                              "; the checkpoint is damaged, resume from another one")
    return layout, ident, table


class RankFiles:
    """Byte-range reads of a checkpoint's rank files, counted in ``bytes_read``."""

    def __init__(self, ckdir: Path, table: dict[str, dict]):
        self.dir, self.table = ckdir, table
        self.bytes_read = 0      # everything read, headers included
        self.header_bytes = 0
        self._heads: dict[str, dict] = {}
        self._fds: dict[str, int] = {}

    def _open(self, name: str) -> dict:
        if name not in self._heads:
            path = self.dir / name
            try:
                size = path.stat().st_size
            except OSError as e:
                raise CheckpointError(f"{path}: cannot read ({e.strerror}); the checkpoint is incomplete") from None
            if size != self.table[name]["bytes"]:
                raise CheckpointError(f"{path}: {size} bytes, the layout record says {self.table[name]['bytes']}; "
                                      "the file is truncated or was changed, resume from another checkpoint")
            head = read_header(path)
            self.bytes_read += head.header_bytes
            self.header_bytes += head.header_bytes
            self._heads[name] = head.by_name()
            self._fds[name] = os.open(path, os.O_RDONLY)
        return self._heads[name]

    def read(self, name: str, key: str, code: str, lo: int, hi: int) -> np.ndarray:
        """Elements [lo, hi) of the piece ``key`` of file ``name``, as float32."""

        info = self._open(name).get(key)
        size = CODES[code]
        if info is None or info.dtype != code or info.nbytes % size or not 0 <= lo <= hi <= info.nbytes // size:
            raise CheckpointError(f"{self.dir / name}: tensor {key} is {'missing' if info is None else info.dtype + ' ' + str(list(info.shape))}"
                                  f", the layout record needs {code} with elements [{lo}, {hi}); the checkpoint is "
                                  "damaged or mismatched, resume from another one")
        begin, n = info.begin + lo * size, (hi - lo) * size
        raw = os.pread(self._fds[name], n, begin)
        if len(raw) != n:
            raise CheckpointError(f"{self.dir / name}: short read of {key}; the file is truncated")
        self.bytes_read += n
        return dtypes.to_numpy_f32(code, raw, (hi - lo,))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _span(spec: ParamSpec, tp: int, t: int, a: int, b: int) -> tuple[int, int] | None:
    """Global flat range of local elements [a, b) of TP slice ``t``, or None where it is not contiguous."""
    if spec.axis is None or tp == 1:
        return a, b
    if spec.axis == 0:
        n = spec.local_numel(tp)
        return t * n + a, t * n + b
    return None


def _global_index(spec: ParamSpec, tp: int, t: int, a: int, b: int) -> np.ndarray:
    if spec.axis is None or tp == 1:
        return np.arange(a, b, dtype=np.int64)
    local = spec.local_shape(tp)
    idx = list(np.unravel_index(np.arange(a, b, dtype=np.int64), local))
    idx[spec.axis] = idx[spec.axis] + t * local[spec.axis]
    return np.ravel_multi_index(idx, spec.shape)


class Source:
    """An old checkpoint's pieces by (kind, parameter name): where each one is stored."""

    def __init__(self, ckdir: Path, layout: Layout, table: dict[str, dict]):
        self.layout, self.files = layout, RankFiles(ckdir, table)
        self.where: dict[tuple[str, str], list[tuple[str, int, int, int]]] = {}
        for r in range(layout.world):
            for kind, i, a, b in owned(layout, r):
                self.where.setdefault((kind, layout.params[i].name), []).append(
                    (f"rank_{r:05d}.safetensors", r % layout.tp, a, b))
        self.specs = {p.name: p for p in layout.params}

    def assemble(self, kind: str, name: str, tp: int, t: int, a: int, b: int, axis: int | None = None) -> np.ndarray:
        """Local elements [a, b) of TP slice ``t`` of ``tp`` (split along ``axis``) of parameter ``name``'s
        state ``kind``, float32."""
        spec, old = self.specs[name], self.layout
        new = dataclasses.replace(spec, axis=axis if tp > 1 else None)
        code = spec.dtype if kind == "param" else "F32"
        out = np.empty(b - a, np.float32)
        filled = 0
        want = _span(new, tp, t, a, b)
        g_want = None
        for fname, t0, a0, b0 in self.where.get((kind, name), []):
            if spec.axis is None and t0 != t % old.tp:
                continue   # replicated: every TP rank stored a copy; one is read
            key = piece_key(kind, name, t0, a0, b0)
            have = _span(spec, old.tp, t0, a0, b0)
            if want is not None and have is not None:
                lo, hi = max(want[0], have[0]), min(want[1], have[1])
                if lo < hi:
                    out[lo - want[0]:hi - want[0]] = self.files.read(fname, key, code, lo - have[0], hi - have[0])
                    filled += hi - lo
                continue
            g_want = _global_index(new, tp, t, a, b) if g_want is None else g_want
            _, iw, ih = np.intersect1d(g_want, _global_index(spec, old.tp, t0, a0, b0), assume_unique=True,
                                       return_indices=True)
            if len(ih):
                lo = int(ih.min())
                out[iw] = self.files.read(fname, key, code, lo, int(ih.max()) + 1)[ih - lo]
                filled += len(iw)
        if filled != b - a:
            raise CheckpointError(f"{self.files.dir}: {kind} of {name} covers {filled} of the {b - a} elements this "
                                  "layout needs; the checkpoint is incomplete, resume from another one")
        return out

    def full(self, kind: str, name: str) -> np.ndarray:
        """The whole (unsharded) tensor, float32."""
        spec = self.specs[name]
        return self.assemble(kind, name, 1, 0, 0, spec.local_numel(1)).reshape(spec.shape)


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
    identity record; ``now``: this run's, :func:`porting.train.run.ckpt_shards.identity_of`)."""
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


def restore(trainer, ckdir: Path) -> int:
    """Fill a running Trainer's weights and optimizer state from ``ckdir`` in its own layout (any saved
    layout); returns the bytes this rank read (headers included)."""


    src, saved = open_checkpoint(ckdir)
    new = live_layout(trainer)
    check_identity(ckdir, src.layout, saved, new, identity(trainer))
    tp, t, d = new.tp, trainer.grid.tp_rank, trainer.grid.dp_rank
    opt = trainer.optimizer
    states = {"master": opt.masters, "adam_m": opt.m, "adam_v": opt.v}
    try:
        for i, p in enumerate(trainer.model.trainable_params()):
            spec = new.params[i]
            arr = src.assemble("param", spec.name, tp, t, 0, spec.local_numel(tp), spec.axis)
            arr = arr.reshape(spec.local_shape(tp))
            p.set_data(Tensor(arr).astype(p.dtype))
        ranges = list(zero_ranges(new, d)) if new.zero else []
        for kind in new.kinds[1:]:
            if new.zero:   # one bucket's shard in host memory at a time; the padding stays zero
                for k, (_, padded) in enumerate(new.buckets):
                    buf = np.zeros(padded // new.dp, np.float32)
                    for _, i, a, b, pos in (x for x in ranges if x[0] == k):
                        spec = new.params[i]
                        buf[pos:pos + b - a] = src.assemble(kind, spec.name, tp, t, a, b, spec.axis)
                    states[kind][k].set_data(Tensor(buf))
                continue
            for i, spec in enumerate(new.params):
                arr = src.assemble(kind, spec.name, tp, t, 0, spec.local_numel(tp), spec.axis)
                states[kind][i].set_data(Tensor(arr.reshape(spec.local_shape(tp))))
    finally:
        src.files.close()
    shard = piece_bytes(new, needed(new, trainer.rank))
    mem = rss()
    peak = f"; peak host RSS since start {mem[1]} bytes" if mem else ""
    if (src.layout.world, src.layout.tp, src.layout.zero) != (new.world, new.tp, new.zero):
        peak += "; the layout changed: every piece was re-cut exactly for this one (same model, seed, recipe)"
    trainer.log.info(f"resume read {src.files.bytes_read} bytes of {ckdir} (this rank's shard {shard} bytes, "
                     f"ratio {src.files.bytes_read / max(shard, 1):.3f}); saved layout world {src.layout.world} tp "
                     f"{src.layout.tp} zero {src.layout.zero}, this run world {new.world} tp {new.tp} zero {new.zero}{peak}")
    return src.files.bytes_read


def full_state(ckdir: Path) -> dict[str, np.ndarray]:
    """Every state tensor whole, as one device holds it: ``<param>`` (float32 view of its dtype),
    ``master.<param>``, ``adam_m.<param>``, ``adam_v.<param>`` (for tests and small models: all in memory)."""
    src, _ = open_checkpoint(ckdir)
    try:
        return {(p.name if kind == "param" else f"{kind}.{p.name}"): src.full(kind, p.name)
                for kind in src.layout.kinds for p in src.layout.params}
    finally:
        src.files.close()
