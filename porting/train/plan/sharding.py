"""Optimizer sharding (ZeRO) and the collectives of one training step, as the plan states them.

Sharded optimizer (Megatron's distributed optimizer; porting/train/run/step/zero.py builds it):
- the gradients of a bucket of parameters (port's gradient buckets, :func:`porting.train.plan.comm.flat_buckets`:
  ``parallel.comm_fusion``'s sizes, in backward order, the same buckets data parallel all-reduces) are flattened,
  padded to a multiple of the data-parallel size and reduce-scattered: each data-parallel rank gets the summed
  gradient of its flat 1/dp shard;
- the rank updates its shard (float32 master and AdamW m, v of the shard only);
- the updated shards are all-gathered in the parameter dtype and copied back into the parameters.
With gradient accumulation, stage 1 accumulates full gradients and reduce-scatters once per step;
stage 2 (ZeRO-2) reduce-scatters every micro-step into sharded accumulators: 1/dp of the accumulation
memory for ``grad_accum_steps`` x the reduce-scatter bytes. ``zero_stage: auto`` takes stage 1 when
it fits the usable HBM with :data:`porting.train.plan.memory.MARGIN_GIB` to spare, else stage 2.

The reduce-scatter is chosen by capability (:func:`has_reduce_scatter`): HCCL has it; MindSpore's CPU
collective library (MCCL: mindspore-ai/mindspore, plugin/cpu/res_manager/collective/ms_collective_comm_lib.cc)
has a ReduceScatter that does nothing (measured under msrun, tests/train/test_zero.py), so on the CPU it
is emulated by an AllReduce and a slice of this rank's shard (same numbers, twice the wire bytes).
AllGather works on both over the world group; on the CPU it fails on a sub-group (the data-parallel
group of a tensor-parallel run), so there (:func:`has_subgroup_all_gather`) each rank all-reduces a
zero buffer holding its shard at its offset (same result, twice the wire bytes). HCCL keeps AllGather.

Tensor parallel x ZeRO: the optimizer shards over the data-parallel group (the ranks with the same
tensor-parallel slice); the global norm adds the squares of tensor-parallel-sharded elements over the
tensor-parallel group and counts replicated ones (the norms) once, through a flat mask per bucket.

Bytes (:func:`collectives`): ``payload`` is the size of the buffer a collective is called on (its
input for AllReduce and ReduceScatter, its output for AllGather); ``wire`` is what one rank sends in
a ring: AllReduce 2 (n-1)/n x payload, ReduceScatter and AllGather (n-1)/n x payload. Per optimizer
step, per rank. Tensor-parallel collectives follow Megatron without sequence parallel (an estimate
from the model shapes: the tensor-parallel cells decide the exact ops).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from model_zoo.config import LlamaConfig
from porting.train.plan import comm
from porting.train.plan.comm import flat_buckets  # noqa: F401 (zero.py builds its buckets with it)
from porting.train.plan.layout import (DTYPE_BYTES, EMULATED, GATHER_EMULATED, GATHER_NATIVE, NATIVE,  # noqa: F401
                                       NOT_SHARDED, Layout, ShardingChoice)
from porting.train.plan.memory import choose_zero_stage
from porting.train.recipe.schema import Recipe

def has_reduce_scatter(device: str) -> bool:
    """Whether the backend's ReduceScatter computes (HCCL on Ascend) or is the CPU stub (MCCL)."""
    return device.lower() == "ascend"


def has_subgroup_all_gather(device: str) -> bool:
    """Whether AllGather works on a communication sub-group (HCCL); the CPU's works on the world group only."""
    return device.lower() == "ascend"


def gather_kind(recipe: Recipe) -> str:
    """How the updated shards are gathered: AllGather, unless the data-parallel group is a sub-group
    (tensor parallel) on a backend without sub-group AllGather."""
    sub = recipe.parallel.tensor_parallel > 1
    return GATHER_EMULATED if sub and not has_subgroup_all_gather(recipe.cluster.device) else GATHER_NATIVE


def choose(recipe: Recipe, cfg: LlamaConfig, layout: Layout | None = None) -> ShardingChoice:
    """ZeRO stage and reduce-scatter implementation for a recipe (see the module docstring)."""
    layout = layout or comm.layout_shapes(recipe, cfg)
    if not layout.sharded:
        return NOT_SHARDED
    rs = NATIVE if has_reduce_scatter(recipe.cluster.device) else EMULATED
    stage, why = choose_zero_stage(cfg, recipe, layout)
    return ShardingChoice(True, stage, rs, why, gather_kind(recipe))


def layout_for(recipe: Recipe, cfg: LlamaConfig) -> Layout:
    """The plan's :class:`Layout`, computed once: shapes, buckets and the sharding choice."""
    shapes = comm.layout_shapes(recipe, cfg)
    return dataclasses.replace(shapes, choice=choose(recipe, cfg, shapes))


@dataclass(frozen=True)
class Collective:
    op: str              # AllReduce, ReduceScatter, AllGather
    purpose: str
    group: str           # dp, tp
    ranks: int           # size of the group
    count: int           # ops per optimizer step
    payload_bytes: int   # summed over the ops of one step
    wire_bytes: int      # ring bytes sent by one rank, summed


