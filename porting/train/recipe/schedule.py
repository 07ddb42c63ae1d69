"""Learning-rate schedule: linear warm-up, then cosine / linear decay to min_lr_ratio x lr, or constant."""

from __future__ import annotations

import math
from porting.train.recipe.schema import Recipe


def lr_at(recipe: Recipe, step: int, total_steps: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``total_steps``."""
    s = recipe.schedule
    base = recipe.optimizer.lr
    if s.warmup_steps and step < s.warmup_steps:
        return base * (step + 1) / s.warmup_steps
    if s.decay == "constant":
        return base
    span = max(1, total_steps - s.warmup_steps)
    frac = min(1.0, (step - s.warmup_steps) / span)
    floor = base * s.min_lr_ratio
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if s.decay == "cosine" else 1 - frac
    return floor + (base - floor) * shape
