"""The planner computes once: one plan computes its layout (parameters, buckets, sharding choice)
once and passes it on; a refused plan evaluates each candidate recipe (a remedy, a proposal) once.

Counted by wrapping the functions at the names the planner really calls them by (the modules of
porting/train/plan/), on the real 13B recipe: its fitting plan and the refused one without tensor parallel.
"""

from __future__ import annotations

from collections import Counter

import pytest

from porting.train.plan import comm, make, memory, roofline, sharding
from porting.train.recipe.schema import Recipe, load_recipe
from tests.train.conftest import ROOT

RECIPE = str(ROOT / "recipes" / "13b-32card.yaml")


@pytest.fixture
def counted(monkeypatch) -> Counter:
    calls: Counter = Counter()

    def wrap(name, fn):
        def counting(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return counting

    choose = wrap("choose", sharding.choose)
    monkeypatch.setattr(sharding, "choose", choose)
    est = wrap("estimate_memory", memory.estimate_memory)
    for mod in (memory, make, roofline):   # every module that calls it by name
        monkeypatch.setattr(mod, "estimate_memory", est)
    monkeypatch.setattr(comm, "parameter_numels", wrap("parameter_numels", comm.parameter_numels))
    monkeypatch.setattr(Recipe, "with_overrides", wrap("variants", Recipe.with_overrides))
    return calls


def _plan(overrides: list[str]):
    rec = load_recipe(RECIPE, overrides, check_files=False)
    cfg, _ = make.plan_config(rec)
    return make.make_plan(rec, cfg, "runs/x")


def test_a_fitting_plan_computes_its_layout_once(counted):
    plan = _plan([])
    assert plan.fits and plan.tensor_parallel == 8 and plan.sharding.stage == 1
    # the plan's own layout: one choice; memory once for the plan and once for the ZeRO-1 probe of
    # zero_stage: auto; parameters once, for the layout (the gradient buckets' table reads the same layout). On Ascend the plan also ranks the layouts that fit (porting/train/plan/roofline.py):
    # each candidate variant once, with one layout (one choice, one parameter count) and one memory estimate
    # (plus at most one ZeRO-1 probe) of its own.
    layouts = counted["variants"]
    assert plan.proposals and 4 <= layouts <= 20, counted
    assert counted["choose"] == 1 + layouts and counted["parameter_numels"] == 1 + layouts, counted
    assert 2 + layouts <= counted["estimate_memory"] <= 2 + 2 * layouts, counted


def test_a_refused_plan_evaluates_each_candidate_once(counted):
    plan = _plan(["parallel.tensor_parallel=1"])
    assert not plan.fits and plan.suggestions and plan.proposals
    variants = counted["variants"]
    # candidates: the remedies, their combination (built step by step: each step a variant) and the proposals
    assert 10 <= variants <= 40, counted
    # one layout (one choice, one parameter count) per evaluated candidate and the plan's own (the gradient buckets'
    # table reads the plan's layout); one estimate per layout, and at most one ZeRO-1 probe of zero_stage: auto
    assert counted["choose"] <= variants + 1, counted
    assert counted["parameter_numels"] == counted["choose"], counted
    assert counted["choose"] <= counted["estimate_memory"] <= 2 * counted["choose"], counted
    # before the layout was computed once: 22 choices, 40 estimates, 62 parameter counts
    assert counted["choose"] <= 20 and counted["estimate_memory"] <= 32 and counted["parameter_numels"] <= 21, counted
