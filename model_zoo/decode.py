"""One-token decode step with a static-shape KV cache, compiled once with ``mindspore.jit``.

The PyNative KV-cache path (:meth:`LlamaForCausalLM.forward_cached`) grows the cache by
concatenation, so every step has new shapes and runs op by op. Here the cache has a fixed length
``max_len``; position ``pos`` is a tensor input, the new k/v are written with a one-hot blend, and
keys beyond ``pos`` are masked, so every step reuses one compiled graph.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from model_zoo.llama import LlamaForCausalLM, repeat_kv


class StaticCacheDecoder(nn.Cell):
    def __init__(self, model: LlamaForCausalLM, max_len: int):
        super().__init__(auto_prefix=False)  # share the model's parameter names
        model._ensure_rope(max_len)
        self.model = model
        self.max_len = max_len
        self.rope_cos = model.rope_cos
        self.rope_sin = model.rope_sin

    def construct(self, token: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor):
        """token (B, 1) int32; pos (1,) int32; caches (L, B, Nkv, max_len, D). Returns logits (B, V)
        for the next token and the updated caches."""
        net = self.model.model
        cos = ops.gather(self.rope_cos, pos, 0)
        sin = ops.gather(self.rope_sin, pos, 0)
        onehot = ops.reshape(ops.one_hot(pos, self.max_len, Tensor(1.0, ms.float32), Tensor(0.0, ms.float32)),
                             (1, 1, self.max_len, 1))
        keys = ops.arange(self.max_len, dtype=ms.int32)
        neg = ops.cast(keys > pos, ms.float32) * -1e30  # (max_len,): mask positions not written yet
        x = net.tok_embeddings(token)
        new_k, new_v = [], []
        for i, layer in enumerate(net.layers):
            attn = layer.attention
            q, k, v = attn.project(layer.attention_norm(x), cos, sin)
            kc = k_cache[i] * (1 - onehot) + ops.cast(k, k_cache.dtype) * onehot
            vc = v_cache[i] * (1 - onehot) + ops.cast(v, v_cache.dtype) * onehot
            new_k.append(kc)
            new_v.append(vc)
            kf = repeat_kv(ops.cast(kc, ms.float32), attn.n_rep)
            vf = repeat_kv(ops.cast(vc, q.dtype), attn.n_rep)
            scores = ops.BatchMatMul(transpose_b=True)(ops.cast(q, ms.float32), kf) * attn.scale + neg
            out = ops.BatchMatMul()(ops.cast(ops.softmax(scores, -1), q.dtype), vf)
            b, n, s, d = out.shape
            x = x + attn.wo(ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (b, s, n * d)))
            x = x + layer.feed_forward(layer.ffn_norm(x))
        logits = self.model.logits(net.norm_out(x))
        return logits[:, -1, :], ops.stack(new_k), ops.stack(new_v)


def greedy_static(model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int,
                  eos_token_id: int | None = None) -> list[int]:
    """Greedy decoding, one compiled graph for every step (prompt tokens are fed one by one)."""
    cfg = model.config
    max_len = len(prompt_ids) + max_new_tokens
    model._check_length(max_len)
    # One compiled step per (model, max_len): later calls of the same length reuse the graph.
    cache = model.__dict__.setdefault("_decode_steps", {})
    if max_len not in cache:
        cache[max_len] = ms.jit(StaticCacheDecoder(model, max_len).construct)
    step = cache[max_len]
    shape = (cfg.num_hidden_layers, 1, cfg.num_key_value_heads, max_len, cfg.head_dim)
    kc = Tensor(np.zeros(shape, np.float32)).astype(model.compute_dtype)
    vc = Tensor(np.zeros(shape, np.float32)).astype(model.compute_dtype)
    out: list[int] = []
    tokens = list(prompt_ids)
    for pos in range(max_len - 1):
        logits, kc, vc = step(Tensor([[tokens[pos]]], ms.int32), Tensor([pos], ms.int32), kc, vc)
        if pos >= len(prompt_ids) - 1:
            nxt = int(np.argmax(logits.asnumpy()[0]))
            out.append(nxt)
            tokens.append(nxt)
            if eos_token_id is not None and nxt == eos_token_id:
                break
    return out
