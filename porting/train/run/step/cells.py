"""The MindSpore side of a training step, as graph-mode cells.

- :class:`FusedTrainStep` (grad_accum_steps == 1): forward, backward, gradient all-reduce, clip and
  AdamW in ONE graph, the fast way on CPU (about 2x a jitted value_and_grad plus a separate
  optimizer call; see BENCHMARKS.md).
- :class:`AccumGradStep` + :class:`ApplyStep` (grad_accum_steps > 1): one graph adds a micro-batch's
  gradients into float32 buffers, the other all-reduces them, clips and updates. MindSpore's own
  GradAccumulation works in semi-auto parallel only, so plain data parallel accumulates here.

Loss normalisation: every micro-batch's summed token loss is multiplied by ``scale = loss_scale /
global_tokens`` (an input), so the summed gradients over micro-batches and ranks are exactly the
gradient of the step's mean token loss, whatever the lengths of the micro-batches.
AdamW is written out to match ``torch.optim.AdamW`` term by term (the baseline compares against it).
Mixed precision as Megatron / MindSpeed-LLM: bf16/fp16 parameters are the compute copy, AdamW keeps
float32 master weights and moments (sharded with optimizer sharding: porting/train/run/step/zero.py), and gradients are all-reduced,
clipped and applied in float32 (``grad_fp32=False``: reduced in the parameter dtype, still applied to
the float32 masters). Data parallel sums the gradients over its ranks in port's own buckets
(porting/train/run/step/buckets.py: one AllReduce per bucket of ``parallel.comm_fusion``, in backward order; in
PyNative each launched during the backward).
When the gradients or the loss are not finite the update is skipped inside the graph (parameters and states
keep their values) and the caller decides: lower the dynamic loss scale, count the skip, or stop the run.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from model_zoo.linear import on_device
from model_zoo.loss import shifted_token_loss
from porting.train.recipe.schema import CommFusionSection
from porting.train.run.step import buckets as grad_buckets


class LossNet(nn.Cell):
    """(scaled loss, (summed token loss, token count)) for one micro-batch."""

    def __init__(self, model: nn.Cell):
        super().__init__(auto_prefix=False)
        self.model = model
        # Tensor parallel: the logits are vocab-sharded and the model brings its parallel loss.
        self.parallel_loss = getattr(model, "parallel_loss", None)

    def construct(self, input_ids: Tensor, labels: Tensor, scale: Tensor, *packed):
        # packed: positions, segment ids and sequence ends of packed rows (porting/train/data/packing.py)
        logits = self.model(input_ids, *packed)
        if self.parallel_loss is not None:
            total, count = self.parallel_loss(logits, labels)
        else:
            total, count = shifted_token_loss(logits, labels)
        return total * scale, (total, count)


_adamw = ops.MultitypeFuncGraph("adamw")


@_adamw.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                 "Tensor", "Tensor", "Tensor", "Tensor")
def _adamw_update(b1, b2, eps, wd, lr, bc1, bc2, finite, param, m, v, grad):
    """torch.optim.AdamW: p *= 1 - lr*wd; m, v moments; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)."""
    g = ops.cast(grad, ms.float32)
    p = ops.cast(param, ms.float32)
    m_new = b1 * m + (1.0 - b1) * g
    v_new = b2 * v + (1.0 - b2) * g * g
    p_new = p * (1.0 - lr * wd)
    p_new = p_new - (lr / bc1) * m_new / (ops.sqrt(v_new) / ops.sqrt(bc2) + eps)
    ops.assign(m, ops.select(finite, m_new, m))
    ops.assign(v, ops.select(finite, v_new, v))
    ops.assign(param, ops.cast(ops.select(finite, p_new, p), param.dtype))
    return finite


_adamw_master = ops.MultitypeFuncGraph("adamw_master")


@_adamw_master.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                        "Tensor", "Tensor", "Tensor", "Tensor", "Tensor")
def _adamw_master_update(b1, b2, eps, wd, lr, bc1, bc2, finite, master, param, m, v, grad):
    """The same update on the float32 master weight; the compute parameter gets its rounding."""
    g = ops.cast(grad, ms.float32)
    m_new = b1 * m + (1.0 - b1) * g
    v_new = b2 * v + (1.0 - b2) * g * g
    p_new = master * (1.0 - lr * wd)
    p_new = p_new - (lr / bc1) * m_new / (ops.sqrt(v_new) / ops.sqrt(bc2) + eps)
    kept = ops.select(finite, p_new, master)
    ops.assign(m, ops.select(finite, m_new, m))
    ops.assign(v, ops.select(finite, v_new, v))
    ops.assign(master, kept)
    ops.assign(param, ops.cast(kept, param.dtype))
    return finite


_round_store = ops.MultitypeFuncGraph("round_store")


@_round_store.register("Function", "Tuple", "Tensor")
def _round_store_t(rounder, after, param):
    value = ops.depend(param, after)
    return ops.assign(param, rounder(value))


def _round_bf16(x):
    return ops.cast(ops.cast(x, ms.bfloat16), ms.float32)


def _round_fp16(x):
    return ops.cast(ops.cast(x, ms.float16), ms.float32)


_adamw_fused = ops.MultitypeFuncGraph("adamw_fused")


@_adamw_fused.register("Function", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                       "Tensor")
def _adamw_fused_update(kernel, b1, b2, eps_t, decay_t, lr_t, param, m, v, grad):
    """The same update through MindSpore's one-kernel AdamWeightDecay (in place)."""
    return kernel(param, m, v, lr_t, b1, b2, eps_t, decay_t, grad)[0]


