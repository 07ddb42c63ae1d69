"""Taps on HF ``transformers`` Llama modules (torch): the same blocks as :mod:`porting.bisect.taps_ms`, on the
modules :func:`porting.bisect.blocks.hooked` finds.

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
    cfg = model.config
    n = cfg.num_hidden_layers
    outs, ins = blocks.hooked(model, cfg.model_type, 0, n)
    state = {"layer": 0}
    handles += [mod.register_forward_hook(_out(record, i, block)) for i, block, mod in outs]
    handles += [mod.register_forward_pre_hook(_in(record, i, block)) for i, block, mod in ins]
    attention = [blocks.submodule(model, blocks.attention_path(cfg.model_type, 0).format(i)) for i in range(n)]
    for i, a in enumerate(attention):
        handles.append(a.register_forward_pre_hook(lambda mod, inp, i=i: state.__setitem__("layer", i)))
    module = sys.modules[type(attention[0]).__module__]
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
