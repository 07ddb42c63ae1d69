"""Gradient all-reduce fusion and multi-node launch settings for data-parallel `port train`.

comm_fusion in DATA_PARALLEL (read in MindSpore 2.10's `nn.DistributedGradReducer`,
`parallel/_auto_parallel_context.py` and the backend's `communication_op_fusion.cc`, then measured
under msrun in tests/train/test_comm_fusion.py):
- `DistributedGradReducer` gives every gradient its own AllReduce carrying a `fusion` id: the
  parameter's `Parameter.comm_fusion` (1 by default, 0 = never fused), or 1024+k per segment of
  `all_reduce_fusion_config` indices. The backend's AllReduceFusion pass (run on the CPU and on Ascend
  when `enable_all_reduce_fusion` is on) merges AllReduces of one id into buckets.
- In DATA_PARALLEL the bucket size is `dp_fusion_threshold_mb`, which the comm_fusion context's
  `size` (and `auto`: 64) mode sets; the pass walks the gradients in graph order and closes a bucket at
  the tensor that would overflow it (that tensor is still in the closing bucket). The threshold counts
  262144 bytes per "MB" (kDefaultThresholdMb2Byte in that file).
- Pitfall fixed here: `comm_fusion={"openstate": False, "allreduce": {...}}` turns fusion back ON (the
  allreduce key re-enables it). Off is `{"openstate": False}` alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from model_zoo.config import LlamaConfig
from porting.train.plan.layout import DTYPE_BYTES, Bucket, Layout
from porting.train.plan.lora import shapes as lora_shapes
from porting.train.recipe.determinism import launch_env
from porting.train.recipe.schema import CommFusionSection, Recipe

THRESHOLD_UNIT_BYTES = 262144      # bytes per configured "MB" in the backend pass
AUTO_THRESHOLD = 64                # MindSpore's auto mode
# HCCL's defaults: connect 120 s (MindSpore sets 600), exec 1836 s on A2/A3 (CANN environment variables:
# https://www.hiascend.com/document/detail/zh/canncommercial/83RC1/maintenref/envvar/envref_07_0149.html and
# https://www.hiascend.com/document/detail/zh/canncommercial/900/maintenref/envvar/envref_07_0078.html).
HCCL_CONNECT_FLOOR_S, HCCL_EXEC_FLOOR_S = 600, 1836
# Env that every node must export with the same value (HCCL compares or times out on them).
SAME_ON_EVERY_NODE = ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_BUFFSIZE", "HCCL_DETERMINISTIC",
                      "MS_WORKER_NUM (set by msrun from --worker_num)", "PYTHONPATH/port, MindSpore and CANN versions")


def fusion_context(cf: CommFusionSection) -> dict[str, Any]:
    """The `set_auto_parallel_context(comm_fusion=...)` value for the recipe's comm_fusion section."""
    if not cf.enabled:
        return {"openstate": False}
    config = cf.allreduce_config
    if cf.allreduce_mode == "size":
        config = int(config)
    return {"openstate": True, "allreduce": {"mode": cf.allreduce_mode, "config": config}}


def gradient_buckets(grad_bytes: list[int], cf: CommFusionSection) -> list[list[int]]:
    """Which gradients (by index, in graph order) share one fused AllReduce, as the backend pass
    forms them (see the module docstring). Fusion off: one AllReduce per gradient."""
    n = len(grad_bytes)
    if not cf.enabled or n == 0:
        return [[i] for i in range(n)]
    if cf.allreduce_mode == "index":
        # DistributedGradReducer: fusion id changes after each split index (index i is still in the
        # segment it closes).
        ends = sorted({int(i) for i in cf.allreduce_config if 0 <= int(i) < n - 1}) + [n - 1]
        out, start = [], 0
        for e in ends:
            out.append(list(range(start, e + 1)))
            start = e + 1
        return out
    mb = AUTO_THRESHOLD if cf.allreduce_mode == "auto" else int(cf.allreduce_config)
    threshold = mb * THRESHOLD_UNIT_BYTES
    out, cur, acc = [], [], 0
    for i, size in enumerate(grad_bytes):
        cur.append(i)
        if acc + size > threshold:
            out.append(cur)
            cur, acc = [], 0
        else:
            acc += size
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


def gradient_sizes(cfg: LlamaConfig, tp: int = 1) -> list[int]:
    """fp32 bytes of every trainable gradient in `model_zoo.llama` parameter order (the reducer casts
    to float32 before its all-reduce)."""
    return [4 * s for s in parameter_numels(cfg, tp)]


@dataclass(frozen=True)
class GradientAllreduce:
    """How the gradient all-reduce is bucketed (plan.json ``gradient_allreduce``)."""

    gradients: int
    allreduce_ops: int                 # 0 on one device
    bucket_mib: tuple[float, ...]      # each fused AllReduce's MiB, in graph order
    how: str


def fusion_plan(recipe: Recipe, cfg: LlamaConfig, grad_bytes: list[int] | None = None) -> GradientAllreduce:
    """How the gradient all-reduce is bucketed, for the dry-run plan."""
    cf = recipe.parallel.comm_fusion
    sizes = grad_bytes if grad_bytes is not None else gradient_sizes(cfg)
    buckets = gradient_buckets(sizes, cf) if recipe.world_size > 1 else []
    return GradientAllreduce(
        gradients=len(sizes), allreduce_ops=len(buckets),
        bucket_mib=tuple(round(sum(sizes[i] for i in b) / (1 << 20), 3) for b in buckets),
        how="backend AllReduceFusion pass, configured by set_auto_parallel_context(comm_fusion=...) in DATA_PARALLEL"
        if cf.enabled else "fusion off: one AllReduce per gradient")


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
