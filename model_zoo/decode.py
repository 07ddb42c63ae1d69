"""Greedy decoding of a zoo cell, the one implementation (``port generate``, ``port verify --generate``),
and the generation-only parts of the model: the PyNative KV-cache forward (:func:`forward_cached`), the
growth of the RoPE tables past ``max_position_embeddings`` and the sliding-window length check.

Three ways to keep the keys and values of past positions, all giving the same tokens:

* ``"static"``: a KV cache of fixed length ``max_len`` (:class:`StaticCacheDecoder`), compiled once with
  ``mindspore.jit``. Position ``pos`` is a tensor input, the new k/v are written with a one-hot blend
  and keys beyond ``pos`` are masked, so every step reuses one compiled graph (fastest).
* ``"dynamic"``: the PyNative cache of :func:`forward_cached`, grown by concatenation,
  so every step has new shapes and runs op by op (the path the fused kernels' cache mode takes).
* ``"none"``: the whole sequence recomputed every step (the plain forward, as a reference; with a
  length-dependent RoPE every position takes the frequencies of the whole length, as HF without a cache).

Ties in the argmax go to the lowest id, as ``torch.argmax`` (HF ``generate``) does.
"""

from __future__ import annotations

import functools
from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from model_zoo import kernels, rope
from model_zoo.errors import ConfigError
from model_zoo.llama import LlamaForCausalLM, repeat_kv


def _ensure_rope(model: LlamaForCausalLM, length: int) -> None:
    """The model's RoPE tables grown to ``length`` positions (built for ``max_position_embeddings``)."""
    if length > model._rope_len:
        cos, sin = kernels.rope_tables(model.config, length)
        # Plain tensors, not Parameters: they are derived data and never saved in checkpoints.
        model.rope_cos, model.rope_sin = Tensor(cos), Tensor(sin)
        model._rope_len = length


def _cached_rope(model: LlamaForCausalLM, start: int, s: int) -> tuple[Tensor, Tensor]:
    """cos and sin of positions start..start+s-1 in a KV-cache call: a length-dependent RoPE (dynamic,
    longrope) takes the frequencies of the whole length so far, as transformers' dynamic_rope_update does
    (max(position_ids) + 1); the keys already cached keep the rotation they were stored with, as in HF."""
    total = start + s
    if model.rope_threshold and total > model.rope_threshold:
        cos, sin = rope.rope_tables(model.config, total, total)
        return Tensor(cos[start:]), Tensor(sin[start:])
    _ensure_rope(model, total)
    return model.rope_cos[start:total], model.rope_sin[start:total]


def _check_length(model: LlamaForCausalLM, length: int) -> None:
    # Sliding-window attention (Mistral v0.1) equals full causal attention up to the window.
    if model.window and length > model.window:
        raise ConfigError(f"sequence length {length} exceeds sliding_window={model.window}; the zoo's attention "
                          f"is full causal, exact only up to the window: use sequences <= {model.window}")


def forward_cached(model: LlamaForCausalLM, input_ids: Tensor, cache: list | None) -> tuple[Tensor, list]:
    """The KV-cache path (PyNative): logits for ``input_ids`` following the positions already in ``cache``.

    ``cache`` is a list of (k, v) per layer, each (B, Nkv, T, D), or None to start.
    """
    start = 0 if not cache else cache[0][0].shape[2]
    s = input_ids.shape[1]
    _check_length(model, start + s)
    kernels.check_attention_lengths(s, start + s)
    cos, sin = _cached_rope(model, start, s)
    x = model.model.tok_embeddings(input_ids)
    new_cache = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.attention
        q, k, v = attn.project(layer.attention_norm(x), cos, sin)
        if cache:
            k = ops.cat((cache[i][0], k), 2)
            v = ops.cat((cache[i][1], v), 2)
        new_cache.append((k, v))
        x = x + attn.attend(q, k, v, start)
        x = x + layer.feed_forward(layer.ffn_norm(x))
    return model.logits(model.model.norm_out(x)), new_cache


