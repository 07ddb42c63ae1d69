"""The layout of a plan, computed once per (recipe, model) and passed to every part of the planner:
tensor- and data-parallel sizes, the parameters of one tensor-parallel rank, the flat buckets the
optimizer shards, and the sharding choice (:func:`porting.train.plan.sharding.layout_for` fills it in).

Records only: the arithmetic that makes them lives in :mod:`porting.train.plan.comm` (parameters,
buckets), :mod:`porting.train.plan.memory` (the ZeRO stage) and :mod:`porting.train.plan.sharding`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Bytes of one element of each dtype a recipe may name (parameters, compute, gradient reduction).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

EMULATED = "allreduce+slice"
NATIVE = "reduce_scatter"
GATHER_NATIVE = "all_gather"
GATHER_EMULATED = "allreduce of zero-padded shards"


@dataclass(frozen=True)
class Bucket:
    """One flat buffer of consecutive parameters: indices into the parameter list, elements, padding."""

    indices: tuple[int, ...]
    numel: int
    padded: int          # numel rounded up to a multiple of the data-parallel size

    def shard(self, dp: int) -> int:
        return self.padded // dp


@dataclass(frozen=True)
class ShardingChoice:
    enabled: bool
    stage: int                  # 1 or 2 (only differs with gradient accumulation)
    reduce_scatter: str         # NATIVE, EMULATED, or "" when not sharded
    reason: str
    all_gather: str = GATHER_NATIVE   # GATHER_NATIVE or GATHER_EMULATED (see sharding.gather_kind)

    def describe(self) -> str:
        if not self.enabled:
            return "off: every rank keeps full fp32 masters and AdamW states"
        how = ("ReduceScatter (HCCL)" if self.reduce_scatter == NATIVE else
               "AllReduce + slice (emulated: the CPU backend has no working ReduceScatter)")
        gather = ("AllGather" if self.all_gather == GATHER_NATIVE else
                  "AllReduce of zero-padded shards (emulated: the CPU backend's AllGather needs the world group)")
        return f"ZeRO-{self.stage}: gradients by {how}, updated weights by {gather}; {self.reason}"


NOT_SHARDED = ShardingChoice(False, 0, "", "not sharded")


@dataclass(frozen=True)
class ShardingPlan(ShardingChoice):
    """The choice with its description, as the plan states it (plan.json ``sharding``)."""

    how: str = ""

    @classmethod
    def of(cls, choice: ShardingChoice) -> "ShardingPlan":
        return cls(**{f.name: getattr(choice, f.name) for f in dataclasses.fields(choice)}, how=choice.describe())


@dataclass(frozen=True)
class Layout:
    """What every planning function needs of (recipe, model), computed once."""

    tp: int
    dp: int
    sharded: bool                  # optimizer sharding on and dp > 1
    reduce_bytes: int              # bytes of a gradient element as reduced (float32, or the parameter dtype)
    numels: tuple[int, ...]        # parameters of one tensor-parallel rank, model_zoo.llama order
    buckets: tuple[Bucket, ...]    # the flat buckets of a sharded run (at reduce_bytes), else ()
    choice: ShardingChoice = NOT_SHARDED
    # LoRA (porting/train/plan/lora.py): ``numels`` are the trainable parameters, ``frozen`` the base's other
    # elements on one rank (weights only), ``lora`` (r, adapted linear layers per decoder layer); (0, 0): none
    frozen: int = 0
    lora: tuple[int, int] = (0, 0)

    @property
    def parameters(self) -> int:
        return sum(self.numels)
