"""MindSpore cells over port's CPU kernels (:mod:`model_zoo.cpu_kernels`): RMSNorm, RoPE and causal
attention (plain and packed rows) as ``ops.Custom`` AOT ops, forward and backward.

The attention, RoPE and RMSNorm cells of :mod:`model_zoo.llama` build these when the kernel plan picks
the ``cpu`` implementation (:func:`model_zoo.kernels.select_kernels`); each cell loads the compiled
library when it is built (:func:`cpu_library`, :class:`~model_zoo.errors.KernelError` where it is
unavailable); ``isa`` forces a code path (tests), default :func:`model_zoo.cpu_kernels.selected_isa`.
Float32 only; the backward kernel of each is the Custom op's ``bprop``, so the cells are differentiable
in PyNative and graph mode.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, nn, ops

from model_zoo import cpu_kernels
from model_zoo.errors import KernelError


def cpu_library(isa: str | None = None) -> str:
    """The compiled library of code path ``isa`` (default: :func:`model_zoo.cpu_kernels.selected_isa`)."""
    lib, why = cpu_kernels.status(isa)
    if lib is None:
        raise KernelError(f"port's CPU kernels are unavailable: {why}")
    return lib


class CpuRmsNorm(nn.Cell):
    """``(x, weight) -> weight * (x * rsqrt(mean(x^2) + eps))`` in float32 through port's C++ kernel
    (:mod:`model_zoo.cpu_kernels`); the backward kernel is the Custom op's bprop."""

    def __init__(self, eps: float, isa: str | None = None):
        super().__init__()
        lib = cpu_library(isa)
        self.eps = Tensor([eps], ms.float32)
        backward = ops.Custom(f"{lib}:RmsNormBackward", func_type="aot",
                              out_shape=lambda x, w, rstd, dy: (x, w), out_dtype=lambda x, w, rstd, dy: (x, w))

        def bprop(x, w, eps, out, dout):
            dx, dw = backward(x, w, out[1], dout[0])
            return dx, dw, ops.zeros_like(eps)

        # Outputs: the normalised x and 1/rms per row, kept for the backward.
        self.forward = ops.Custom(f"{lib}:RmsNormForward", func_type="aot",
                                  out_shape=lambda x, w, eps: (x, x[:-1]), out_dtype=lambda x, w, eps: (x, x),
                                  bprop=bprop)

    def construct(self, x: Tensor, weight: Tensor) -> Tensor:
        return self.forward(x, weight, self.eps)[0]


class CpuRope(nn.Cell):
    """``(x, cos, sin) -> x*cos + rotate_half(x)*sin`` for x (B, N, S, D), cos/sin (S, D) in float32 through
    port's C++ kernel (:mod:`model_zoo.cpu_kernels`); the backward applies the transposed rotation."""

    def __init__(self, isa: str | None = None):
        super().__init__()
        lib = cpu_library(isa)
        backward = ops.Custom(f"{lib}:RopeBackward", func_type="aot",
                              out_shape=lambda dy, cos, sin: dy, out_dtype=lambda dy, cos, sin: dy)

        def bprop(x, cos, sin, out, dout):
            return backward(dout, cos, sin), ops.zeros_like(cos), ops.zeros_like(sin)

        self.forward = ops.Custom(f"{lib}:RopeForward", func_type="aot", out_shape=lambda x, cos, sin: x,
                                  out_dtype=lambda x, cos, sin: x, bprop=bprop)

    def construct(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return self.forward(x, cos, sin)


class CpuCausalAttention(nn.Cell):
    """``(q, k, v) -> out`` through port's C++ kernel (:mod:`model_zoo.cpu_kernels`): q (B, N, S, D),
    k/v (B, G, S, D) float32 with N % G == 0, queries and keys of equal length, scale 1/sqrt(D).
    Differentiable in PyNative and graph mode (the backward kernel is the Custom op's bprop)."""

    def __init__(self, isa: str | None = None):
        super().__init__()
        lib = cpu_library(isa)
        backward = ops.Custom(f"{lib}:CausalAttentionBackward", func_type="aot",
                              out_shape=lambda q, k, v, o, lse, do: (q, k, v),
                              out_dtype=lambda q, k, v, o, lse, do: (q, k, v))

        def bprop(q, k, v, out, dout):
            return backward(q, k, v, out[0], out[1], dout[0])

        # Outputs: attention (B, N, S, D) and the per-row log-sum-exp (B, N, S) kept for the backward.
        self.forward = ops.Custom(f"{lib}:CausalAttentionForward", func_type="aot",
                                  out_shape=lambda q, k, v: (q, q[:3]), out_dtype=lambda q, k, v: (q, q),
                                  bprop=bprop)

    def construct(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.forward(q, k, v)[0]


class CpuPackedAttention(nn.Cell):
    """``(q, k, v, segment_ids) -> out``: :class:`CpuCausalAttention` for packed rows, where each query
    sees only the keys of its own run of equal segment ids (segment_ids (B, S) int32)."""

    def __init__(self, isa: str | None = None):
        super().__init__()
        lib = cpu_library(isa)
        backward = ops.Custom(f"{lib}:PackedAttentionBackward", func_type="aot",
                              out_shape=lambda q, k, v, seg, o, lse, do: (q, k, v),
                              out_dtype=lambda q, k, v, seg, o, lse, do: (q, k, v))

        def bprop(q, k, v, seg, out, dout):
            dq, dk, dv = backward(q, k, v, seg, out[0], out[1], dout[0])
            return dq, dk, dv, ops.zeros_like(seg)

        self.forward = ops.Custom(f"{lib}:PackedAttentionForward", func_type="aot",
                                  out_shape=lambda q, k, v, seg: (q, q[:3]), out_dtype=lambda q, k, v, seg: (q, q),
                                  bprop=bprop)

    def construct(self, q: Tensor, k: Tensor, v: Tensor, segment_ids: Tensor) -> Tensor:
        return self.forward(q, k, v, segment_ids)[0]
