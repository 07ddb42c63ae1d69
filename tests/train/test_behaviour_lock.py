"""Behaviour lock for the reshaping of ``porting/train/`` (issue 20): the plans of every shipped recipe,
a refused plan, and a short real run (metrics without timings, every checkpoint and exported tensor by
sha256) are what they were before the move. tests/train/behaviour_lock.py observes them and regenerates
tests/train/fixtures/behaviour_lock.json (``python -m tests.train.behaviour_lock --write``)."""

from __future__ import annotations

import json

import pytest

from tests.train import behaviour_lock as lock


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(lock.EXPECTED.read_text())


def test_every_shipped_recipe_is_locked(expected):
    # a new recipe must be added to the lock (regenerate), not silently left out of it
    assert {k.split(" ")[0] for k in expected["plans"]} == set(lock.RECIPES)


@pytest.mark.parametrize("key", [f"{r} {k}" for r in lock.RECIPES for k in ("text", "json")]
                         + [f"{lock.REFUSED[0]} {' '.join(lock.REFUSED[1])} text"])
def test_dry_run_plan_unchanged(expected, key):
    recipe, *rest = key.split(" ")
    extra = ["--json"] if rest[-1] == "json" else [a for a in rest[:-1]]
    got = lock.dry_run(recipe, extra)
    assert got == expected["plans"][key]


def test_the_refused_plan_is_refused(expected):
    got = expected["plans"][f"{lock.REFUSED[0]} {' '.join(lock.REFUSED[1])} text"]
    assert got["exit_code"] != 0 and got["stderr"].startswith("error: ")


@pytest.mark.slow
def test_tiny_run_metrics_and_tensors_unchanged(expected, tmp_path_factory):
    got = lock.tiny_run(tmp_path_factory.mktemp("lock") / "run")
    want = expected["run"]
    assert got["metrics"] == want["metrics"]
    assert got["states"] == want["states"]
    assert got["plan"] == want["plan"]
    assert got["tensors"] == want["tensors"]
    assert len(want["tensors"]) == 3 and all(want["tensors"].values())   # two checkpoints and the export