class AdamW(nn.Cell):
    """AdamW with float32 moments named ``adam_m.<param>`` / ``adam_v.<param>`` (saved in checkpoints).

    Where every parameter is float32 and nothing is sharded, the update runs as MindSpore's fused
    ``AdamWeightDecay`` kernel, one launch per parameter instead of about twenty (on the CPU the
    element-wise update was a third of a small step). That kernel has no bias correction, so it is
    folded into its scalars: with s = sqrt(1 - beta2^t), lr' = lr * s / (1 - beta1^t), eps' = eps * s
    and decay' = weight_decay * (1 - beta1^t) / s, its update p -= lr' * (m / (sqrt(v) + eps') + decay' * p)
    is torch's p = p * (1 - lr * wd) - lr / (1 - beta1^t) * m / (sqrt(v) / s + eps). A step with a
    non-finite gradient applies nothing, on both paths.

    Every rank holds every state here; optimizer sharding is :class:`porting.train.run.step.zero.ShardedAdamW`.

    Master weights (Megatron / MindSpeed-LLM mixed precision): when the parameters are stored in
    bfloat16/float16, the update runs on float32 copies ``master.<param>`` (sharded with the moments:
    a rank keeps masters only for what it owns) and the compute parameter gets the master rounded to
    its dtype. Without them an update smaller than half a bf16 ULP of the weight is lost (at lr 1e-5
    most are). ``master_weights=False`` keeps the old behaviour (tests measure the difference).
    ``storage_dtype`` emulates a low-precision storage on float32 parameters (every write is rounded to
    it): the CPU backend has no bfloat16 Assign, so CPU tests run bf16 storage this way; on Ascend the
    parameters are bf16 themselves and it stays None.
    """

    def __init__(self, params: list[Parameter], betas: tuple[float, float], eps: float, weight_decay: float,
                 fused: bool | None = None, master_weights: bool = True,
                 storage_dtype: str | None = None):
        super().__init__(auto_prefix=False)
        if storage_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"AdamW storage_dtype {storage_dtype!r}: expected bfloat16, float16, float32 or None")
        self.rounder = {"bfloat16": _round_bf16, "float16": _round_fp16}.get(storage_dtype)
        if self.rounder is not None and any(p.dtype != ms.float32 for p in params):
            raise ValueError("AdamW storage_dtype emulates a storage dtype on float32 parameters only")
        self.params = ParameterTuple(params)
        # moments and masters made on the device (model_zoo/linear.py on_device): the host holds none of them
        self.m = ParameterTuple([on_device(ops.zeros(p.shape, ms.float32), f"adam_m.{p.name}") for p in params])
        self.v = ParameterTuple([on_device(ops.zeros(p.shape, ms.float32), f"adam_v.{p.name}") for p in params])
        low = self.rounder is not None or any(p.dtype != ms.float32 for p in params)
        self.use_masters = bool(master_weights and low)
        self.masters = ParameterTuple([on_device(_as_f32(p), f"master.{p.name}") for p in params]) \
            if self.use_masters else ParameterTuple([])
        self.b1 = Tensor(betas[0], ms.float32)
        self.b2 = Tensor(betas[1], ms.float32)
        self.eps = Tensor(eps, ms.float32)
        self.wd = Tensor(weight_decay, ms.float32)
        self.hyper_map = ops.HyperMap()
        # AdamWeightDecay takes float16/float32 and betas strictly inside (0, 1). fused=False forces the
        # element-wise path (tests compare the two).
        can_fuse = (not low and all(p.dtype == ms.float32 for p in params)
                    and 0.0 < betas[0] < 1.0 and 0.0 < betas[1] < 1.0)
        self.fused = can_fuse if fused is None else (fused and can_fuse)
        if self.fused:
            self.kernel = ops.AdamWeightDecay()

    def construct(self, grads, lr: Tensor, bc1: Tensor, bc2: Tensor, finite: Tensor):
        if self.fused:
            s = ops.sqrt(bc2)
            lr_t, eps_t, decay_t = lr * s / bc1, self.eps * s, self.wd * bc1 / s
            if finite:
                done = self.hyper_map(ops.partial(_adamw_fused, self.kernel, self.b1, self.b2, eps_t, decay_t, lr_t),
                                      self.params, self.m, self.v, grads)
                return ops.depend(finite, done)
            return finite
        if self.use_masters:
            done = self.hyper_map(ops.partial(_adamw_master, self.b1, self.b2, self.eps, self.wd, lr, bc1, bc2,
                                              finite), self.masters, self.params, self.m, self.v, grads)
        else:
            done = self.hyper_map(ops.partial(_adamw, self.b1, self.b2, self.eps, self.wd, lr, bc1, bc2, finite),
                                  self.params, self.m, self.v, grads)
        if self.rounder is not None:
            done = self.hyper_map(ops.partial(_round_store, self.rounder, done), self.params)
        return done


