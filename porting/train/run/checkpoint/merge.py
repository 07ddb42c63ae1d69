"""Offline work on per-rank checkpoints (porting/train/run/checkpoint/format.py), outside any training job.

- :class:`Whole`: each parameter's state whole, in its own dtype, one tensor in host memory at a time: what
  ``port ckpt merge`` and the HF export (porting/train/run/checkpoint/export.py) stream through the converters'
  name map into the HF file in one pass (converters/streamed.py).
- :func:`write_weights`: the full model weights as one MindSpore-named safetensors file (the zoo's names,
  which are MindFormers' Llama names: converters/names.py; what ``port convert --ms`` reads and
  ``mindspore.load_checkpoint(..., format="safetensors")`` loads): ``port ckpt merge --ms DIR`` (with
  ``--out`` too, the export writes the same file in its pass).
- :func:`write_optimizer`: the optimizer state beside it (``optimizer.safetensors``: ``adam_m.<name>``,
  ``adam_v.<name>``, ``master.<name>`` full fp32 tensors, and ``optimizer.json``), for a user who resumes
  elsewhere. ``adam_m.``/``adam_v.`` are the prefixes MindSpore's own AdamWeightDecay gives its moments
  (mindspore/nn/optim/adam.py ``clone(prefix="adam_m")``).
- :func:`reshard`: the same state cut for another layout (DP, TP, ZeRO stage of another recipe),
  written as a complete checkpoint directory that ``port train --resume`` continues exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from converters.atomic import check_free_space
from converters.safetensors_io import OutTensor, encode_header, write_all
from model_zoo.errors import CheckpointError
from porting.train.run.checkpoint.save import STATE_FILE, TrainState
from porting.train.run.checkpoint.progress import Progress, group_of
from porting.train.run.checkpoint.read import NATIVE, Source, open_checkpoint
from porting.train.run.checkpoint.format import CODES, Layout, ParamSpec, owned, piece_key, write_rank, write_record

if TYPE_CHECKING:   # hints only: a merge and an export load no recipe schema (pydantic, 0.13 CPU-s)
    from porting.train.recipe.schema import Recipe

Log = Callable[[str], None] | None
OPTIMIZER_FILE, OPTIMIZER_RECORD = "optimizer.safetensors", "optimizer.json"


def config_of(ckdir: Path, ident: dict) -> dict:
    """The model's config.json, as the checkpoint's identity record holds it."""
    cfg = ident.get("model_config")
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{ckdir / 'layout.json'}: key 'identity.model_config' is missing; the checkpoint "
                              "is damaged")
    return cfg


class _Slot:
    """One tensor's buffers, reused (a fresh one faults every page in again): ``out`` for the tensor, ``buf``
    for the rest of the rank-file chunks a read checks around it (porting/train/run/checkpoint/read.py)."""

    def __init__(self):
        self.buf = bytearray()
        self.out = np.empty(0, np.uint8)


class Whole:
    """Each parameter's ``kind`` state whole, in its own dtype (bf16 bit for bit, no float32 round trip). A call
    returns its bytes, valid until the call after the next (two buffers in turn, so the next tensor can be read
    on another thread while this one is written); at most one call at a time. Without a TP split (or for a
    replicated tensor) its stored pieces are flat ranges of it, read straight into place (ZeRO's shards of a
    tensor from two ranks too), every chunk checked against its sha256 (no copy after the read); a TP-split one
    is re-joined row by row (``Source.full``). Host memory: the two buffers, each the largest tensor's size (at
    13B in bf16, 2 x 328 MB; the two passes held it in float32 and its cast). ``bar``: one progress line per group."""

    def __init__(self, src: Source, kind: str, bar: Progress):
        self.src, self.kind, self.bar = src, kind, bar
        self.slots, self.turn = (_Slot(), _Slot()), 0
        most = max((p.local_numel(1) * CODES[self.code(p)] for p in src.layout.params), default=0)
        for slot in self.slots:   # the largest tensor's size at once: no buffer is made again as tensors grow
            slot.out = np.empty(most, np.uint8)

    def code(self, spec: ParamSpec) -> str:
        return spec.dtype if self.kind == "param" else "F32"

    def __call__(self, name: str) -> memoryview:
        spec, slot = self.src.specs[name], self.slots[self.turn]
        self.turn ^= 1
        code, n = self.code(spec), spec.local_numel(1)
        size = CODES[code]
        self.bar.step(f"{self.kind} {group_of(name)}")
        if slot.out.nbytes < n * size:
            slot.out = np.empty(n * size, np.uint8)
        out = memoryview(slot.out)[:n * size]
        if spec.axis is not None and self.src.layout.tp > 1:
            self.src.full(self.kind, name, out=slot.out[:n * size].view(NATIVE[code]), native=True)
            return out
        filled = 0
        for fname, t, a, b in self.src.where.get((self.kind, name), []):
            if t == 0:   # replicated across TP ranks: slice 0's copy
                key = piece_key(self.kind, name, t, a, b)
                self.src.files.read(fname, key, code, 0, b - a, True, slot, out[a * size:b * size])
                filled += b - a
        if filled != n:
            raise CheckpointError(f"{self.src.files.dir}: {self.kind} of {name} covers {filled} of its {n} elements; "
                                  "the checkpoint is incomplete, resume from another one")
        return out


def _write_full(src: Source, out: Path, kinds: tuple[str, ...], log: Log, what: str) -> None:
    """Every parameter's state of each kind, whole, into one safetensors file (``<kind>.<name>`` for the
    optimizer kinds); one kind's buffers in host memory at a time, one progress line per parameter group."""
    specs = src.layout.params
    bar = Progress(log, what, lambda: src.files.bytes_read)
    heads = [OutTensor(p.name if k == "param" else f"{k}.{p.name}", p.dtype if k == "param" else "F32", p.shape)
             for k in kinds for p in specs]
    check_free_space(out, sum(t.nbytes for t in heads))
    with open(out, "wb") as f:
        write_all(f, encode_header(heads, {"format": "ms"}))
        for k in kinds:
            whole = Whole(src, k, bar)
            for p in specs:
                write_all(f, whole(p.name))
            del whole
        bar.done()
        f.flush()
        os.fsync(f.fileno())


