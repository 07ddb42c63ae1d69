"""The recipe's ``nonfinite`` section: what a step with a non-finite loss or gradient does
(porting/train/run/step/nonfinite.py). Its update is skipped and its data counted as consumed, up to these caps;
past them the run stops with the reason (a supervised run rolls back once first, porting/launch/supervise.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict, field_validator

from porting.train.recipe.checks import Section

STEPS = 10 ** 9   # the schema's bound on step counts (schema.BIG)
Count = Annotated[int, Strict()]   # a YAML `true` is not a count
Step = Annotated[int, Strict(), Field(ge=1, le=STEPS)]


class NonfiniteSection(Section):
    # 10 consecutive: MindFormers' default streak of skipped steps that stops training
    # (mindspore-lab/mindformers, mindformers/core/callback/callback.py TrainingStateMonitor with
    # use_skip_data_by_global_norm: global_norm_spike_count_threshold, 10 by default in MindSpore Transformers'
    # configuration guide, monitor_config). No framework caps the total:
    # Megatron-LM skips a step whose gradients are not finite and counts it (megatron/core/optimizer/optimizer.py
    # MixedPrecisionOptimizer.step returns update_successful False; megatron/training/training.py counts
    # skipped_iter) without a limit. 100 is ten such streaks: past that the cause is systematic (learning rate,
    # data, precision), not one bad batch.
    max_consecutive_skips: Count = Field(10, ge=0, le=STEPS)
    max_total_skips: Count = Field(100, ge=0, le=STEPS)
    # Steps (1-based, inclusive [first, last]) whose data is not trained on: a supervised rollback adds the window
    # that went non-finite (PaLM, arXiv:2204.02311 sec. 5.1: restart from a checkpoint before the spike and skip
    # the batches around it; Megatron-DeepSpeed's --train-range-to-skip does it by hand).
    skip_steps: list[tuple[Step, Step]] = Field(default_factory=list, max_length=256)

    @field_validator("skip_steps")
    @classmethod
    def _ordered(cls, v: list[tuple[int, int]]) -> list[tuple[int, int]]:
        bad = [f"[{a}, {b}]" for a, b in v if a > b]
        if bad:
            raise ValueError(f"each window is [first, last] with first <= last; found {', '.join(bad)}")
        return v
