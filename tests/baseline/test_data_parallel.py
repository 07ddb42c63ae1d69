"""A 2-worker data-parallel `port train` (real msrun) against ONE torch process: the baseline gathers the
micro-batches of both ranks into each step and normalises by their total tokens, which is what the
all-reduced port step computes, so the loss curves and final weights must agree in fp32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import port
from tests.train.conftest import DP2_BITWISE, shared_dp2_bitwise

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "recipes/tiny-cpu.yaml"




@pytest.fixture(scope="session")
def dp2_bitwise(model_dir, tmp_path_factory):
    """tests/train/conftest.py's fixture of that name, seen from here: one build for both (built_once)."""
    return shared_dp2_bitwise(model_dir, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.msrun
def test_two_worker_run_matches_single_process_baseline(tmp_path, model_dir, dp2_bitwise):
    # one layer of stories260K (tests/conftest.py model_dir): the gathering of both ranks' micro-batches is the
    # subject. The port side is the suite's shared DP 2 launch (tests/train/conftest.py dp2_bitwise, read only: also
    # one of tests/train/test_determinism.py's two launches): sequence length 64 without bucketing, 8 steps, no HF
    # export (the probe's logits come from the step-8 checkpoint: porting/baseline/probe_logits.py)
    sets = [a for s in DP2_BITWISE + [f"model.source={model_dir}"] for a in ("--set", s)]
    run = dp2_bitwise
    base = tmp_path / "dp.json"
    p = port("baseline", "run", "--recipe", RECIPE, *sets, "--out", str(base), "--threads", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(base.read_text())
    assert doc["settings"]["world_size"] == 2 and doc["settings"]["global_batch"] == 8
    p = port("compare", str(base), str(run), "--json")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    rep = json.loads(p.stdout)
    # cluster.master_port differs, which is not a compared setting
    assert rep["settings"]["differ"] == [] and rep["loss"]["steps_compared"] == 8
    assert rep["loss"]["max_abs_diff"] < 1e-4 and rep["probe"]["max_abs_diff"] < 1e-3
