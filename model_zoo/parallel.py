"""Megatron-style tensor parallel for the Llama cells (Shoeybi et al. 2019, Megatron-LM's ``tensor_parallel``).

Each rank of a tensor-parallel (TP) group of ``size`` ranks holds a slice of every large weight:

- column parallel (output rows split): q/k/v (whole heads and KV heads per rank), gate/up (w1/w3);
- row parallel (input columns split): o (wo) and down (w2); their outputs are partial sums, added by
  one AllReduce (:class:`ReduceFromTP`);
- vocab parallel: the embedding rows and the LM head (tied or not) split by vocabulary; the embedding
  looks up only its own rows and the partial results are added; the loss is computed on the
  vocab-sharded logits (:class:`VocabParallelTokenLoss`), so the full logits never exist on one rank.

Two conjugate operators carry the gradients (Megatron's ``f`` and ``g``): :class:`CopyToTP` is the
identity forward and an AllReduce of the gradient backward (where a replicated activation enters the
sharded region); :class:`ReduceFromTP` is an AllReduce forward and the identity backward. Both are
cells with a custom ``bprop`` and compile in GRAPH_MODE. Norms stay replicated (their gradients are
equal on the TP ranks, which the global grad-norm counts once).

On the CPU, MindSpore's AllReduce has SUM only (``AllReduce only support reduce sum on CPU``) and
AllGather works on the world group only, so the row maximum of the loss is taken by an AllReduce SUM
of each rank's maxima placed in its own slot of a zero tensor (exact: one value plus zeros), then a
local max; on Ascend it is one AllReduce MAX (``TensorParallel.max_by_sum`` picks).
"""

from __future__ import annotations

import dataclasses

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from model_zoo.linear import Linear
from model_zoo.loss import IGNORE_INDEX


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """This rank's place in its tensor-parallel group."""

    size: int
    rank: int
    group: str              # the communication group of the TP ranks (mindspore.communication.create_group)
    max_by_sum: bool = False  # CPU: AllReduce has SUM only; the row max is an AllReduce SUM of per-rank slots

    def __post_init__(self):
        if not (self.size >= 1 and 0 <= self.rank < self.size):
            raise ValueError(f"TensorParallel: rank {self.rank} of size {self.size}")

    def part(self, n: int) -> tuple[int, int]:
        """(start, length) of this rank's contiguous share of ``n`` rows (``size`` divides ``n``)."""
        k = n // self.size
        return self.rank * k, k