def _op(op: str, purpose: str, group: str, n: int, count: int, payload: float) -> Collective:
    factor = (2 * (n - 1) / n) if op == "AllReduce" else (n - 1) / n
    return Collective(op, purpose, group, n, count, int(payload), int(payload * factor))


def collectives(recipe: Recipe, cfg: LlamaConfig, choice: ShardingChoice | None = None,
                legacy_mask: bool = False, layout: Layout | None = None) -> list[Collective]:
    """Every collective of one optimizer step on one rank. ``legacy_mask``: the earlier sharding
    (gradients all-reduced, then every parameter all-reduced in fp32 as ``param x mask``), for
    comparison (BENCHMARKS.md)."""
    layout = layout or layout_for(recipe, cfg)
    choice = choice or layout.choice
    dp, tp, accum = recipe.data_parallel_size, recipe.parallel.tensor_parallel, recipe.batching.grad_accum_steps
    prec = recipe.precision
    gb = 4 if prec.grad_reduce_dtype == "float32" else DTYPE_BYTES[prec.param_dtype]
    pb = DTYPE_BYTES[prec.param_dtype]
    numels = list(layout.numels)
    cf = recipe.parallel.comm_fusion
    out: list[Collective] = []
    if dp > 1:
        if choice.enabled and not legacy_mask:
            buckets = layout.buckets or flat_buckets(numels, gb, cf, dp)
            padded = sum(b.padded for b in buckets)
            times = accum if choice.stage == 2 else 1
            rs_op = "ReduceScatter" if choice.reduce_scatter == NATIVE else "AllReduce"
            out.append(_op(rs_op, f"gradients, flat buckets ({choice.reduce_scatter})", "dp", dp,
                           len(buckets) * times, padded * gb * times))
            ag_op = "AllGather" if choice.all_gather == GATHER_NATIVE else "AllReduce"
            out.append(_op(ag_op, f"updated weight shards ({choice.all_gather})", "dp", dp, len(buckets), padded * pb))
            out.append(_op("AllReduce", "gradient norm of the shards (scalar; with tensor parallel, sharded and "
                           "replicated parts)", "dp", dp, 1, 4 if tp == 1 else 8))
            if tp > 1:
                out.append(_op("AllReduce", "gradient norm of tensor-parallel shards (scalar)", "tp", tp, 1, 4))
        else:
            buckets = comm.gradient_buckets([n * gb for n in numels], cf)
            out.append(_op("AllReduce", "gradients (port's buckets, one AllReduce each)", "dp", dp, len(buckets),
                           sum(numels) * gb))
            if legacy_mask and choice.enabled:
                out.append(_op("AllReduce", "every parameter from its owner (fp32 param x mask)", "dp", dp,
                               len(numels), sum(numels) * 4))
        out.append(_op("AllReduce", "loss sum and token count (scalars)", "dp", dp, 2, 8))
    if tp > 1:
        out += tp_collectives(recipe, cfg)
    return out


def tp_collectives(recipe: Recipe, cfg: LlamaConfig) -> list[Collective]:
    """Megatron tensor parallel without sequence parallel, per optimizer step: forward, an AllReduce
    after the row-parallel o and down projections and after the vocab-parallel embedding; backward, the
    conjugate AllReduce before the column-parallel q/k/v and gate/up and the LM head; recompute runs the
    forward ones again; the parallel cross-entropy all-reduces max, sum of exponentials and the target
    logit per token (float32)."""
    tp, accum, L = recipe.parallel.tensor_parallel, recipe.batching.grad_accum_steps, cfg.num_hidden_layers
    tokens = recipe.batching.micro_batch_size * recipe.data.max_seq_length
    act = tokens * cfg.hidden_size * DTYPE_BYTES[recipe.precision.compute_dtype]
    fwd = 2 * L + 1
    bwd = 2 * L + 1 + (2 * L if recipe.memory.recompute else 0)
    return [_op("AllReduce", "tensor-parallel activations, forward", "tp", tp, fwd * accum, fwd * accum * act),
            _op("AllReduce", "tensor-parallel activation gradients, backward" +
                (" (and recomputed forward)" if recipe.memory.recompute else ""), "tp", tp, bwd * accum,
                bwd * accum * act),
            _op("AllReduce", "vocab-parallel cross-entropy (max, sum exp, target logit)", "tp", tp, 3 * accum,
                3 * accum * tokens * 4)]


@dataclass(frozen=True)
class CollectiveBytes:
    """Payload and wire bytes per optimizer step per rank, in total and by group (plan.json ``collective_bytes``)."""

    payload_bytes: int
    wire_bytes: int
    dp_wire_bytes: int
    tp_wire_bytes: int


def bytes_summary(cols: list[Collective]) -> CollectiveBytes:
    """Payload and wire bytes per step per rank, in total and by group."""
    wire = lambda g: sum(c.wire_bytes for c in cols if c.group == g)  # noqa: E731
    return CollectiveBytes(payload_bytes=sum(c.payload_bytes for c in cols), wire_bytes=sum(c.wire_bytes for c in cols),
                           dp_wire_bytes=wire("dp"), tp_wire_bytes=wire("tp"))
