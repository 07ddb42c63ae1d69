"""Non-finite steps (porting/train/run/step/nonfinite.py): the update of a step whose loss or gradient is not finite
is skipped in the graph (weights, masters and AdamW moments keep their values, the step's data is consumed),
counted against the recipe's caps, and past them the run stops with one line naming the window; the caps are
strict integers; the supervisor rolls back once past a window and stops if it recurs.

Under msrun: tests/train/test_nonfinite_msrun.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from model_zoo.errors import RecipeError
from porting.rundir import ranklog
from porting.train.recipe.schema import apply_overrides, validate_recipe
from porting.train.run.step import nonfinite
from porting.train.run.step.nonfinite import SkipGuard
from porting.train.run.step.result import StepResult
from tests.helpers import port
from tests.train.conftest import FAST, TINY

RAW = {"model": {"source": "x"}, "data": {"path": "y"}}


def _r(applied: bool, scale: float = 1.0) -> StepResult:
    return StepResult(loss=1.0 if applied else math.nan, grad_norm=math.nan, finite=applied, applied=applied,
                      scale_used=scale, step_time_s=0.1, compile=False, tokens=8)


def test_the_caps_count_consecutive_and_total_non_finite_steps_and_name_the_window():
    g = SkipGuard(max_consecutive=2, max_total=3)
    assert [g.after(n, _r(False), False) for n in (1, 2)] == [None, None]
    assert g.after(3, _r(True), False) is None and g.consecutive == 0 and g.total == 2   # a good step ends the streak
    assert g.after(4, _r(False), False) is None
    stop = g.after(5, _r(False), False)
    assert stop is not None and "4 non-finite steps in all (last window: steps 4..5)" in stop
    assert "nonfinite.max_total_skips is 3" in stop and ranklog.WINDOW.search(stop)
    g = SkipGuard(max_consecutive=1, max_total=100)
    g.after(7, _r(False), False)
    stop = g.after(8, _r(False), False)
    assert "2 non-finite steps in a row (steps 7..8)" in stop and "max_consecutive_skips is 1" in stop
    # dynamic loss scaling: an overflow above scale 1 is the scaler's (not counted); at scale 1 it counts
    g = SkipGuard(max_consecutive=0, max_total=0)
    assert g.classify(_r(False, 1024.0), True) == nonfinite.OVERFLOW and g.after(1, _r(False, 1024.0), True) is None
    assert g.after(2, _r(False, 1.0), True) is not None


def test_caps_and_windows_are_strict_in_the_recipe():
    rec = validate_recipe(RAW, check_files=False)
    assert (rec.nonfinite.max_consecutive_skips, rec.nonfinite.max_total_skips, rec.nonfinite.skip_steps) == (10, 100, [])
    rec = validate_recipe(apply_overrides(RAW, ["nonfinite.skip_steps=[[5, 7], [9, 9]]"]), check_files=False)
    assert nonfinite.in_window(rec, 6) == (5, 7) and nonfinite.in_window(rec, 9) == (9, 9)
    assert nonfinite.in_window(rec, 8) is None
    for bad, needle in [("nonfinite.max_consecutive_skips=true", "nonfinite.max_consecutive_skips"),
                        ("nonfinite.max_total_skips=1.0", "nonfinite.max_total_skips"),
                        ("nonfinite.max_total_skips=-1", "nonfinite.max_total_skips"),
                        ("nonfinite.skip_steps=[[7, 5]]", "first <= last"),
                        ("nonfinite.skip_steps=[[0, 5]]", "nonfinite.skip_steps.0.0"),
                        ("nonfinite.skip_steps=[[true, 5]]", "nonfinite.skip_steps: Value error, expected a number, got a boolean"),
                        ("nonfinite.max_skips=3", "nonfinite.max_skips")]:
        with pytest.raises(RecipeError, match=needle.replace(".", r"\.").replace("[", r"\[")):
            validate_recipe(apply_overrides(RAW, [bad]), check_files=False)


def test_supervisor_rolls_back_once_past_a_window_then_stops():
    from porting.launch.supervise import Incident, Limits, _action

    def inc(n, window):
        return Incident(n=n, at=0.0, kind="diverged", seen="the launch exited with 3", step=window[1], verdict=None,
                        skip_window=list(window))
    windows: list = []
    first = inc(1, (3, 5))
    act = _action(first, [], 0, Limits(max_restarts=3), 2, windows)
    assert act.startswith("rolled back to step 2") and "steps 3..5" in act and windows == [(3, 5)]
    assert _action(inc(2, (6, 8)), [first], 1, Limits(max_restarts=3), 2, windows).startswith(
        "stopped: non-finite steps again after the rollback (steps 6..8)")
    assert _action(inc(1, (3, 5)), [], 0, Limits(max_restarts=0), 2, []).startswith("stopped: 0 restart(s)")


# --------------------------------------------------------------------------- real steps, one device


@pytest.mark.graph_mode
@pytest.mark.usefixtures("graph_mode_module")
def test_a_non_finite_loss_with_finite_gradients_applies_nothing(model_dir):
    """ApplyStep gets the step's summed loss as an input: an infinite one (the gradients in the buffers are
    finite) must leave weights, moments and buffers' update untouched and report the step not finite."""
    import mindspore as ms
    from mindspore import ParameterTuple

    from converters.loading import load_hf_dir
    from model_zoo import LlamaConfig, build
    from porting.train.run.step import cells as train_step

    cfg = LlamaConfig.from_hf(model_dir)
    model = build(cfg, param_dtype="float32", compute_dtype="float32", device="CPU", seed=0)
    load_hf_dir(model, model_dir)
    params = list(model.trainable_params())
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.0)
    buffers = train_step.accumulation_buffers(ParameterTuple(params))
    grad, apply = (train_step.AccumGradStep(model, opt.params, buffers),
                   train_step.ApplyStep(opt, buffers, 1, 1.0))
    f = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
    ids = ms.Tensor(np.arange(2 * 32, dtype=np.int32).reshape(2, 32) % cfg.vocab_size)
    state = lambda: [p.asnumpy().copy() for p in [*params, *opt.m, *opt.v]]  # noqa: E731
    before = state()
    for total, expect in ((math.inf, False), (math.nan, False), (100.0, True)):
        grad(ids, ids, f(1.0 / 62))
        _, _, norm, finite = apply(f(total), f(62.0), f(1.0), f(1e-3), f(0.1), f(0.05))
        assert bool(finite.asnumpy()) is expect, total
        after = state()
        same = all(np.array_equal(a, b) for a, b in zip(before, after))
        assert same is not expect, f"loss {total}: the update was {'applied' if same is False else 'skipped'}"
        assert all(not np.any(b.asnumpy()) for b in buffers)   # the data is consumed either way