def _as_f32(p: Parameter) -> Tensor:
    """A float32 copy of ``p`` on the device (times 1 for a float32 one: a new tensor, never an alias)."""
    return ops.cast(p, ms.float32) if p.dtype != ms.float32 else ops.mul(p, 1.0)


class Barrier(nn.Cell):
    """All ranks meet here (an all-reduce of one number): used around sharded checkpoint writes."""

    def __init__(self):
        super().__init__(auto_prefix=False)
        self.allreduce = ops.AllReduce()

    def construct(self, x):
        return self.allreduce(x)


_square_sum = ops.MultitypeFuncGraph("square_sum")


@_square_sum.register("Tensor")
def _sq(g):
    g = ops.cast(g, ms.float32)
    return (g * g).sum()


_mul = ops.MultitypeFuncGraph("mul")


@_mul.register("Tensor", "Tensor")
def _mul_t(c, g):
    return ops.cast(ops.cast(g, ms.float32) * c, g.dtype)


_masked = ops.MultitypeFuncGraph("masked")


@_masked.register("Tensor", "Tensor")
def _masked_t(mask, x):
    return x * mask


class _Update(nn.Cell):
    """Shared tail of a step: all-reduce, unscale, global norm, clip, AdamW.

    Tensor parallel (``tp_group``, ``tp_sharded``): ``world_size`` is the data-parallel size and
    ``dp_group`` its ranks; gradients are reduced over them only (each TP rank its own shards). The
    global norm adds the squares of TP-sharded gradients over the TP group and counts the replicated
    ones (norms, equal on every TP rank) once."""

    def __init__(self, optimizer: AdamW, world_size: int, grad_clip: float | None, grad_fp32: bool = True,
                 dp_group: str | None = None, tp_group: str | None = None, tp_sharded: list[bool] | None = None,
                 comm_fusion=None, overlap: bool = False):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.grad_fp32 = grad_fp32
        # ZeRO (porting/train/run/step/zero.py): the optimizer reduce-scatters, updates its shards and all-gathers;
        # with stage 2 the accumulated buffers are already reduced shards.
        self.zero = getattr(optimizer, "stage", 0) > 0
        self.zero_reduced = getattr(optimizer, "stage", 0) == 2
        self.reduce = world_size > 1
        if self.reduce:
            group = {} if dp_group is None else {"group": dp_group}
            if not self.zero:
                # port's gradient buckets (run/step/buckets.py): the sum over the data-parallel ranks, as
                # MindSpore's gradient reducer (mean=False) summed it; the loss scale divides by the global tokens
                params = list(optimizer.params)
                fusion = comm_fusion if comm_fusion is not None else CommFusionSection()
                found, dtype = grad_buckets.buckets_for(params, fusion, grad_fp32)
                kind = grad_buckets.OverlappedGradBuckets if overlap else grad_buckets.GradBuckets
                self.reducer = kind(params, found, dtype, dp_group)
            self.allreduce = ops.AllReduce(**group)
        # ZeRO adds the tensor-parallel shards into its own norm (ShardedAdamW.apply).
        self.tp_norm = tp_group is not None and not self.zero
        if self.tp_norm:
            self.tp_allreduce = ops.AllReduce(group=tp_group)
            self.sharded_mask = tuple(Tensor(1.0 if s else 0.0, ms.float32) for s in tp_sharded)
            self.replicated_mask = tuple(Tensor(0.0 if s else 1.0, ms.float32) for s in tp_sharded)
        self.clip = grad_clip is not None
        self.max_norm = Tensor(grad_clip if grad_clip is not None else 1.0, ms.float32)
        self.hyper_map = ops.HyperMap()

    def update(self, grads, unscale: Tensor, lr: Tensor, bc1: Tensor, bc2: Tensor):
        # Gradients are all-reduced, unscaled, norm-clipped and applied in float32 whatever the
        # parameters' dtype (a no-op cast for float32 parameters); grad_fp32=False reduces them in the
        # parameter dtype (the norm is still summed in float32 and AdamW still updates float32 masters).
        if self.zero:
            shards = grads if self.zero_reduced else self.optimizer.reduce(grads)
            return self.optimizer.apply(shards, unscale, lr, bc1, bc2, self.clip, self.max_norm)
        if self.reduce:
            grads = self.reducer(grads)   # cast to the reduction dtype bucket by bucket
        elif self.grad_fp32:
            grads = self.hyper_map(_to_f32, grads)
        grads = self.hyper_map(ops.partial(_mul, unscale), grads)
        squares = self.hyper_map(_square_sum, grads)
        if self.tp_norm:
            sharded = self.tp_allreduce(ops.addn(self.hyper_map(_masked, self.sharded_mask, squares)))
            norm = ops.sqrt(sharded + ops.addn(self.hyper_map(_masked, self.replicated_mask, squares)))
        else:
            norm = ops.sqrt(ops.addn(squares))
        finite = ops.isfinite(norm)
        if self.clip:
            coef = ops.minimum(self.max_norm / (norm + 1e-6), ops.ones((), ms.float32))
            grads = self.hyper_map(ops.partial(_mul, coef), grads)
        done = self.optimizer(grads, lr, bc1, bc2, finite)
        return ops.depend(norm, done), finite

    def reduce_scalar(self, x: Tensor) -> Tensor:
        return self.allreduce(x) if self.reduce else x


