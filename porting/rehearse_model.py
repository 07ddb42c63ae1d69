"""The rehearsal's small model (porting/rehearse.py): the recipe model's family at a size this machine trains.

:func:`scaled_config` keeps what makes the family numerically itself: the query-to-KV head grouping, the
RoPE type and its numbers (theta, factors, attention factor, partial rotation), tied embeddings, biases,
Qwen3's q/k norms, the norm epsilon, a padding row. It shrinks the sizes (head_dim 16, 2 layers, the
packaged tokenizer's 512 ids) and with them what is sized by head_dim or by the context:

* longrope's ``short_factor`` / ``long_factor`` hold one number per rotated frequency (head_dim times
  partial_rotary_factor, halved: 48 for Phi-4-mini, 6 in its small model): each list is resampled to the
  small model's count along its own curve (linear interpolation over the frequency index), so the small
  model is valid for transformers' Phi3Config and port alike;
* the length past which a length-dependent RoPE changes its frequencies (longrope's original context, dynamic
  NTK's max_position_embeddings): the rehearsal's rows (``SEQ`` tokens) pass it exactly when the recipe's
  rows (``data.max_seq_length``) pass the real one, so the rungs run the branch the real run runs (the
  long factors and, packed, the frequencies of each batch's longest document).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from converters import fused, names
from model_zoo.config import LlamaConfig

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER_FROM = ROOT / "model_zoo" / "assets" / "stories260k"
SEQ = 64                     # the rehearsal's sequence length (porting/rehearse.py)
SMALL_HEAD_DIMS = (16, 32, 64)


def scaled_config(cfg: LlamaConfig, recipe_seq: int | None = None) -> LlamaConfig:
    """A small model of ``cfg``'s family: the same query-to-KV head grouping (2 KV heads so tensor
    parallel 2 divides them), head_dim 16 (or the least that keeps the rotated share even), the same MLP
    ratio, 2 layers, the packaged tokenizer's 512 ids; RoPE, tied embeddings, biases and norm epsilon kept.
    ``recipe_seq``: the recipe's sequence length (None: the rows stay within every original context)."""
    kv = cfg.num_key_value_heads or cfg.num_attention_heads
    group = max(1, min(cfg.num_attention_heads // kv, 4))
    head_dim = next((d for d in SMALL_HEAD_DIMS if _rotated(d, cfg.partial_rotary_factor) % 2 == 0
                     and _rotated(d, cfg.partial_rotary_factor) >= 4), SMALL_HEAD_DIMS[-1])
    heads = 2 * group
    hidden = max(heads * head_dim, 32)
    inter = max(16, int(round(hidden * cfg.intermediate_size / cfg.hidden_size / 16)) * 16)
    rs, max_pos = _scaled_rope(cfg, _rotated(head_dim, cfg.partial_rotary_factor), recipe_seq)
    return dataclasses.replace(cfg, vocab_size=512, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                               num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim,
                               max_position_embeddings=max_pos, rope_scaling=rs, sliding_window=None,
                               bos_token_id=1, eos_token_id=2, torch_dtype="float32",
                               pad_token_id=None if cfg.pad_token_id is None else 0)


def _rotated(head_dim: int, partial: float) -> int:
    return int(head_dim * partial)   # transformers' rotated dimensions


def _scaled_rope(cfg: LlamaConfig, rotary: int, recipe_seq: int | None) -> tuple[dict | None, int]:
    """(rope dict, max_position_embeddings) of the small model."""
    rs = dict(cfg.rope_scaling) if cfg.rope_scaling else None
    max_pos = max(256, 2 * SEQ)
    kind = (rs or {}).get("rope_type")
    if kind == "longrope":
        for k in ("short_factor", "long_factor"):
            rs[k] = _resample(rs[k], rotary // 2)
        passes = recipe_seq is not None and recipe_seq > rs["original_max_position_embeddings"]
        rs["original_max_position_embeddings"] = SEQ // 2 if passes else 2 * SEQ
    elif kind == "dynamic" and recipe_seq is not None and recipe_seq > cfg.max_position_embeddings:
        # its original context is max_position_embeddings; the longest row it takes is that times factor
        max_pos = max(SEQ // 2, math.ceil(SEQ / float(rs["factor"])))
    return rs, max_pos


def _resample(values: list, n: int) -> list[float]:
    """``values`` (one per rotated frequency) at ``n`` points along the same frequency range."""
    v = np.asarray(values, np.float64)
    if len(v) == n:
        return [float(x) for x in v]
    if len(v) == 1:
        return [float(v[0])] * n
    return [float(x) for x in np.interp(np.linspace(0, len(v) - 1, n), np.arange(len(v)), v)]


def write_scaled_model(cfg: LlamaConfig, out: Path, seed: int) -> None:
    """config.json, seeded random float32 weights (normal 0.02, norms 1, biases 0) in the family's HF layout,
    and the tokenizer."""
    rng = np.random.default_rng(seed)
    shapes = names.expected_hf_shapes(cfg)
    tensors = {}
    for n in names.expected_hf_names(cfg):
        if n.endswith("norm.weight"):
            tensors[n] = np.ones(shapes[n], np.float32)
        elif n.endswith(".bias"):
            tensors[n] = np.zeros(shapes[n], np.float32)
        else:
            tensors[n] = (rng.standard_normal(shapes[n]) * 0.02).astype(np.float32)
    tensors = fused.fuse_named(cfg, tensors)   # Phi-3: qkv_proj and gate_up_proj, as its checkpoints hold them
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2), encoding="utf-8")
    for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_FROM / f, out / f)