def _train(run: Path, *sets: str, hook: str) -> object:
    args = [a for s in sets for a in ("--set", s)]
    return port("train", str(TINY), "--run-dir", str(run), *FAST, "--set", "schedule.max_steps=4", *args,
                env={"PORT_TEST_NONFINITE": hook})


# One skipped step keeps weights, masters and moments (checkpoints before and after equal): under msrun, where
# the NaN of one rank must reach every rank, in tests/train/test_nonfinite_msrun.py.
@pytest.mark.slow   # 12-20 s on 2 busy cores (one graph compile)
def test_non_finite_every_step_stops_past_the_cap_with_one_line(tmp_path):
    r = _train(tmp_path / "every", "nonfinite.max_consecutive_skips=2", hook="*")
    assert r.returncode == 3
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "3 non-finite steps in a row (steps 1..3)" in err[0], r.stderr[-2000:]
    assert "nonfinite.max_consecutive_skips is 2" in err[0] and "Traceback" not in r.stderr


def test_a_resumed_run_counts_the_non_finite_steps_its_kept_metrics_record(tmp_path):
    """The total cap spans launches: the guard of a run resumed at step 4 starts from the non-finite skips of
    steps 1..4 in metrics.jsonl (not overflow or data-window skips, not steps a killed launch logged later)."""
    from porting.rundir import MetricsWriter, StepRecord

    w = MetricsWriter(tmp_path)
    for n, why in enumerate(["nonfinite", None, "overflow", "nonfinite", "data window", "nonfinite"], start=1):
        w.step(StepRecord(step=n, loss=1.0, skipped=why is not None, skip_reason=why))
    w.close()
    rec = validate_recipe(apply_overrides(RAW, ["nonfinite.max_total_skips=2"]), check_files=False)
    g = nonfinite.guard_for(rec, tmp_path, 4)
    assert (g.total, g.consecutive) == (2, 0) and nonfinite.prior_skips(tmp_path, 0) == 0
    stop = g.after(5, _r(False), False)
    assert stop is not None and "3 non-finite steps in all" in stop


@pytest.mark.slow
def test_a_burst_past_the_cap_is_rolled_back_once_and_the_supervised_run_finishes(tmp_path):
    """One device under --supervise: steps 3..5 go non-finite (the hook), the cap of 2 stops the launch at step 5;
    the supervisor rolls back to step 4's checkpoint skipping the data of steps 3..5, and the run finishes."""
    from tests.helpers import port_process
    from tests.train.conftest import metrics

    run = tmp_path / "burst"
    sets = ["schedule.max_steps=8", "checkpointing.every_steps=2", "nonfinite.max_consecutive_skips=2"]
    r = port_process("train", str(TINY), "--run-dir", str(run), *FAST, *[a for s in sets for a in ("--set", s)],
                     "--supervise", env={"PORT_TEST_NONFINITE": "3,4,5"}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 restart(s)" in r.stdout
    incidents = [json.loads(ln) for ln in (run / "incidents.jsonl").read_text().splitlines()]
    assert len(incidents) == 1 and incidents[0]["skip_window"] == [3, 5], incidents
    assert incidents[0]["action"].startswith("rolled back to step 4")
    steps, summary = metrics(run)
    assert summary is not None and summary["steps"] == 4      # this launch's records: 5 (window) .. 8
    assert {s["step"]: s.get("skip_reason") for s in steps} == {1: None, 2: None, 3: "nonfinite", 4: "nonfinite",
                                                                5: "data window", 6: None, 7: None, 8: None}
    assert (run / "checkpoints" / "step_8").is_dir()
