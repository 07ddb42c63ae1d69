"""The linear layer of the zoo's models (``model_zoo.llama``) and, on one rank's shard, of tensor parallel
(``model_zoo.parallel``'s column- and row-parallel layers subclass it)."""

from __future__ import annotations

import contextlib
from typing import Iterator

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
        # LoRA (model_zoo/lora.py attach): off unless attached; graph mode resolves the flag when it compiles
        self.lora_on = False
        self.lora_a_sum = None     # column parallel: CopyToTP on lora_A (its gradient added over the TP group)
        self.lora_h_sum = None     # row parallel: ReduceFromTP on x A^T (each rank's columns' partial sum)
        self.lora_dropout = None   # nn.Dropout on the adapter's input when lora dropout > 0 (PEFT: nn.Identity at 0)
        self.lora_scaling = 1.0

    def _local(self, x: Tensor) -> Tensor:
        """x @ W^T in the compute dtype, without the bias (a row-parallel layer adds it after its AllReduce)."""
        shape = x.shape
        x2 = ops.reshape(ops.cast(x, self.compute_dtype), (-1, shape[-1]))
        y = self.matmul(x2, ops.cast(self.weight, self.compute_dtype))
        return ops.reshape(y, shape[:-1] + (self.out_features,))

    def _lora(self, x: Tensor) -> Tensor:
        """PEFT's ``lora_B(lora_A(dropout(x))) * scaling`` in the compute dtype (model_zoo/lora.py)."""
        shape = x.shape
        x2 = ops.reshape(ops.cast(x, self.compute_dtype), (-1, shape[-1]))
        if self.lora_dropout is not None:
            x2 = self.lora_dropout(x2)
        a = ops.cast(self.lora_A.weight, self.compute_dtype)
        if self.lora_a_sum is not None:
            a = self.lora_a_sum(a)
        h = self.matmul(x2, a)
        if self.lora_h_sum is not None:
            h = self.lora_h_sum(h)
        y = self.matmul(h, ops.cast(self.lora_B.weight, self.compute_dtype)) * self.lora_scaling
        return ops.reshape(y, shape[:-1] + (self.out_features,))

    def construct(self, x: Tensor) -> Tensor:
        y = self._local(x)
        if self.has_bias:
            y = y + ops.cast(self.bias, self.compute_dtype)
        if self.lora_on:   # after the bias, as PEFT adds it to base_layer(x)
            y = y + self._lora(x)
        return y


@contextlib.contextmanager
def deferred_parameters() -> Iterator[None]:
    """Parameters made from an ``initializer`` inside the block hold no data until ``set_data`` gives them a
    loaded checkpoint's values (or ``Cell.init_parameters_data()`` draws them, for what nothing loaded): no
    host memory and no random draw for weights a checkpoint overwrites. It is the mechanism of MindSpore's
    ``mindspore.nn.utils.no_init_parameters`` (mindspore/nn/utils/init.py sets ``Parameter.init_param =
    False``; mindspore/common/parameter.py ``_get_parameter_new_args`` then skips ``init_data()``, which it
    otherwise calls at once outside semi/auto parallel); that function is deprecated after 2.9, so the
    class attribute it sets is set here."""
    had = "init_param" in Parameter.__dict__
    old = Parameter.__dict__.get("init_param")
    Parameter.init_param = False
    try:
        yield
    finally:
        if had:
            Parameter.init_param = old
        else:
            del Parameter.init_param


def on_device(value: Tensor, name: str, requires_grad: bool = False) -> Parameter:
    """A Parameter holding ``value`` (a tensor an op made on the device: ``ops.zeros``, a cast, a concat)
    without a host copy. ``Parameter(tensor)`` copies the tensor through NumPy unless nothing else refers
    to it (mindspore/common/parameter.py ``_get_parameter_new_args``: ``data.asnumpy()`` unless the
    reference count is 4); a deferred parameter given the tensor by ``set_data`` takes it as it is."""
    with deferred_parameters():
        p = Parameter(initializer(Zero(), value.shape, value.dtype), name=name, requires_grad=requires_grad)
    return p.set_data(value)