def write_weights(ckdir: Path, out: Path, log: Log = None) -> dict:
    """Write the full weights of ``ckdir`` to ``out`` (safetensors, parameter names and dtypes as the
    run holds them: bf16 stays bf16, bit for bit); returns the model's config.json from the record."""
    src, ident = open_checkpoint(ckdir)
    try:
        cfg = config_of(ckdir, ident)
        _write_full(src, out, ("param",), log, f"merge {ckdir.name}")
    finally:
        src.files.close()
    return cfg


def write_optimizer(ckdir: Path, out_dir: Path, log: Log = None) -> Path:
    """``optimizer.safetensors`` (full fp32 ``adam_m.<name>``, ``adam_v.<name>`` and, when the run keeps fp32
    masters, ``master.<name>``) and ``optimizer.json`` (AdamW's hyper-parameters and update count, the step)."""
    src, ident = open_checkpoint(ckdir)
    try:
        state = TrainState.read(ckdir / STATE_FILE)
        _write_full(src, out_dir / OPTIMIZER_FILE, src.layout.kinds[1:], log, f"merge {ckdir.name} optimizer")
    finally:
        src.files.close()
    opt = ((ident.get("recipe") or {}).get("optimizer") or {}) if isinstance(ident.get("recipe"), dict) else {}
    doc = {"format": "port-optimizer/1", "algorithm": "AdamW (torch.optim.AdamW semantics, porting/train/run/step/cells.py)",
           "step": state.step, "updates": state.adam_t, "loss_scale": state.loss_scale,
           "kinds": list(src.layout.kinds[1:]), "tensors": [p.name for p in src.layout.params],
           "hyper": {k: opt.get(k) for k in ("lr", "betas", "eps", "weight_decay", "grad_clip")}}
    (out_dir / OPTIMIZER_RECORD).write_text(json.dumps(doc, indent=1) + "\n")
    return out_dir / OPTIMIZER_FILE


def target_layout(old: Layout, recipe: Recipe) -> Layout:
    """The layout a recipe's run would have, for the model of ``old`` (the buckets as zero.py forms them)."""

    tp = recipe.parallel.tensor_parallel
    if tp > 1 and old.tp == 1:
        raise CheckpointError("the checkpoint was written without tensor parallel, so it does not record the split "
                              f"axes; to move to parallel.tensor_parallel: {tp}, run `port train --resume` with that "
                              "recipe (the job knows its model's axes)")
    params = tuple(p if tp > 1 else ParamSpec(p.name, p.shape, None, p.dtype) for p in old.params)
    for p in params:
        if p.axis is not None and p.shape[p.axis] % tp:
            raise CheckpointError(f"parallel.tensor_parallel: {tp} does not split {p.name} {list(p.shape)}")
    dp = recipe.world_size // tp
    zero = 0
    buckets: tuple = ()
    if recipe.parallel.optimizer_sharding and dp > 1:
        prec = recipe.precision
        low = prec.grad_reduce_dtype != "float32"
        gb = 4 if not low else {"float32": 4, "bfloat16": 2, "float16": 2}[prec.param_dtype]
        numels = [p.local_numel(tp) for p in params]
        from porting.train.plan import sharding  # deferred: the plan loads the recipe schema; a merge needs neither

        bs = sharding.flat_buckets(numels, gb, recipe.parallel.comm_fusion, dp)
        buckets = tuple((tuple(b.indices), b.padded) for b in bs)
        zero = 2 if recipe.parallel.zero_stage == 2 and recipe.batching.grad_accum_steps > 1 else 1
    return Layout(recipe.world_size, tp, zero, old.masters, params, buckets)


