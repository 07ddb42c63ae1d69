"""Taps on the zoo's MindSpore cells (PyNative): every sub-block's output and its true gradient.

Forward: ``Cell.register_forward_hook`` on the cells that compute a block, found by
:func:`porting.bisect.blocks.hooked` from the converters' name map (``register_forward_pre_hook``
where the tensor is a cell's input: attention's output is ``wo``'s input, SwiGLU's is ``w2``'s), and the
attention cell's ``_rope`` wrapped on the instance (RoPE is a function or a CPU-kernel cell depending on
the kernel plan; both go through ``_rope``). Backward: ``Tensor.register_hook`` on each tapped output,
which receives dL/d(output) as autograd computes it, so the gradients are the activation gradients of
the real backward, custom kernels' bprops included. The model's kernels are not changed: what runs is
what ``model.kernel_report()`` says. Hooks exist in PyNative only
(https://www.mindspore.cn/docs/en/r2.3.1/api_python/nn/mindspore.nn.Cell.html#mindspore.nn.Cell.register_forward_hook);
every handle is removed when the block ends, and nothing of model_zoo is edited.

On Ascend with fused SwiGLU, ``w1`` and ``w3`` are not called as cells (one matmul on [w1; w3]), so
gate_proj/up_proj are not observed there; the rows say so.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import numpy as np

from porting.bisect import blocks

Record = Callable[[str, "int | None", str, np.ndarray], None]


def _np(t) -> np.ndarray:
    import mindspore as ms

    return (t.astype(ms.float32) if t.dtype != ms.float32 else t).asnumpy()


def tap(record: Record, layer: int | None, block: str, t) -> None:
    """Record a forward tensor and, in the backward, its gradient."""
    record("forward", layer, block, _np(t))
    t.register_hook(lambda g: record("backward", layer, block, _np(g)))


_out = functools.partial(blocks.out_hook, tap)   # (record, layer, block) -> forward hook
_in = functools.partial(blocks.in_hook, tap)     # (record, layer, block) -> forward pre-hook


@contextlib.contextmanager
def instrumented(model, record: Record) -> Iterator[None]:
    """Inside the block every forward of ``model`` records its sub-blocks through ``record``.
    The logits and the loss are tapped by the caller (they are the step function's own tensors)."""
    handles, patched = [], []
    cfg = model.config
    n = cfg.num_hidden_layers
    # the logits are the step function's own tensor (tapped by the caller); the zoo's tied head is no cell call
    outs, ins = blocks.hooked(model, cfg.model_type, 1, n, skip=("logits",))
    handles += [cell.register_forward_hook(_out(record, i, block)) for i, block, cell in outs]
    handles += [cell.register_forward_pre_hook(_in(record, i, block)) for i, block, cell in ins]
    for i in range(n):
        a = blocks.submodule(model, blocks.attention_path(cfg.model_type, 1).format(i))
        patched.append(a)
        a._rope = _rope_tap(a._rope, record, i)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for a in patched:
            del a._rope   # back to the class's method


def _rope_tap(rope: Callable, record: Record, layer: int) -> Callable:
    """Attention.project rotates q, then k: the calls alternate."""
    calls = [0]

    def wrapped(x, cos, sin):
        y = rope(x, cos, sin)
        tap(record, layer, ("q_rope", "k_rope")[calls[0] % 2], y)
        calls[0] += 1
        return y
    return wrapped
