"""The fused Ascend entry points the zoo's cells call, and the hook that replaces them in tests."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping

from mindspore import ops

from model_zoo.errors import KernelError

# The fused Ascend entry points. Test hook: a test puts contract-enforcing stand-ins in their place
# (tests/npu_models.py) with :func:`fused_ops_replaced`, or by setting items, BEFORE it builds a
# model: each cell takes its op from this table when it is built, so in graph mode the op is a plain
# function attribute of the cell and the product code path is the one that runs on Ascend.
FUSED_OPS = {
    "flash_attention_score": ops.flash_attention_score,
    "rotary_position_embedding": getattr(ops, "rotary_position_embedding", None),
    "rms_norm": ops.rms_norm,
    "swiglu": getattr(ops, "swiglu", None),
}


@contextlib.contextmanager
def fused_ops_replaced(replacements: Mapping[str, Callable]) -> Iterator[None]:
    """Models built inside the block call ``replacements`` instead of the fused Ascend ops (tests only)."""
    unknown = sorted(set(replacements) - set(FUSED_OPS))
    if unknown:
        raise KernelError(f"fused_ops_replaced: unknown op(s) {unknown}; expected some of {sorted(FUSED_OPS)}")
    saved = dict(FUSED_OPS)
    FUSED_OPS.update(replacements)
    try:
        yield
    finally:
        FUSED_OPS.clear()
        FUSED_OPS.update(saved)
