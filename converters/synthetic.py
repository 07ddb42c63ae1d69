"""Random-weight HF checkpoints of any config, written by the streaming writer (benchmarks and tests
use them to exercise real sizes without downloading anything). Bytes are random; values may be NaN."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from converters import names
from converters.safetensors_io import OutTensor, encode_header, write_all
from model_zoo.config import LlamaConfig

_BLOCK = 64 << 20


def write_random_hf(cfg: LlamaConfig, out: Path, shards: int = 1, dtype: str = "BF16", seed: int = 0) -> int:
    """Write config.json and ``shards`` safetensors files (+ index when sharded) under ``out``; return
    the number of tensor bytes. Tensors are split across shards in order, as save_pretrained does."""
    shapes = names.expected_hf_shapes(cfg)
    tensors = [OutTensor(n, dtype, shapes[n]) for n in names.expected_hf_names(cfg)]
    total = sum(t.nbytes for t in tensors)
    groups: list[list[OutTensor]] = [[]]
    acc = 0
    for t in tensors:
        if acc >= total / shards * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(t)
        acc += t.nbytes
    out.mkdir(parents=True)
    block = memoryview(np.random.default_rng(seed).integers(0, 2**63, _BLOCK // 8, dtype=np.int64).view(np.uint8))
    weight_map = {}
    for i, g in enumerate(groups):
        name = "model.safetensors" if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        with open(out / name, "wb") as f:
            write_all(f, encode_header(g, {"format": "pt"}))
            left, off = sum(t.nbytes for t in g), (i * 4096) % (_BLOCK // 2)
            while left:
                n = min(left, _BLOCK - off)
                write_all(f, block[off:off + n])
                left -= n
                off = (off + 8192) % (_BLOCK // 2)
        weight_map.update({t.name: name for t in g})
    if len(groups) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    torch_dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype]
    (out / "config.json").write_text(json.dumps({**cfg.to_hf(), "torch_dtype": torch_dtype}, indent=2))
    return total
