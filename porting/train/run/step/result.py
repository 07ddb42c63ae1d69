"""The typed result of one optimizer step, what ``Trainer.run_step`` returns (porting/train/run/loop.py) and the
metrics line is made from (porting/train/run/records.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepResult:
    """What ``Trainer.run_step`` measured for one optimizer step (or a data-window skip, which ran nothing).

    ``finite``: the loss and the all-reduced gradient norm were finite; ``applied``: the update counted (a
    non-finite step, or an overflow under dynamic loss scaling, applies nothing); ``scale_used``: the loss scale
    the step ran with; ``compile``: the step compiled a graph (every shape should have been compiled before
    step 1); ``skip_reason``: why the update was not applied (porting/train/run/step/nonfinite.py), None when it was.
    """

    loss: float
    grad_norm: float
    finite: bool
    applied: bool
    scale_used: float
    step_time_s: float
    compile: bool
    tokens: int
    skip_reason: str | None = None

    @classmethod
    def nothing_run(cls, scale: float, reason: str) -> "StepResult":
        """A step whose data is consumed and nothing computed (a ``nonfinite.skip_steps`` window)."""
        return cls(loss=math.nan, grad_norm=math.nan, finite=True, applied=False, scale_used=scale,
                   step_time_s=0.0, compile=False, tokens=0, skip_reason=reason)
