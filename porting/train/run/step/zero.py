"""The sharded optimizer (ZeRO-1/2, Megatron's distributed optimizer) as graph-mode cells.

The layout and the collectives are :mod:`porting.train.plan.sharding`'s (the plan states the same buckets):
gradients of a bucket are flattened, padded to a multiple of the data-parallel size ``dp`` and
reduce-scattered; each rank updates its flat shard (AdamW with float32 moments, on float32 master
weights when the parameters are bf16/fp16, or on its slice of the float32 parameters); the updated
shards are all-gathered in the parameter dtype and copied back into every parameter.

Reduce-scatter by capability: ``ops.ReduceScatter`` where the backend has one (HCCL), else an
``AllReduce`` of the flat bucket and a slice of this rank's shard (MindSpore's CPU ReduceScatter is a
stub). Both give every rank the same summed shard, so the update equals the unsharded one: the global
norm is the square root of the all-reduced sum of the shards' squares (the padding is zero).

Tensor parallel: the optimizer runs over the data-parallel group (``group``; ``rank``, ``dp`` its
coordinates) on this tensor-parallel rank's slices. ``tp_sharded`` flags the parameters split over
the tensor-parallel group: their squares, summed over the runs of the bucket shard they fill (static
slices: no per-element mask on the device, which at 13B TP 8 held 0.76 GiB), are all-reduced over
``tp_group`` too, while the replicated ones (norms) count once.

Every state is made on the device (``ops.zeros``, this rank's range of the bucket cut from the cast
parameters), never as a NumPy array: the host holds none of it (model_zoo/linear.py ``on_device``). The updated shards are gathered
by AllGather, or (``gather_native=False``: the CPU, whose AllGather works on the world group only) by
an AllReduce of a zero buffer holding this rank's shard at its offset. State names carry both ranks
(``adam_m.shard3.tp1.rank0``) so they are unique in the merged tensor-parallel checkpoint.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.communication import GlobalComm

from model_zoo.linear import on_device
from porting.train.plan import sharding
from porting.train.plan.layout import DTYPE_BYTES, Bucket
from porting.train.run.step.cells import LossNet
from porting.train.recipe.schema import Recipe


class ShardedAdamW(nn.Cell):
    """torch.optim.AdamW on this rank's flat shard of every bucket, parameters all-gathered after.

    State names carry the rank (``adam_m.shard3.rank1``): each rank checkpoints its own shards.
    ``stage`` 2 (ZeRO-2) means the caller reduce-scatters every micro-step (:class:`ShardedAccumGradStep`).
    """

    def __init__(self, params: list[Parameter], betas: tuple[float, float], eps: float, weight_decay: float, *,
                 rank: int, dp: int, buckets: list[Bucket], native: bool, grad_dtype=ms.float32,
                 stage: int = 1, group: str | None = None, master_weights: bool = True, gather_native: bool = True,
                 tp_group: str | None = None, tp_rank: int = 0, tp_sharded: list[bool] | None = None):
        super().__init__(auto_prefix=False)
        group = group or GlobalComm.WORLD_COMM_GROUP
        self.params = ParameterTuple(params)
        self.rank, self.dp, self.native, self.stage, self.grad_dtype = rank, dp, native, stage, grad_dtype
        self.gather_native = gather_native
        self.bucket_idx = tuple(tuple(b.indices) for b in buckets)
        self.pads = tuple(b.padded - b.numel for b in buckets)
        self.shard_sizes = tuple(b.shard(dp) for b in buckets)
        self.numels = tuple(int(np.prod(p.shape)) for p in params)
        self.shapes = tuple(tuple(p.shape) for p in params)
        self.use_masters = bool(master_weights and any(p.dtype != ms.float32 for p in params))
        self.tag = f"rank{rank}" if tp_group is None else f"tp{tp_rank}.rank{rank}"
        zeros = lambda kind: ParameterTuple([on_device(ops.zeros((n,), ms.float32), f"{kind}.shard{k}.{self.tag}")  # noqa: E731
                                             for k, n in enumerate(self.shard_sizes)])
        self.m, self.v = zeros("adam_m"), zeros("adam_v")
        # this rank's range of each bucket only, one parameter at a time: never a full fp32 copy of the model
        self.masters = ParameterTuple([on_device(self._own(params, b, rank * n, (rank + 1) * n),
                                                 f"master.shard{k}.{self.tag}")
                                       for k, (b, n) in enumerate(zip(buckets, self.shard_sizes))]) \
            if self.use_masters else ParameterTuple([])
        self.reduce_scatter = ops.ReduceScatter(ops.ReduceOp.SUM, group)
        self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, group)
        if gather_native:
            self.allgather = ops.AllGather(group)
        self.tp_norm = tp_group is not None
        if self.tp_norm:
            self.tp_allreduce = ops.AllReduce(ops.ReduceOp.SUM, tp_group)
            self.tp_runs = tuple(self._tp_runs(b, tp_sharded, rank * n, (rank + 1) * n)
                                 for b, n in zip(buckets, self.shard_sizes))
        self.b1, self.b2 = Tensor(betas[0], ms.float32), Tensor(betas[1], ms.float32)
        self.eps, self.wd = Tensor(eps, ms.float32), Tensor(weight_decay, ms.float32)

    def _tp_runs(self, b: Bucket, tp_sharded: list[bool], lo: int, hi: int) -> tuple[tuple, tuple]:
        """(runs of TP-sharded elements, runs of replicated ones) of shard [lo, hi) of bucket ``b``, as
        (start, end) positions in the shard, neighbours of one kind merged (the padding is in neither)."""
        runs: tuple[list, list] = ([], [])
        off = 0
        for i in b.indices:
            a, e = max(lo, off) - lo, min(hi, off + self.numels[i]) - lo
            if a < e:
                side = runs[0] if tp_sharded[i] else runs[1]
                if side and side[-1][1] == a:
                    side[-1] = (side[-1][0], e)
                else:
                    side.append((a, e))
            off += self.numels[i]
        return tuple(runs[0]), tuple(runs[1])

    @staticmethod
    def _own(params: list[Parameter], b: Bucket, lo: int, hi: int) -> Tensor:
        """Elements [lo, hi) of the bucket's flat float32 buffer (zero padding past its end), on the device."""
        out = ops.zeros((hi - lo,), ms.float32)
        off = 0
        for i in b.indices:
            n = int(np.prod(params[i].shape))
            a, e = max(lo, off), min(hi, off + n)
            if a < e:
                out[a - lo:e - lo] = ops.reshape(ops.cast(params[i], ms.float32), (-1,))[a - off:e - off]
            off += n
        return out

    def shard_buffers(self, grad_fp32: bool = True) -> ParameterTuple:
        """Zeroed ZeRO-2 accumulators, one per bucket shard (float32, or the reduction dtype)."""
        dt = ms.float32 if grad_fp32 else self.grad_dtype
        return ParameterTuple([Parameter(ops.zeros((n,), dt), name=f"accum.shard{k}.rank{self.rank}",
                                         requires_grad=False) for k, n in enumerate(self.shard_sizes)])

    def _flatten(self, values, k: int, dtype, after=None):
        """Bucket ``k`` of ``values`` as one padded flat buffer; built after ``after`` when given (one
        bucket's buffers live at a time: the plan's zero_bucket_concat counts one, memory_terms.py)."""
        parts = ()
        for i in self.bucket_idx[k]:
            v = values[i] if after is None or parts else ops.depend(values[i], after)
            parts += (ops.reshape(ops.cast(v, dtype), (-1,)),)
        if self.pads[k] > 0:
            parts += (ops.zeros((self.pads[k],), dtype),)
        return ops.concat(parts) if len(parts) > 1 else parts[0]

    def _scatter(self, flat, k: int):
        if self.native:
            return self.reduce_scatter(flat)
        n = self.shard_sizes[k]
        return self.allreduce(flat)[self.rank * n:(self.rank + 1) * n]   # CPU: AllReduce + this rank's slice

    def _gather(self, shard, k: int):
        if self.gather_native:
            return self.allgather(shard)
        n = self.shard_sizes[k]   # CPU sub-group: this rank's shard at its offset in zeros, summed over the group
        parts = ((ops.zeros((self.rank * n,), shard.dtype),) if self.rank else ()) + (shard,)
        if self.rank < self.dp - 1:
            parts += (ops.zeros(((self.dp - 1 - self.rank) * n,), shard.dtype),)
        return self.allreduce(ops.concat(parts))

    def reduce(self, grads):
        """Every bucket's summed gradient shard on this rank (in ``grad_dtype``)."""
        out = ()
        for k in range(len(self.bucket_idx)):
            out += (self._scatter(self._flatten(grads, k, self.grad_dtype, out[-1] if out else None), k),)
        return out

    def apply(self, shards, unscale: Tensor, lr: Tensor, bc1: Tensor, bc2: Tensor, clip: bool, max_norm: Tensor):
        """Unscale, global norm, clip, AdamW on the shards, all-gather; returns (norm, finite)."""
        gs = ()
        sq = ops.zeros((), ms.float32)
        sq_tp = ops.zeros((), ms.float32)   # tensor parallel: squares of the sharded parameters' elements
        for k in range(len(shards)):
            g = ops.cast(shards[k], ms.float32) * unscale
            gs += (g,)
            if self.tp_norm:
                g2 = g * g
                for a, e in self.tp_runs[k][0]:
                    sq_tp = sq_tp + g2[a:e].sum()
                for a, e in self.tp_runs[k][1]:
                    sq = sq + g2[a:e].sum()
            else:
                sq = sq + (g * g).sum()
        if self.tp_norm:
            both = self.allreduce(ops.stack((sq, sq_tp)))
            norm = ops.sqrt(both[0] + self.tp_allreduce(both[1]))
        else:
            norm = ops.sqrt(self.allreduce(sq))
        finite = ops.isfinite(norm)
        coef = ops.minimum(max_norm / (norm + 1e-6), ops.ones((), ms.float32)) if clip else ops.ones((), ms.float32)
        done = ()
        for k in range(len(gs)):
            g = gs[k] * coef if not done else ops.depend(gs[k] * coef, done[-1])   # one bucket's gather at a time
            done += (self._update(k, g, lr, bc1, bc2, finite),)
        return ops.depend(norm, done), finite

    def _update(self, k: int, g, lr, bc1, bc2, finite):
        n = self.shard_sizes[k]
        if self.use_masters:
            p = self.masters[k]
        else:
            p = self._flatten(self.params, k, ms.float32)[self.rank * n:(self.rank + 1) * n]
        m_new = self.b1 * self.m[k] + (1.0 - self.b1) * g
        v_new = self.b2 * self.v[k] + (1.0 - self.b2) * g * g
        p_new = p * (1.0 - lr * self.wd) - (lr / bc1) * m_new / (ops.sqrt(v_new) / ops.sqrt(bc2) + self.eps)
        kept = ops.select(finite, p_new, p)
        done = (ops.assign(self.m[k], ops.select(finite, m_new, self.m[k])),
                ops.assign(self.v[k], ops.select(finite, v_new, self.v[k])))
        if self.use_masters:
            done += (ops.assign(self.masters[k], kept),)
        first = self.bucket_idx[k][0]
        full = self._gather(ops.cast(ops.depend(kept, done), self.params[first].dtype), k)
        off = 0
        for i in self.bucket_idx[k]:
            done += (ops.assign(self.params[i], ops.reshape(full[off:off + self.numels[i]], self.shapes[i])),)
            off += self.numels[i]
        return done


