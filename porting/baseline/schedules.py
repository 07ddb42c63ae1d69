"""Learning-rate schedule and weight-decay groups, exactly as `port train` applies them.

PROVISIONAL: written from the recipe schema's documented meaning until porting.train exposes its own
functions; then these delegate to them so the two sides cannot drift.
"""

from __future__ import annotations

import math
from typing import Callable


def _cosine(progress: float, min_ratio: float) -> float:
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _linear(progress: float, min_ratio: float) -> float:
    return min_ratio + (1 - min_ratio) * (1 - progress)


DECAYS: dict[str, Callable[[float, float], float]] = {
    "cosine": _cosine, "linear": _linear, "constant": lambda progress, min_ratio: 1.0,
}


def lr_schedule(recipe, total_steps: int) -> Callable[[int], float]:
    s, lr = recipe.schedule, recipe.optimizer.lr
    decay = DECAYS[s.decay]

    def lr_at(step: int) -> float:
        if step < s.warmup_steps:
            return lr * (step + 1) / s.warmup_steps
        span = max(1, total_steps - s.warmup_steps)
        return lr * decay(min(1.0, (step - s.warmup_steps) / span), s.min_lr_ratio)

    return lr_at


def no_decay_rule(recipe) -> Callable[[str], bool]:
    return lambda name: False