class StaticCacheDecoder(nn.Cell):
    """One decode step over a fixed-length KV cache, sharing the model's cells and parameters."""

    def __init__(self, model: LlamaForCausalLM, max_len: int):
        super().__init__(auto_prefix=False)  # share the model's parameter names
        self.model = model
        self.max_len = max_len
        # Row p as a token-by-token decode rotates position p (length-dependent RoPE: the frequencies of
        # p + 1 positions; equal to HF generate's when the prompt fits the original context, since HF rotates
        # a whole prompt with the frequencies of its length).
        cos, sin = rope.incremental_tables(model.config, max_len)
        self.rope_cos, self.rope_sin = Tensor(cos), Tensor(sin)

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


def _next_token(logits_row: np.ndarray) -> int:
    """Greedy pick; ``np.argmax`` returns the first maximum, as ``torch.argmax``."""
    return int(np.argmax(logits_row))


def _static_step(model: LlamaForCausalLM, max_len: int):
    """The compiled step for ``max_len``, kept on the model: later calls of the same length reuse the graph."""
    steps = model.__dict__.setdefault("_decode_steps", {})
    if max_len not in steps:
        steps[max_len] = ms.jit(StaticCacheDecoder(model, max_len).construct)
    return steps[max_len]


def _decode_static_cache(model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int,
                         eos_token_id: int | None = None) -> list[int]:
    """Greedy decoding, one compiled graph for every step (prompt tokens are fed one by one)."""
    cfg = model.config
    max_len = len(prompt_ids) + max_new_tokens
    step = _static_step(model, max_len)
    shape = (cfg.num_hidden_layers, 1, cfg.num_key_value_heads, max_len, cfg.head_dim)
    kc = Tensor(np.zeros(shape, np.float32)).astype(model.compute_dtype)
    vc = Tensor(np.zeros(shape, np.float32)).astype(model.compute_dtype)
    out: list[int] = []
    tokens = list(prompt_ids)
    for pos in range(max_len - 1):
        logits, kc, vc = step(Tensor([[tokens[pos]]], ms.int32), Tensor([pos], ms.int32), kc, vc)
        if pos >= len(prompt_ids) - 1:
            nxt = _next_token(logits.asnumpy()[0])
            out.append(nxt)
            tokens.append(nxt)
            if nxt == eos_token_id:
                break
    return out


def _decode_pynative(model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int,
                     eos_token_id: int | None = None, *, grow_cache: bool) -> list[int]:
    """Greedy decoding op by op: with ``grow_cache`` the prompt goes in one call and then one token per
    call through the growing KV cache; without, the whole sequence is recomputed every step."""
    _ensure_rope(model, len(prompt_ids) + max_new_tokens)
    ids = list(prompt_ids)
    out: list[int] = []
    kv = None
    for _ in range(max_new_tokens):
        if grow_cache:
            logits, kv = forward_cached(model, Tensor(np.asarray([out[-1:] or ids], dtype=np.int32)), kv)
        else:
            logits = model(Tensor(np.asarray([ids], dtype=np.int32)))
        nxt = _next_token(logits.asnumpy()[0, -1])
        out.append(nxt)
        ids.append(nxt)
        if nxt == eos_token_id:
            break
    return out


DECODERS: dict[str, Callable[..., list[int]]] = {
    "static": _decode_static_cache,
    "dynamic": functools.partial(_decode_pynative, grow_cache=True),
    "none": functools.partial(_decode_pynative, grow_cache=False),
}


def greedy(model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int, *, cache: str = "static",
           eos_token_id: int | None = None) -> list[int]:
    """The token ids greedy decoding picks after ``prompt_ids`` (at most ``max_new_tokens``, ending at
    ``eos_token_id`` when given); ``cache`` is a key of :data:`DECODERS` (see the module docstring)."""
    if cache not in DECODERS:
        raise ConfigError(f"KV cache mode {cache!r}: expected one of {', '.join(DECODERS)}")
    if not prompt_ids:
        raise ConfigError("the prompt has no tokens; start from at least the BOS token id")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens}: expected at least 1")
    _check_length(model, len(prompt_ids) + max_new_tokens)
    return DECODERS[cache](model, list(prompt_ids), max_new_tokens, eos_token_id)
