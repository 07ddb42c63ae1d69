"""RMSNorm cells of the Llama family: the layer norms, the tensor-parallel norm that feeds the TP region,
and Qwen3's per-head q/k norm. Each runs the kernel plan's RMSNorm choice: the fused Ascend op
(``ops.rms_norm``, from :data:`model_zoo.fused_ops.FUSED_OPS`), port's C++ CPU kernel, or plain ops.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import One, initializer

from model_zoo import kernels, parallel
from model_zoo.config import LlamaConfig
from model_zoo.cpu_cells import CpuRmsNorm
from model_zoo.fused_ops import FUSED_OPS
from model_zoo.parallel import TensorParallel


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float, param_dtype: ms.Type, impl: str):
        super().__init__()
        self.weight = Parameter(initializer(One(), (dim,), param_dtype), name="weight")
        self.eps = eps
        self.fused = impl == "fused"
        # The op is taken from FUSED_OPS when the cell is built (the test hook, see FUSED_OPS).
        self.rms_norm_op = FUSED_OPS["rms_norm"] if self.fused else None
        self.cpu = CpuRmsNorm(eps) if impl == kernels.CPU_IMPL else None

    def construct(self, x: Tensor) -> Tensor:
        return self.normalise(x, self.weight)

    def normalise(self, x: Tensor, w: Tensor) -> Tensor:
        """RMSNorm of ``x`` over its last dimension, scaled by ``w`` (the weight, or its TP-tagged copy)."""
        if self.fused:
            # ops.rms_norm (MindSpore <= 2.10 signature, checked at plan time) returns (y, rstd).
            return self.rms_norm_op(x, ops.cast(w, x.dtype), self.eps)[0]
        if self.cpu is not None and x.dtype == ms.float32 and self.weight.dtype == ms.float32:
            return self.cpu(x, w)
        dtype = x.dtype
        xf = ops.cast(x, ms.float32)
        var = ops.mean(ops.square(xf), -1, keep_dims=True)
        y = ops.cast(xf * ops.rsqrt(var + self.eps), dtype)
        return ops.cast(w, dtype) * y


class HeadNorm(RMSNorm):
    """Qwen3's per-head RMSNorm on q or k (over head_dim, one weight shared by the heads), before RoPE.

    Tensor parallel: the weight is replicated, but each rank normalises only its own heads, so each rank's
    gradient of it is a partial sum; :class:`parallel.CopyToTP` on the weight adds the partials (forward
    identity, backward AllReduce), as transformers' Qwen3 TP plan does ("replicated_with_grad_allreduce").
    Parameter name as RMSNorm's (``weight``)."""

    def __init__(self, dim: int, eps: float, param_dtype: ms.Type, impl: str, tp: TensorParallel | None):
        super().__init__(dim, eps, param_dtype, impl)
        self.grad_sum = parallel.CopyToTP(tp) if tp is not None else None

    def construct(self, x: Tensor) -> Tensor:
        return self.normalise(x, self.weight if self.grad_sum is None else self.grad_sum(self.weight))


class NormIntoTP(RMSNorm):
    """Tensor parallel: an RMSNorm whose output enters the TP region (:class:`parallel.CopyToTP`, one
    gradient AllReduce for all the column-parallel projections it feeds). Parameter names as RMSNorm."""

    def __init__(self, dim: int, eps: float, param_dtype: ms.Type, impl: str, tp: TensorParallel):
        super().__init__(dim, eps, param_dtype, impl)
        self.copy = parallel.CopyToTP(tp)

    def construct(self, x: Tensor) -> Tensor:
        return self.copy(super().construct(x))


def norm_for(cfg: LlamaConfig, param_dtype: ms.Type, impl: str, tp: TensorParallel | None) -> RMSNorm:
    if tp is None:
        return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype, impl)
    return NormIntoTP(cfg.hidden_size, cfg.rms_norm_eps, param_dtype, impl, tp)