class FusedTrainStep(_Update):
    """One micro-batch per optimizer step: the whole step in one graph."""

    def __init__(self, model: nn.Cell, optimizer: AdamW, world_size: int, grad_clip: float | None,
                 grad_fp32: bool = True, **groups):
        # PyNative: each gradient bucket's all-reduce starts during the backward (run/step/buckets.py)
        overlap = groups.pop("overlap", True) and ms.get_context("mode") == ms.PYNATIVE_MODE
        super().__init__(optimizer, world_size, grad_clip, grad_fp32, overlap=overlap, **groups)
        self.grad_fn = ops.value_and_grad(LossNet(model), None, optimizer.params, has_aux=True)
        if isinstance(getattr(self, "reducer", None), grad_buckets.OverlappedGradBuckets):
            self.grad_fn = self.reducer.armed(self.grad_fn)

    def construct(self, input_ids, labels, scale, unscale, lr, bc1, bc2, *packed):
        (_, (total, count)), grads = self.grad_fn(input_ids, labels, scale, *packed)
        total = self.reduce_scalar(total)
        norm, finite = self.update(grads, _poisoned(unscale, total), lr, bc1, bc2)
        return total, self.reduce_scalar(count), norm, finite


class AccumGradStep(nn.Cell):
    """Adds one micro-batch's (scaled) gradients into the accumulation buffers (float32, or the
    parameter dtype with ``precision.grad_reduce_dtype: param_dtype``)."""

    def __init__(self, model: nn.Cell, params: ParameterTuple, buffers: ParameterTuple):
        super().__init__(auto_prefix=False)
        # the model a sub-cell (not only inside grad_fn), so the cell's parameters hold its weights (compile cache)
        self.loss_net = LossNet(model)
        self.grad_fn = ops.value_and_grad(self.loss_net, None, params, has_aux=True)
        self.buffers = buffers
        self.hyper_map = ops.HyperMap()

    def construct(self, input_ids, labels, scale, *packed):
        (_, (total, count)), grads = self.grad_fn(input_ids, labels, scale, *packed)
        done = self.hyper_map(_accumulate, self.buffers, grads)
        return ops.depend(total, done), count


