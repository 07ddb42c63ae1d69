"""The linear layer of the zoo's models (``model_zoo.llama``) and, on one rank's shard, of tensor parallel
(``model_zoo.parallel``'s column- and row-parallel layers subclass it)."""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, Zero, initializer


class Linear(nn.Cell):
    """y = x @ W^T (+ b) with W stored (out, in) as in HF."""

    def __init__(self, in_features: int, out_features: int, bias: bool, param_dtype: ms.Type,
                 compute_dtype: ms.Type, init_std: float = 0.02):
        super().__init__()
        self.weight = Parameter(initializer(Normal(init_std), (out_features, in_features), param_dtype), name="weight")
        self.has_bias = bias
        self.bias = Parameter(initializer(Zero(), (out_features,), param_dtype), name="bias") if bias else None
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.matmul = ops.MatMul(transpose_b=True)

    def _local(self, x: Tensor) -> Tensor:
        """x @ W^T in the compute dtype, without the bias (a row-parallel layer adds it after its AllReduce)."""
        shape = x.shape
        x2 = ops.reshape(ops.cast(x, self.compute_dtype), (-1, shape[-1]))
        y = self.matmul(x2, ops.cast(self.weight, self.compute_dtype))
        return ops.reshape(y, shape[:-1] + (self.out_features,))

    def construct(self, x: Tensor) -> Tensor:
        y = self._local(x)
        if self.has_bias:
            y = y + ops.cast(self.bias, self.compute_dtype)
        return y
