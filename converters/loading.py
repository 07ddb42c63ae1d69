"""Load HF weights straight into a zoo cell (used by verify, generate and train).

Reads go through the same validating, memory-mapped reader as ``port convert`` (safetensors single or
sharded, or ``.bin`` via ``torch.load(weights_only=True)``), one tensor at a time; bf16 sources are
widened exactly to the parameter's dtype. A tensor-parallel rank reads from safetensors only the byte
ranges of its own slice (:func:`read_slice`: one range for a slice along axis 0, one per row of the
leading axes otherwise), so TP 8 reads 1/8 of every split tensor instead of all of it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from converters import dtypes, fused, names
from converters.lora_names import ModuleTable
from converters.sources import TensorReader, open_hf, open_ms
from model_zoo.errors import CheckpointError

_NP = {"F32": np.float32, "F16": np.float16}


def _check_coverage(where: str, hf_names: list[str], cfg) -> None:
    expected = set(names.expected_hf_names(cfg))
    present = {n for n in hf_names if not names.is_ignored_hf(n)}
    if present != expected:   # named as the file stores them (Phi-3: qkv_proj, not the parts read from it)
        raise names.coverage_error(where, fused.stored_names(cfg, sorted(expected - present)),
                                   fused.stored_names(cfg, sorted(present - expected)))


def _array(code: str, raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """bf16 widened exactly to float32 (NumPy has no bfloat16); other floats keep their dtype."""
    if code == "BF16":
        return dtypes.to_numpy_f32(code, raw, shape)
    if code not in _NP:
        raise CheckpointError(f"unsupported dtype {code}; expected one of {', '.join(dtypes.CONVERTIBLE)}")
    return np.frombuffer(raw, dtype=_NP[code]).reshape(shape).copy()


def _read(reader: TensorReader, name: str) -> np.ndarray:
    t = reader.info(name)
    try:
        return _array(t.dtype, b"".join(bytes(c) for c in reader.chunks(name)), t.shape)
    except CheckpointError as e:
        raise CheckpointError(f"{reader.file_of(name).path}: tensor {name}: {e}") from None


def read_slice(reader: TensorReader, name: str, axis: int | None, rank: int, size: int) -> tuple[np.ndarray, int]:
    """(this rank's slice of tensor ``name``, bytes read): split along ``axis`` into ``size`` equal parts
    (None: the whole tensor); from a safetensors file by byte ranges, else read whole and cut."""
    from model_zoo.parallel import split_shard  # deferred: imports MindSpore; verify's reader does not need it

    t, f = reader.info(name), reader.file_of(name)
    if reader.src.kind != "safetensors" or axis is None or size == 1:
        full = _read(reader, name)
        return split_shard(full, axis, rank, size), full.nbytes if t.dtype != "BF16" else full.size * 2
    shape, isz = t.shape, dtypes.BY_CODE[t.dtype].itemsize
    if shape[axis] % size:
        raise CheckpointError(f"{f.path}: tensor {name} dimension {axis} of {list(shape)} does not split into {size}")
    row = math.prod(shape[axis:]) * isz          # bytes of one row of the leading axes
    run = row // size                            # this rank's bytes of each row
    local = tuple(n // size if i == axis else n for i, n in enumerate(shape))
    out = bytearray(run * math.prod(shape[:axis]))
    fd = os.open(f.path, os.O_RDONLY)
    try:
        view = memoryview(out)
        for o in range(math.prod(shape[:axis])):
            got = os.preadv(fd, [view[o * run:(o + 1) * run]], t.begin + o * row + rank * run)
            if got != run:
                raise CheckpointError(f"{f.path}: tensor {name}: short read; the file is truncated")
    finally:
        os.close(fd)
    try:
        return _array(t.dtype, out, local), len(out)
    except CheckpointError as e:
        raise CheckpointError(f"{f.path}: tensor {name}: {e}") from None


def read_hf_state(hf_dir: str | Path) -> dict[str, np.ndarray]:
    """All tensors of an HF directory as NumPy arrays (bf16 as float32). Headers are validated first."""
    src = open_hf(Path(hf_dir))
    with TensorReader(src) as reader:
        return {n: _read(reader, n) for n in src.tensor_names()}


def trained_base_values(hf_dir: str | Path, cfg, found, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """PEFT key -> the base model's value of every parameter a LoRA adapter trains whole (modules_to_save, biases;
    ``found``: converters/lora_names.py ``Targets``) that ``tensors`` does not hold, each read whole."""
    hf_of = {z: h for h, z in ModuleTable.of(cfg).params.items()}
    keys = found.keys()
    missing = [k for k in found.trainable if k not in tensors]
    if not missing:
        return {}
    with TensorReader(open_hf(Path(hf_dir))) as reader:
        return {k: _read(reader, hf_of[keys[k]]) for k in missing}


def load_hf_dir(model, hf_dir: str | Path, shard=None, log=None) -> int:
    """Fill ``model`` from an HF directory, one tensor in memory at a time; returns the bytes read.
    ``shard(ms_name, array)`` (tensor parallel) returns this rank's slice of a full tensor; a model built
    for tensor parallel (``model.tp``) reads only its slices' byte ranges (:func:`read_slice`). ``log``: one
    line per decoder layer (and one for the rest) with its bytes and seconds, so a long load is never silent."""
    import time

    import mindspore as ms

    from model_zoo.parallel import shard_layout  # deferred: imports MindSpore

    tp = getattr(model, "tp", None) if shard is not None else None
    axes = shard_layout(model) if tp is not None else {}
    total = 0
    hf_dir = Path(hf_dir)
    src = open_hf(hf_dir)
    cfg = model.config
    _check_coverage(str(hf_dir), src.tensor_names(), cfg)
    table = names.NAME_MAPS[cfg.model_type]
    params = {p.name: p for p in model.get_parameters()}
    group, since, at = None, 0, time.perf_counter()
    with TensorReader(src) as reader:
        for hf_name in names.expected_hf_names(cfg) + [None]:
            g = hf_name and (f"layer {hf_name.split('.')[2]}" if hf_name.startswith("model.layers.") else
                             "embedding" if "embed_tokens" in hf_name else "final norm and head")
            if g != group and group is not None and log is not None:
                sec = time.perf_counter() - at
                log(f"HF load {hf_dir.name}: {group}: {total - since} bytes in {sec:.2f} s "
                    f"({(total - since) / max(sec, 1e-9) / 1e6:.0f} MB/s)")
            if g != group:
                group, since, at = g, total, time.perf_counter()
            if hf_name is None:
                break
            p = params[names.map_name(hf_name, table)]
            t = reader.info(hf_name)
            # a zero-memory view stands for the tensor: only the slice's shape is compared
            want = t.shape if shard is None else shard(p.name, np.broadcast_to(np.zeros((), np.bool_), t.shape)).shape
            if want != tuple(p.shape):
                raise CheckpointError(f"{reader.file_of(hf_name).path}: tensor {hf_name} has shape {list(t.shape)}, "
                                      f"config.json implies {list(p.shape)}")
            if tp is not None:
                value, n = read_slice(reader, hf_name, axes.get(p.name), tp.rank, tp.size)
            else:
                value = _read(reader, hf_name)
                n = value.nbytes if t.dtype != "BF16" else value.size * 2
                value = value if shard is None else shard(p.name, value)
            total += n
            p.set_data(ms.Tensor(value).astype(p.dtype))
    return total


def load_ms_dir(model, ms_dir: str | Path) -> None:
    """Fill ``model`` from a MindSpore checkpoint directory (``port convert`` output) the way a user's
    MindSpore code does: ``mindspore.load_checkpoint`` per file, then ``load_param_into_net`` with
    strict loading. Missing or unexpected parameters are an error, never a silent partial load."""
    import mindspore as ms

    src = open_ms(Path(ms_dir))
    state = {}
    for f in src.files:
        try:
            state.update(ms.load_checkpoint(str(f.path), format=src.kind))
        except (RuntimeError, ValueError, OSError) as e:
            raise CheckpointError(f"{f.path}: mindspore.load_checkpoint failed ({str(e).splitlines()[0]})") from None
    params = {p.name for p in model.get_parameters()}
    extra = sorted(set(state) - params)
    if extra or params - set(state):
        raise names.coverage_error(str(ms_dir), sorted(params - set(state)), extra)
    # Names were checked equal above, so strict loading leaves nothing unloaded.
    ms.load_param_into_net(model, state, strict_load=True)
