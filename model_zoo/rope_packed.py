"""RoPE at packed rows' positions for the length-dependent types (dynamic NTK, longrope), in the graph.

transformers' ``dynamic_rope_update`` takes a call's frequencies from ``max(position_ids) + 1`` over the whole
batch. For packed rows (porting/train/data/packing.py: ids restart at 0 for each document, padding at 0) that
is the batch's longest document, a value known only when the batch is: a graph cannot hold its table as a
constant, as it does for an unpacked row (model_zoo/llama.py ``rope_for``). This cell picks the frequencies
from that length inside the graph and rotates each row's own positions:

* ``longrope``: the short factors up to ``original_max_position_embeddings``, the long ones past it (both
  computed on the host by model_zoo/rope.py, as transformers' ``_compute_longrope_parameters``);
* ``dynamic``: up to ``max_position_embeddings`` the initial frequencies (host); past it the NTK base
  ``theta ((factor L / max_pos) - (factor - 1)) ** (d / (d - 2))`` of that length L, in float32 as
  transformers computes it when ``seq_len`` is a tensor (``_compute_dynamic_ntk_parameters`` in the forward's
  update: ``torch.max(position_ids) + 1`` is an int64 tensor, so every operation after it is float32).

cos and sin are ``cos(position * inv_freq)`` with the halves repeated (rotate-half), times the attention
factor, as transformers' rotary embedding forward (``emb.cos() * attention_scaling``).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from model_zoo import rope


class PackedRope(nn.Cell):
    """``positions`` (B, S) int -> cos, sin (B, S, rotary_dim) float32, for a length-dependent RoPE."""

    def __init__(self, cfg):
        super().__init__()
        rs = cfg.rope_scaling or {}
        self.dynamic = rs.get("rope_type") == "dynamic"
        self.limit = int(rope.threshold(cfg))
        initial, self.attention = rope.inv_freq(cfg)
        self.initial = Tensor(initial)
        d = rope.rotary_dim(cfg)
        if self.dynamic:
            self.factor = float(rs["factor"])
            self.max_pos = float(cfg.max_position_embeddings)
            self.base = float(cfg.rope_theta)
            self.power = d / (d - 2)
            self.exponents = Tensor((np.arange(0, d, 2).astype(np.float32) / np.float32(d)).astype(np.float32))
        else:
            self.grown = Tensor(rope.inv_freq(cfg, self.limit + 1)[0])

    def construct(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        length = ops.cast(ops.reduce_max(positions), ms.float32) + 1.0
        if self.dynamic:
            scale = self.factor * ops.maximum(length, self.max_pos) / self.max_pos - (self.factor - 1.0)
            base = self.base * ops.pow(scale, self.power)
            grown = 1.0 / ops.pow(base, self.exponents)
        else:
            grown = self.grown
        inv = ops.select(ops.broadcast_to(length > self.limit, self.initial.shape), grown, self.initial)
        freqs = ops.expand_dims(ops.cast(positions, ms.float32), -1) * inv
        emb = ops.cat((freqs, freqs), -1)
        cos, sin = ops.cos(emb), ops.sin(emb)
        if self.attention != 1.0:
            cos, sin = cos * self.attention, sin * self.attention
        return cos, sin
