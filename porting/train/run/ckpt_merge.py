"""Offline work on per-rank checkpoints (porting/train/run/ckpt_shards.py), outside any training job.

- :func:`write_weights`: the full model weights, one tensor at a time, as one MindSpore-named
  safetensors file (what ``port convert --ms`` reads); ``port ckpt merge`` and the end-of-run HF export
  (porting/train/run/export.py) convert it to HF with the converters, with ``port_manifest.json``.
- :func:`reshard`: the same state cut for another layout (DP, TP, ZeRO stage of another recipe),
  written as a complete checkpoint directory that ``port train --resume`` continues exactly.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from converters import dtypes
from converters.safetensors_io import OutTensor, encode_header, write_all
from model_zoo.errors import CheckpointError
from porting.train.plan import sharding
from porting.train.run.checkpoint import STATE_FILE, TrainState
from porting.train.run.ckpt_read import open_checkpoint
from porting.train.run.ckpt_shards import Layout, ParamSpec, owned, piece_key, write_rank, write_record


def write_weights(ckdir: Path, out: Path) -> dict:
    """Write the full weights of ``ckdir`` to ``out`` (safetensors, parameter names and dtypes as the
    run holds them: bf16 stays bf16, bit for bit); returns the model's config.json from the record."""

    src, ident = open_checkpoint(ckdir)
    cfg = ident.get("model_config")
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{ckdir / 'layout.json'}: key 'identity.model_config' is missing; the checkpoint "
                              "is damaged")
    specs = src.layout.params
    try:
        with open(out, "wb") as f:
            write_all(f, encode_header([OutTensor(p.name, p.dtype, p.shape) for p in specs], {"format": "ms"}))
            for p in specs:   # one full tensor in memory at a time
                full = np.ascontiguousarray(src.full("param", p.name), np.float32)
                write_all(f, dtypes.cast_bytes("F32", p.dtype, memoryview(full).cast("B")))
    finally:
        src.files.close()
    return cfg


def target_layout(old: Layout, recipe) -> Layout:
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
        bs = sharding.flat_buckets(numels, gb, recipe.parallel.comm_fusion, dp)
        buckets = tuple((tuple(b.indices), b.padded) for b in bs)
        zero = 2 if recipe.parallel.zero_stage == 2 and recipe.batching.grad_accum_steps > 1 else 1
    return Layout(recipe.world_size, tp, zero, old.masters, params, buckets)


def reshard(ckdir: Path, recipe, out: Path) -> Path:
    """Write ``ckdir``'s state in ``recipe``'s layout to the new checkpoint directory ``out`` (refused when
    it exists; built beside it and renamed into place whole)."""

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
        tmp.mkdir(parents=True)
        for r in range(new.world):
            t = r % new.tp
            pieces = []
            for kind, i, a, b in owned(new, r):
                spec = new.params[i]
                read = (lambda kind=kind, spec=spec, a=a, b=b, t=t:
                        src.assemble(kind, spec.name, new.tp, t, a, b, spec.axis))
                pieces.append((piece_key(kind, spec.name, t, a, b), spec.dtype if kind == "param" else "F32",
                               b - a, read))
            write_rank(tmp, r, pieces)
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