_accumulate = ops.MultitypeFuncGraph("accumulate")


@_accumulate.register("Tensor", "Tensor")
def _accumulate_t(buffer, grad):
    return ops.assign_add(buffer, ops.cast(grad, buffer.dtype))


_to_f32 = ops.MultitypeFuncGraph("to_f32")


@_to_f32.register("Tensor")
def _to_f32_t(g):
    return ops.cast(g, ms.float32)


class ApplyStep(_Update):
    """All-reduce the accumulated gradients, clip, AdamW, zero the buffers."""

    def __init__(self, optimizer: AdamW, buffers: ParameterTuple, world_size: int, grad_clip: float | None,
                 grad_fp32: bool = True, **groups):
        super().__init__(optimizer, world_size, grad_clip, grad_fp32, **groups)
        self.buffers = buffers

    def construct(self, local_total, local_count, unscale, lr, bc1, bc2):
        grads = self.hyper_map(ops.identity, self.buffers)
        total = self.reduce_scalar(local_total)
        norm, finite = self.update(grads, _poisoned(unscale, total), lr, bc1, bc2)
        zero = self.hyper_map(_zero, self.buffers)
        norm = ops.depend(norm, zero)
        return total, self.reduce_scalar(local_count), norm, finite


def _poisoned(unscale: Tensor, total: Tensor) -> Tensor:
    """``unscale`` itself while the all-reduced loss is finite, NaN when it is not (0 * inf is NaN): a non-finite
    loss then makes the gradient norm non-finite, so the update is skipped on every path (ZeRO's too) exactly
    like a non-finite gradient (porting/train/run/step/nonfinite.py)."""
    return unscale + 0.0 * total


_zero = ops.MultitypeFuncGraph("zero")


@_zero.register("Tensor")
def _zero_t(b):
    return ops.assign(b, ops.zeros_like(b))


def accumulation_buffers(params: ParameterTuple, grad_fp32: bool = True) -> ParameterTuple:
    """Zeroed gradient buffers made on the device (model_zoo/linear.py ``on_device``: no NumPy array, no host
    copy): float32, or each parameter's dtype when ``grad_fp32`` is False."""
    # zeros made in float32 and cast: MindSpore 2.7's CPU Zeros kernel has no bfloat16 output
    return ParameterTuple([on_device(ops.zeros(p.shape, ms.float32).astype(ms.float32 if grad_fp32 else p.dtype),
                                     f"accum.{p.name}") for p in params])


def compiled_graphs(*cells: nn.Cell) -> int:
    """How many graphs MindSpore compiled for these cells (its own per-cell compile cache)."""
    return sum(len(getattr(c, "compile_cache", ())) for c in cells)


def packed_inputs(mb) -> tuple:
    """The model's extra inputs for a packed micro-batch (positions, segment ids, sequence ends), else ()."""
    if mb.packed is None:
        return ()
    positions, segments, ends = mb.packed
    return Tensor(positions), Tensor(segments), Tensor(ends)
