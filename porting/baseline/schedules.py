"""Learning-rate schedule and weight-decay rule, taken from `port train` itself so the two sides
cannot drift: ``porting.train.recipe.schedule.lr_at`` and AdamW's decay on every parameter
(docs/training.md, "API for baseline")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from porting.train.recipe.schema import Recipe


def lr_schedule(recipe: Recipe, total_steps: int) -> Callable[[int], float]:
    from porting.train.recipe.schedule import lr_at

    return lambda step: lr_at(recipe, step, total_steps)


def no_decay_rule(recipe: Recipe) -> Callable[[str], bool]:
    """`port train` decays every parameter (torch.optim.AdamW semantics with one group)."""
    return lambda name: False
