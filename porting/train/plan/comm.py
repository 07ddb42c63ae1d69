"""Gradient buckets (``parallel.comm_fusion``) and multi-node launch settings for data-parallel `port train`.

port owns its gradient buckets (issue 48): MindSpore retires static-graph distributed parallel after 2.11
(the auto-parallel context, whose ``comm_fusion`` made MindSpore's AllReduceFusion pass bucket the all-reduces of
``mindspore.nn``'s data-parallel gradient reducer; docs/versions.md), so the step cells
(porting/train/run/step/buckets.py) flatten each bucket's gradients into one buffer and issue one collective per
bucket themselves, in graph mode and PyNative: one AllReduce per bucket in data parallel, one reduce-scatter per
bucket with optimizer sharding (ZeRO, porting/train/run/step/zero.py, built from these same buckets).

- Order: buckets follow the backward, which produces the gradients from the last parameter to the first (the LM
  head and final norm first, the embedding last). PyTorch's DDP design note (docs/source/notes/ddp.rst): "Model
  parameters are allocated into buckets in (roughly) the reverse order of Model.parameters() ... because DDP
  expects gradients to become ready during the backward pass in approximately that order"; Megatron-LM's
  ``_ParamAndGradBuffer`` walks ``params[::-1]`` "to roughly follow backprop order"
  (megatron/core/distributed/param_and_grad_buffer.py). A bucket's indices are listed in that order too.
- ``comm_fusion`` keeps the meaning it had under MindSpore's pass (read in MindSpore 2.10's
  ``communication_op_fusion.cc`` and measured under msrun before this change, tests/train/test_comm_fusion.py):
  ``enabled: false`` is one collective per gradient; ``size: N`` closes a bucket at the gradient that takes it
  past N "MB" (that gradient stays in the closing bucket), where a "MB" is 262144 bytes as the pass counted it
  (kDefaultThresholdMb2Byte), so a recipe's buckets hold what they held before; ``auto`` is size 64; ``index:
  [i, j]`` splits the parameter list after parameters i and j. A fractional size is taken as it is (the pass
  truncated it to an integer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model_zoo.config import LlamaConfig
from porting.train.plan.layout import DTYPE_BYTES, Bucket, Layout
from porting.train.plan.lora import shapes as lora_shapes
from porting.train.recipe.determinism import launch_env
from porting.train.recipe.schema import CommFusionSection, Recipe

THRESHOLD_UNIT_BYTES = 262144      # bytes per configured "MB", as MindSpore's fusion pass counted it
AUTO_THRESHOLD = 64                # MindSpore's auto mode
# HCCL's defaults: connect 120 s (MindSpore sets 600), exec 1836 s on A2/A3 (CANN environment variables:
# https://www.hiascend.com/document/detail/zh/canncommercial/83RC1/maintenref/envvar/envref_07_0149.html and
# https://www.hiascend.com/document/detail/zh/canncommercial/900/maintenref/envvar/envref_07_0078.html).
HCCL_CONNECT_FLOOR_S, HCCL_EXEC_FLOOR_S = 600, 1836
# Env that every node must export with the same value (HCCL compares or times out on them).
SAME_ON_EVERY_NODE = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_BUFFSIZE", "HCCL_DETERMINISTIC",
                      "MS_WORKER_NUM (set by msrun from --worker_num)", "PYTHONPATH/port, MindSpore and CANN versions")


def threshold_bytes(cf: CommFusionSection) -> float:
    """The bucket size of a ``size`` or ``auto`` comm_fusion setting, in bytes."""
    mb = AUTO_THRESHOLD if cf.allreduce_mode == "auto" else float(cf.allreduce_config)
    return mb * THRESHOLD_UNIT_BYTES


def fusion_words(cf: CommFusionSection) -> str:
    """The comm_fusion setting in a few words, for the rank log's start line."""
    if not cf.enabled:
        return "comm_fusion off: one bucket per gradient"
    return f"comm_fusion {cf.allreduce_mode}" + (f" {cf.allreduce_config}" if cf.allreduce_config is not None else "")


