"""Taps on HF ``transformers`` Llama modules (torch): the same blocks as :mod:`porting.bisect.taps_ms`.

Forward hooks (``register_forward_hook`` / ``register_forward_pre_hook``) on the modules; RoPE through
the modeling module's ``apply_rotary_pos_emb``, replaced for the duration of the block (transformers
calls it as a module global: transformers/models/llama/modeling_llama.py, ``LlamaAttention.forward``).
Backward: ``Tensor.register_hook`` on each tapped output receives dL/d(output) (what ``retain_grad``
would keep, without keeping it).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Callable, Iterator

import numpy as np

from porting.bisect import blocks

Record = Callable[[str, "int | None", str, np.ndarray], None]


def _np(t) -> np.ndarray:
    return t.detach().float().numpy()


def tap(record: Record, layer: int | None, block: str, t) -> None:
    record("forward", layer, block, _np(t))
    if t.requires_grad:
        t.register_hook(lambda g: record("backward", layer, block, _np(g)))


_out = functools.partial(blocks.out_hook, tap)   # (record, layer, block) -> forward hook
_in = functools.partial(blocks.in_hook, tap)     # (record, layer, block) -> forward pre-hook


@contextlib.contextmanager
def instrumented(model, record: Record) -> Iterator[None]:
    """Inside the block every forward of the HF model records its sub-blocks (not the loss)."""
    handles = []
    m = model.model
    state = {"layer": 0}
    handles.append(m.embed_tokens.register_forward_hook(_out(record, None, "embedding")))
    handles.append(m.norm.register_forward_hook(_out(record, None, "final_norm")))
    handles.append(model.lm_head.register_forward_hook(_out(record, None, "logits")))
    for i, layer in enumerate(m.layers):
        a, f = layer.self_attn, layer.mlp
        for mod, block in ((layer.input_layernorm, "attention_norm"), (a.q_proj, "q_proj"), (a.k_proj, "k_proj"),
                           (a.v_proj, "v_proj"), (a.o_proj, "o_proj"), (layer.post_attention_layernorm, "mlp_norm"),
                           (f.gate_proj, "gate_proj"), (f.up_proj, "up_proj"), (f.down_proj, "down_proj"),
                           (layer, "output")):
            handles.append(mod.register_forward_hook(_out(record, i, block)))
        if hasattr(a, "q_norm"):   # Qwen3's per-head q/k norms
            handles += [a.q_norm.register_forward_hook(_out(record, i, "q_norm")),
                        a.k_norm.register_forward_hook(_out(record, i, "k_norm"))]
        handles.append(a.o_proj.register_forward_pre_hook(_in(record, i, "attention")))
        handles.append(f.down_proj.register_forward_pre_hook(_in(record, i, "swiglu")))
        handles.append(a.register_forward_pre_hook(lambda mod, inp, i=i: state.__setitem__("layer", i)))
    module = sys.modules[type(m.layers[0].self_attn).__module__]
    original = module.apply_rotary_pos_emb

    def rope(q, k, cos, sin, *args, **kwargs):
        q2, k2 = original(q, k, cos, sin, *args, **kwargs)
        tap(record, state["layer"], "q_rope", q2)
        tap(record, state["layer"], "k_rope", k2)
        return q2, k2
    module.apply_rotary_pos_emb = rope
    try:
        yield
    finally:
        module.apply_rotary_pos_emb = original
        for h in handles:
            h.remove()