class ShardedAccumGradStep(nn.Cell):
    """ZeRO-2: one micro-batch's gradients reduce-scattered at once and added to the shard accumulators."""

    def __init__(self, model: nn.Cell, optimizer: ShardedAdamW, buffers: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.grad_fn = ops.value_and_grad(LossNet(model), None, optimizer.params, has_aux=True)
        self.optimizer, self.buffers = optimizer, buffers

    def construct(self, input_ids, labels, scale, *packed):
        # packed: positions, segment ids and sequence ends of packed rows, as step.AccumGradStep takes them
        (_, (total, count)), grads = self.grad_fn(input_ids, labels, scale, *packed)
        shards = self.optimizer.reduce(grads)
        done = ()
        for k in range(len(shards)):
            done += (ops.assign_add(self.buffers[k], ops.cast(shards[k], self.buffers[k].dtype)),)
        return ops.depend(total, done), count


def optimizer_for(recipe: Recipe, cfg, params: list[Parameter], rank: int, dp: int, *, group: str | None = None,
                  reduce_scatter: str | None = None, **tp) -> tuple[ShardedAdamW, sharding.ShardingChoice]:
    """The sharded optimizer of a recipe over a data-parallel group of ``dp`` ranks (this one ``rank``),
    with the plan's choice of stage, reduce-scatter and all-gather (``reduce_scatter`` forces one: tests
    compile the Ascend path on the CPU). ``tp``: ``tp_group``, ``tp_rank``, ``tp_sharded`` of a
    tensor-parallel run (see :class:`ShardedAdamW`)."""
    choice = sharding.choose(recipe, cfg)
    native = (reduce_scatter or choice.reduce_scatter) == sharding.NATIVE
    prec, opt = recipe.precision, recipe.optimizer
    low = prec.grad_reduce_dtype != "float32"
    grad_dtype = params[0].dtype if low else ms.float32
    gb = 4 if not low else DTYPE_BYTES[prec.param_dtype]
    numels = [int(np.prod(p.shape)) for p in params]
    buckets = sharding.flat_buckets(numels, gb, recipe.parallel.comm_fusion, dp)
    optim = ShardedAdamW(params, tuple(opt.betas), opt.eps, opt.weight_decay, rank=rank, dp=dp, buckets=buckets,
                         native=native, grad_dtype=grad_dtype, stage=choice.stage, group=group,
                         gather_native=choice.all_gather == sharding.GATHER_NATIVE, **tp)
    return optim, choice