def gradient_buckets(grad_bytes: list[int], cf: CommFusionSection) -> list[list[int]]:
    """Which gradients (by parameter index) share one collective, in the order the backward produces them
    (the last parameter first; see the module docstring). Fusion off: one collective per gradient."""
    n = len(grad_bytes)
    backward = list(range(n - 1, -1, -1))
    if not cf.enabled or n == 0:
        return [[i] for i in backward]
    if cf.allreduce_mode == "index":
        # a split after parameter i (in parameter order): segments [0..i], [i+1..j], ..., taken last first
        ends = sorted({int(i) for i in cf.allreduce_config if 0 <= int(i) < n - 1}) + [n - 1]
        starts = [0] + [e + 1 for e in ends[:-1]]
        return [list(range(e, s - 1, -1)) for s, e in reversed(list(zip(starts, ends)))]
    threshold = threshold_bytes(cf)
    out, cur, acc = [], [], 0
    for i in backward:
        cur.append(i)
        if acc + grad_bytes[i] > threshold:
            out.append(cur)
            cur, acc = [], 0
        else:
            acc += grad_bytes[i]
    if cur:
        out.append(cur)
    return out


def parameter_numels(cfg: LlamaConfig, tp: int = 1) -> list[int]:
    """Elements of every trainable parameter on one tensor-parallel rank, in `model_zoo.llama` order.
    Megatron's split: q/k/v and gate/up column-parallel, o and down row-parallel, embedding and LM head
    vocab-parallel (all divided by ``tp``); the norms replicated."""
    h, i, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    layer = [h, h * h // tp, kv * h // tp, kv * h // tp, h * h // tp, h, i * h // tp, h * i // tp, i * h // tp]
    sizes = [cfg.vocab_size * h // tp] + layer * L + [h]
    if not cfg.tie_word_embeddings:
        sizes.append(cfg.vocab_size * h // tp)
    return sizes


def flat_buckets(numels: list[int], elem_bytes: int, cf: CommFusionSection, dp: int) -> list[Bucket]:
    """Buckets as the comm_fusion setting forms them (:func:`gradient_buckets` on the gradient bytes)."""
    out = []
    for idx in gradient_buckets([n * elem_bytes for n in numels], cf):
        n = sum(numels[i] for i in idx)
        out.append(Bucket(tuple(idx), n, -(-n // dp) * dp))
    return out


def layout_shapes(recipe: Recipe, cfg: LlamaConfig) -> Layout:
    """The plan's :class:`Layout` without its sharding choice (``sharding.layout_for`` adds it): the one
    place the parameters of a tensor-parallel rank and the flat buckets are computed."""
    tp, dp = recipe.parallel.tensor_parallel, recipe.data_parallel_size
    prec = recipe.precision
    reduce_bytes = 4 if prec.grad_reduce_dtype == "float32" else DTYPE_BYTES[prec.param_dtype]
    numels = parameter_numels(cfg, tp)
    frozen, lora = 0, (0, 0)
    if recipe.lora is not None:   # the adapters are what trains; the base is weights only (plan/lora.py)
        ls = lora_shapes(recipe, cfg, tp)
        frozen = sum(numels) - sum(n for n, z in zip(ls.numels, ls.names) if ".lora_" not in z)
        numels, lora = list(ls.numels), (ls.rank, ls.adapted_per_layer)
    sharded = recipe.parallel.optimizer_sharding and dp > 1
    buckets = tuple(flat_buckets(numels, reduce_bytes, recipe.parallel.comm_fusion, dp)) if sharded else ()
    return Layout(tp, dp, sharded, reduce_bytes, tuple(numels), buckets, frozen=frozen, lora=lora)


# What the plan assumes of the gradient collectives' overlap with the backward, and why (issue 48: "the overlap the
# rehearsal measures, never assumed"). port rehearse times the step's compute and each collective apart
# (porting/rehearse_compute.py, rehearse_links.py) and nothing of a backward with its collectives in flight, so the
# plan's step (roofline.py, calibrated.py) adds every collective's time to the compute.
EXPOSED_FRACTION = 1.0
EXPOSED_SOURCE = ("assumed: no overlap. port rehearse times compute and collectives apart and measures no overlap on "
                  "the device; PyNative launches each bucket's collective during the backward (graph mode leaves the "
                  "schedule to the compiler), measured on the CPU only (BENCHMARKS.md, 'Gradient buckets')")


@dataclass(frozen=True)
class GradientAllreduce:
    """The gradient buckets of one data-parallel rank (plan.json ``gradient_allreduce``): one collective each (an
    AllReduce, or a reduce-scatter with optimizer sharding, sharding.collectives), in backward order."""

    gradients: int
    allreduce_ops: int                                  # the buckets: 0 on one data-parallel rank
    bucket_mib: tuple[float, ...]                       # each bucket's MiB, in backward order
    how: str
    bucket_numels: tuple[int, ...] = ()                 # each bucket's elements
    bucket_params: tuple[tuple[int, ...], ...] = ()     # each bucket's parameters (indices), last parameter first
    exposed_fraction: float | None = None               # of the collectives' time the step estimate assumes exposed
    exposed_source: str | None = None                   # where that figure comes from


def fusion_plan(recipe: Recipe, cfg: LlamaConfig, layout: Layout | None = None) -> GradientAllreduce:
    """The gradient buckets of one data-parallel rank, for the plan: how many gradients, how many buckets (one
    collective each: an AllReduce, or a reduce-scatter with optimizer sharding, sharding.collectives), their
    parameters in backward order, their sizes, and the exposed communication the plan assumes."""
    layout = layout or layout_shapes(recipe, cfg)
    cf, numels = recipe.parallel.comm_fusion, list(layout.numels)
    if layout.dp <= 1:
        return GradientAllreduce(gradients=len(numels), allreduce_ops=0, bucket_mib=(),
                                 how="one data-parallel rank: the gradients are not reduced")
    buckets = list(layout.buckets) or flat_buckets(numels, layout.reduce_bytes, cf, 1)
    how = (f"port's gradient buckets, {'ZeRO: one reduce-scatter' if layout.sharded else 'one AllReduce'} per bucket "
           f"of {'one gradient' if not cf.enabled else _fusion_words(cf)}, in {DTYPE_NAMES[layout.reduce_bytes]}, "
           "built in backward order (last parameter first)")
    return GradientAllreduce(
        gradients=len(numels), allreduce_ops=len(buckets),
        bucket_mib=tuple(round(b.numel * layout.reduce_bytes / (1 << 20), 3) for b in buckets), how=how,
        bucket_numels=tuple(b.numel for b in buckets), bucket_params=tuple(tuple(b.indices) for b in buckets),
        exposed_fraction=EXPOSED_FRACTION, exposed_source=EXPOSED_SOURCE)


DTYPE_NAMES = {4: "float32", 2: "the 16-bit parameter dtype (precision.grad_reduce_dtype: param_dtype)"}


def _fusion_words(cf: CommFusionSection) -> str:
    if cf.allreduce_mode == "index":
        return f"the parameters between the split points {list(cf.allreduce_config)}"
    mb = AUTO_THRESHOLD if cf.allreduce_mode == "auto" else cf.allreduce_config
    return f"up to {mb:g} x 256 KiB (comm_fusion {cf.allreduce_mode}; the gradient that crosses it closes the bucket)"


def checkpoint_bytes(recipe: Recipe, layout: Layout) -> float:
    """Bytes the busiest rank writes at a checkpoint (porting/train/run/checkpoint/format.py ``owned``): its share
    of its tensor-parallel slice's weights, AdamW m and v and fp32 masters: a 1/dp share of each when
    sharded, all of them on data-parallel rank 0 when not."""
    p = float(layout.parameters)   # this rank's tensor-parallel slice
    pb = DTYPE_BYTES[recipe.precision.param_dtype]
    dp = recipe.data_parallel_size if recipe.parallel.optimizer_sharding else 1
    masters = 4 * p / dp if pb != 4 else 0.0
    return p * pb / dp + 8 * p / dp + masters


def checkpoint_total_bytes(recipe: Recipe, layout: Layout) -> float:
    """Bytes all ranks write together at a checkpoint: every tensor-parallel slice's weights, m, v and fp32
    masters once (sharded over its data-parallel ranks, or written by data-parallel rank 0 alone)."""
    p = float(layout.parameters)
    pb = DTYPE_BYTES[recipe.precision.param_dtype]
    return recipe.parallel.tensor_parallel * p * (pb + 8 + (4 if pb != 4 else 0))


def save_seconds(recipe: Recipe, layout: Layout) -> float:
    """Seconds a checkpoint takes: all ranks write at once and share the filesystem, so the whole
    checkpoint's bytes go through ``checkpointing.fs_gib_per_s``, the aggregate write bandwidth of the
    filesystem the checkpoints live on (per cluster; porting/train/plan/fs_speed.py measures one node's).
    Its default, 0.3 GiB/s, is conservative: a Huawei Cloud SFS Turbo "Performance" file system's documented
    maximum is 350 MB/s (support.huaweicloud.com/intl/en-us/productdesc-sfsturbo/sfsturbo_01_0005.html);
    SFS Capacity-Oriented gives 0.02 MB/s per GB of capacity + 100 MB/s, 2 GB/s at 100 TB (productdesc-sfs/sfs_01_0005.html)."""
    return checkpoint_total_bytes(recipe, layout) / (recipe.checkpointing.fs_gib_per_s * (1 << 30))


def hccl_env(recipe: Recipe, layout: Layout) -> dict[str, str]:
    """HCCL timeouts that outlast a checkpoint save (ranks wait in a collective while one rank writes).

    save_s = the checkpoint's bytes / checkpointing.fs_gib_per_s (aggregate; 0.3 GiB/s by default);
    HCCL_EXEC_TIMEOUT = max(1836, ceil(3 x save_s) + 600); HCCL_CONNECT_TIMEOUT = max(600, ceil(2 x save_s) + 120)
    (a resumed run connects after loading the same bytes).
    """
    save_s = save_seconds(recipe, layout)
    return {"HCCL_CONNECT_TIMEOUT": str(max(HCCL_CONNECT_FLOOR_S, math.ceil(2 * save_s) + 120)),
            "HCCL_EXEC_TIMEOUT": str(max(HCCL_EXEC_FLOOR_S, math.ceil(3 * save_s) + 600))}


@dataclass(frozen=True)
class LaunchPlan:
    """The per-node environment of a multi-device run and how it was derived (plan.json ``launch``)."""

    env: dict[str, str]                # exported on every node (the user's own values win, porting/launch/)
    predicted_save_s: float
    checkpoint_bytes_per_rank: int     # the busiest rank's
    checkpoint_bytes: int              # all ranks together
    formula: str
    same_on_every_node: tuple[str, ...]


def launch_plan(recipe: Recipe, layout: Layout) -> LaunchPlan:
    """The per-node environment of a multi-device run and how it was derived."""
    save_s = save_seconds(recipe, layout)
    written, total = checkpoint_bytes(recipe, layout), checkpoint_total_bytes(recipe, layout)
    # determinism: bitwise adds its switches (HCCL_DETERMINISTIC, ...): every node exports the same
    env = {**hccl_env(recipe, layout), **launch_env(recipe.determinism, recipe.cluster.device)}
    return LaunchPlan(env=env, predicted_save_s=round(save_s, 1),
                      checkpoint_bytes_per_rank=int(written), checkpoint_bytes=int(total),
                      formula=f"save_s = {total / (1 << 30):.2f} GiB all ranks write / "
                              f"{recipe.checkpointing.fs_gib_per_s:g} GiB/s the filesystem's aggregate write bandwidth "
                              "(checkpointing.fs_gib_per_s); "
                              "HCCL_EXEC_TIMEOUT = max(1836, ceil(3 save_s) + 600); "
                              "HCCL_CONNECT_TIMEOUT = max(600, ceil(2 save_s) + 120)",
                      same_on_every_node=SAME_ON_EVERY_NODE)