RESHARD_THREADS = 2


class _Ring:
    """Two float32 buffers used in turn for the pieces of one rank file: write_rank hashes piece k on its
    second thread while piece k + 1 is read, and waits for piece k - 1's hash first, so two suffice. Reused,
    they cost no page faults after the first pieces (a fresh buffer per piece: a fault per 4 KiB)."""

    def __init__(self):
        self.bufs: list[np.ndarray | None] = [None, None]
        self.turn = 0

    def next(self, n: int) -> np.ndarray:
        self.turn ^= 1
        buf = self.bufs[self.turn]
        if buf is None or len(buf) < n:
            buf = self.bufs[self.turn] = np.empty(max(n, len(buf) * 3 // 2 if buf is not None else 0), np.float32)
        return buf[:n]


def _reshard_rank(src: Source, new: Layout, tmp: Path, r: int, log: Log) -> None:
    """Write rank ``r``'s file of layout ``new``, each piece cut from the old checkpoint as it is written."""
    t0, t = time.perf_counter(), r % new.tp
    pieces = []
    ring = _Ring()
    for kind, i, a, b in owned(new, r):
        spec = new.params[i]
        read = (lambda kind=kind, spec=spec, a=a, b=b:
                src.assemble(kind, spec.name, new.tp, t, a, b, spec.axis, out=ring.next(b - a)))
        pieces.append((piece_key(kind, spec.name, t, a, b), spec.dtype if kind == "param" else "F32", b - a, read))
    n = write_rank(tmp, r, pieces)
    if log is not None and n:
        sec = time.perf_counter() - t0
        log(f"reshard: rank_{r:05d}.safetensors: {n} bytes written in {sec:.2f} s ({n / max(sec, 1e-9) / 1e6:.0f} MB/s)")


def reshard(ckdir: Path, recipe: Recipe, out: Path, log: Log = None) -> Path:
    """Write ``ckdir``'s state in ``recipe``'s layout to the new checkpoint directory ``out`` (refused when
    it exists; built beside it and renamed into place whole); one log line per rank file written."""

    if out.exists():
        raise CheckpointError(f"{out}: exists; choose a new --out directory (port never overwrites it)")
    src, ident = open_checkpoint(ckdir)
    state = TrainState.read(ckdir / STATE_FILE)
    new = target_layout(src.layout, recipe)
    if ident.get("global_batch") != recipe.global_batch_size:
        raise CheckpointError(f"{ckdir}: global batch {ident.get('global_batch')} in the checkpoint, "
                              f"{recipe.global_batch_size} in the recipe (micro_batch_size x grad_accum_steps x data "
                              "parallel); keep the global batch so the data order continues")
    tmp = out.parent / f".{out.name}.port-tmp-{os.getpid()}"
    try:
        check_free_space(out, sum(e["bytes"] for e in src.files.table.values()))   # the same state, re-cut
        tmp.mkdir(parents=True)
        # two rank files at a time: reads, sha256 and writes release the GIL, so a second core is used
        with ThreadPoolExecutor(max_workers=RESHARD_THREADS) as pool:
            for _ in pool.map(lambda r: _reshard_rank(src, new, tmp, r, log), range(new.world)):
                pass
        write_record(tmp, new, dict(ident, global_batch=recipe.global_batch_size))
        body = dict(state.to_dict(), world_size=new.world, shards=new.world)
        (tmp / STATE_FILE).write_text(json.dumps(body, indent=2))
        os.replace(tmp, out)
    except OSError as e:
        raise CheckpointError(f"{e.filename or out}: cannot write the resharded checkpoint ({e.strerror}); "
                              f"{ckdir} is unchanged") from None
    finally:
        src.files.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out
