"""The dry run's padding statistics: one epoch of the recipe's data under bucketing and under packing,
side by side (``port train --dry-run`` prints them under the plan, ``plan.json`` keeps them)."""

from __future__ import annotations

from dataclasses import dataclass

from model_zoo.errors import PortingError
from porting.model_paths import resolve_hf
from porting.tokenizer import load_tokenizer
from porting.train.data.batching import build_plan, padding_stats
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import Recipe


@dataclass(frozen=True)
class PaddingStats:
    """One epoch of the recipe's data under one batching (batching.py ``padding_stats`` and the schedule)."""

    real_tokens: int
    padded_tokens: int
    padding_fraction: float
    shapes: int
    steps_per_epoch: int
    segments_per_row: int
    shapes_list: tuple[int, ...]


@dataclass(frozen=True)
class PaddingChoices:
    """Bucketing and packing side by side (plan.json ``padding``)."""

    bucketing: PaddingStats
    packing: PaddingStats


def padding_choices(recipe: Recipe, tokenizer, data=None) -> PaddingChoices:
    """Padding of one epoch of the recipe's data under bucketing and under packing, side by side."""
    data = data if data is not None else tokenize_dataset(recipe.data, tokenizer)
    out = {}
    for name, packed in (("bucketing", False), ("packing", True)):
        plan = build_plan(recipe.with_overrides({"batching.packing": packed}), tokenizer, None, data)   # the recipe's world size: its global batch
        out[name] = PaddingStats(**padding_stats(plan), steps_per_epoch=plan.steps_per_epoch,
                                 segments_per_row=plan.slots, shapes_list=tuple(plan.boundaries))
    return PaddingChoices(**out)


def dry_run_padding(recipe: Recipe) -> tuple[PaddingChoices | None, str]:
    """(padding_choices or None, one line for the dry-run plan); None where the data or the model's
    tokenizer is not on this machine (a dry run may plan for a cluster)."""
    try:
        choices = padding_choices(recipe, load_tokenizer(resolve_hf(recipe.model.source)))
    except PortingError as exc:
        return None, f"padding: not measured ({str(exc).splitlines()[0]})"
    b, p = choices.bucketing, choices.packing
    using = "packing" if recipe.batching.packing else "bucketing"
    return choices, (f"padding per epoch (using {using}): bucketing {b.padding_fraction:.1%} in {b.shapes} "
                     f"shape(s), {b.steps_per_epoch} steps; packing {p.padding_fraction:.1%} in rows of "
                     f"{p.shapes_list[0]} tokens with {p.segments_per_row} segments, "
                     f"{p.steps_per_epoch} steps")
