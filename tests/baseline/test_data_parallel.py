"""A 2-worker data-parallel `port train` (real msrun) against ONE torch process: the baseline gathers the
micro-batches of both ranks into each step and normalises by their total tokens, which is what the
all-reduced port step computes, so the loss curves and final weights must agree in fp32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from porting.cluster.preflight import free_port
from tests.helpers import port, port_process

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "recipes/tiny-cpu.yaml"




@pytest.mark.slow
@pytest.mark.msrun
def test_two_worker_run_matches_single_process_baseline(tmp_path, model_dir):
    # one layer of stories260K (tests/conftest.py model_dir): the gathering of both ranks' micro-batches is the subject
    sets = ["--set", "schedule.max_steps=3", "--set", "cluster.devices_per_node=2", "--set", f"model.source={model_dir}"]
    run = tmp_path / "dp"
    # msrun's workers write to the launching process's own stdout/stderr: a process of its own
    p = port_process("train", RECIPE, *sets, "--set", f"cluster.master_port={free_port()}", "--run-dir", str(run),
                     timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    base = tmp_path / "dp.json"
    p = port("baseline", "run", "--recipe", RECIPE, *sets, "--out", str(base), "--threads", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(base.read_text())
    assert doc["settings"]["world_size"] == 2 and doc["settings"]["global_batch"] == 8
    p = port("compare", str(base), str(run), "--json")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    rep = json.loads(p.stdout)
    # cluster.master_port differs, which is not a compared setting
    assert rep["settings"]["differ"] == [] and rep["loss"]["steps_compared"] == 3
    assert rep["loss"]["max_abs_diff"] < 1e-4 and rep["probe"]["max_abs_diff"] < 1e-3