# --------------------------------------------------------------------------- slicing a full tensor
def split_shard(full: np.ndarray, axis: int | None, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous slice of ``full`` along ``axis`` (None: replicated, the whole tensor)."""
    if axis is None or size == 1:
        return full
    if full.shape[axis] % size:
        raise ValueError(f"dimension {axis} of shape {list(full.shape)} does not split into {size}")
    return np.ascontiguousarray(np.split(full, size, axis=axis)[rank])


def merge_shards(parts: list[np.ndarray], axis: int | None) -> np.ndarray:
    """The inverse of :func:`split_shard` over all ranks: ``merge([split(x, a, r, n) for r]) == x``."""
    if axis is None or len(parts) == 1:
        return parts[0]
    return np.concatenate(parts, axis=axis)


def shard_layout(model: nn.Cell) -> dict[str, int]:
    """Parameter name -> the axis it is split along, for every TP-sharded parameter of ``model``
    (names missing here are replicated)."""
    out: dict[str, int] = {}
    for prefix, cell in model.cells_and_names():
        for pname, axis in getattr(cell, "tp_axes", {}).items():
            out[f"{prefix}.{pname}" if prefix else pname] = axis
    return out


# --------------------------------------------------------------------------- conjugate collectives
class CopyToTP(nn.Cell):
    """Megatron's ``f``: forward identity; backward AllReduce (SUM) of the gradient over the TP group.
    Placed where a replicated activation feeds column-parallel weights, so the gradient of the
    activation is the sum of every rank's partial."""

    def __init__(self, tp: TensorParallel):
        super().__init__()
        self.allreduce = ops.AllReduce(group=tp.group)

    def construct(self, x: Tensor) -> Tensor:
        return x

    def bprop(self, x, out, dout):
        return (self.allreduce(dout),)


class ReduceFromTP(nn.Cell):
    """Megatron's ``g``: forward AllReduce (SUM) over the TP group; backward identity (each rank's
    partial contributed once to the sum, so its gradient is the sum's gradient)."""

    def __init__(self, tp: TensorParallel):
        super().__init__()
        self.allreduce = ops.AllReduce(group=tp.group)

    def construct(self, x: Tensor) -> Tensor:
        return self.allreduce(x)

    def bprop(self, x, out, dout):
        return (dout,)


class TPMax(nn.Cell):
    """Element-wise maximum over the TP group, no gradient (it only shifts a softmax for stability).
    AllReduce MAX on Ascend; on the CPU an AllReduce SUM of the value placed in this rank's slot."""

    def __init__(self, tp: TensorParallel):
        super().__init__()
        self.by_sum = tp.max_by_sum
        if self.by_sum:
            self.allreduce = ops.AllReduce(group=tp.group)
            self.slot = Tensor(np.eye(tp.size, dtype=np.float32)[tp.rank])
            self.size = tp.size
        else:
            self.allreduce = ops.AllReduce(ops.ReduceOp.MAX, group=tp.group)

    def construct(self, x: Tensor) -> Tensor:
        x = ops.stop_gradient(x)
        if self.by_sum:
            slots = ops.reshape(self.slot, (self.size,) + (1,) * x.ndim) * ops.expand_dims(x, 0)
            # ops.amax, not Tensor.max(0): in PyNative that is torch's max(dim) and returns (values, indices)
            return ops.stop_gradient(ops.amax(self.allreduce(slots), 0))
        return ops.stop_gradient(self.allreduce(x))


# --------------------------------------------------------------------------- parallel layers
class ColumnParallelLinear(Linear):
    """Output features split over the TP ranks (q/k/v by whole heads, gate/up by intermediate rows). The
    input must already be in the TP region (after :class:`CopyToTP`); the output stays sharded."""

    def __init__(self, in_features: int, out_features: int, bias: bool, param_dtype: ms.Type,
                 compute_dtype: ms.Type, tp: TensorParallel):
        super().__init__(in_features, out_features // tp.size, bias, param_dtype, compute_dtype)
        self.tp_axes = {"weight": 0, "bias": 0} if bias else {"weight": 0}


class RowParallelLinear(Linear):
    """Input features split over the TP ranks (o, down); the partial products are added by one
    AllReduce (:class:`ReduceFromTP`), then the replicated bias."""

    def __init__(self, in_features: int, out_features: int, bias: bool, param_dtype: ms.Type,
                 compute_dtype: ms.Type, tp: TensorParallel):
        super().__init__(in_features // tp.size, out_features, bias, param_dtype, compute_dtype)
        self.tp_axes = {"weight": 1}
        self.reduce = ReduceFromTP(tp)

    def construct(self, x: Tensor) -> Tensor:
        y = self.reduce(self._local(x))
        if self.has_bias:
            y = y + ops.cast(self.bias, self.compute_dtype)
        if self.lora_on:   # x A_local^T summed over the group inside (model_zoo/lora.py), then the whole B
            y = y + self._lora(x)
        return y


class VocabParallelEmbedding(nn.Cell):
    """Rows [start, start + V/tp) of the embedding on this rank: ids outside the range look up row 0 and
    are zeroed, and the partial embeddings are added over the TP group (one id has one owner)."""

    def __init__(self, vocab: int, dim: int, param_dtype: ms.Type, compute_dtype: ms.Type, tp: TensorParallel):
        super().__init__()
        self.start, self.rows = tp.part(vocab)
        self.embedding_weight = Parameter(initializer(Normal(0.02), (self.rows, dim), param_dtype),
                                          name="embedding_weight")
        self.compute_dtype = compute_dtype
        self.reduce = ReduceFromTP(tp)
        self.tp_axes = {"embedding_weight": 0}

    def construct(self, ids: Tensor) -> Tensor:
        w = self.embedding_weight
        if w.dtype != self.compute_dtype:
            w = ops.cast(w, self.compute_dtype)   # cast, then gather, as Embedding does (no bf16 Gather on CPU)
        local = ids - self.start
        mine = ops.logical_and(local >= 0, local < self.rows)
        rows = ops.gather(w, ops.select(mine, local, ops.zeros_like(local)), 0)
        rows = rows * ops.expand_dims(ops.cast(mine, rows.dtype), -1)
        return self.reduce(rows)


class ParallelLogits(nn.Cell):
    """``(hidden, W_shard) -> hidden @ W_shard^T``: the vocab-parallel LM head (its weight is this rank's
    vocabulary rows, the embedding's when tied). The hidden state enters the TP region here."""

    def __init__(self, tp: TensorParallel):
        super().__init__()
        self.copy = CopyToTP(tp)
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, hidden: Tensor, weight: Tensor) -> Tensor:
        return self.matmul(self.copy(hidden), weight)


class VocabParallelTokenLoss(nn.Cell):
    """``shifted_token_loss`` on vocab-sharded logits (B, S, V/tp): the summed next-token cross-entropy
    and the counted tokens, equal on every TP rank, with no gathering of the logits.

    Per row: m = max over the group of the local maxima (no gradient), Z = AllReduce SUM of the local
    sums of exp(l - m), z = AllReduce SUM of the target's shifted logit (zero on ranks that do not own
    the target); loss = log Z - z. Both sums go through :class:`ReduceFromTP`, so the gradient of the
    local logits is softmax - one_hot on this rank's columns, as Megatron's vocab-parallel CE."""

    def __init__(self, tp: TensorParallel, vocab: int):
        super().__init__()
        self.start, self.cols = tp.part(vocab)
        self.row_max = TPMax(tp)
        self.sum_exp = ReduceFromTP(tp)
        self.sum_target = ReduceFromTP(tp)

    def construct(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        logits = ops.cast(logits[:, :-1, :], ms.float32)
        target = labels[:, 1:]
        valid = target != IGNORE_INDEX
        local = ops.cast(target, ms.int32) - self.start
        mine = ops.logical_and(valid, ops.logical_and(local >= 0, local < self.cols))
        shifted = logits - self.row_max(logits.max(-1, keepdims=True))
        z = self.sum_exp(ops.exp(shifted).sum(-1))
        picked = ops.squeeze(ops.gather_elements(shifted, 2, ops.expand_dims(
            ops.select(mine, local, ops.zeros_like(local)), -1)), -1)
        picked = self.sum_target(picked * ops.cast(mine, ms.float32))
        validf = ops.cast(valid, ms.float32)
        return ((ops.log(z) - picked) * validf).sum(), validf.sum()
