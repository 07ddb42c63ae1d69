"""``determinism: bitwise`` (porting/train/recipe/determinism.py, porting/train/run/step/deterministic.py): the switches
set and recorded, what would undo them refused with the reason, `port doctor`'s line; and two real msrun launches of
the same 2-worker recipe give bit-identical losses and final weights over 8 steps (4 epochs of the data; one slow
test, two launches of one layer of stories260K at sequence length 64, tests/conftest.py ``model_dir``)."""

from __future__ import annotations

import hashlib
import json

import pytest

from porting.train.recipe import determinism as rules
from porting.train.recipe.schema import load_recipe
from tests.helpers import port, port_process
from tests.train.conftest import DP2_BITWISE, TINY, free_port, metrics, tiny_plan


def test_the_plan_exports_the_switches_on_every_node():
    plan = tiny_plan("cluster.devices_per_node=2", "determinism=bitwise")
    assert plan.launch.env["HCCL_DETERMINISTIC"] == "true" and plan.launch.env["TE_PARALLEL_COMPILER"] == "1"
    assert "CLOSE_MATMUL_K_SHIFT" not in plan.launch.env   # an Ascend matmul switch: not on the CPU
    assert "HCCL_DETERMINISTIC" not in tiny_plan("cluster.devices_per_node=2").launch.env
    assert rules.launch_env("bitwise", "ascend") == {"HCCL_DETERMINISTIC": "true", "TE_PARALLEL_COMPILER": "1",
                                                     "CLOSE_MATMUL_K_SHIFT": "1", "ATB_MATMUL_SHUFFLE_K_ENABLE": "0"}
    assert rules.launch_env("default", "ascend") == {}


def test_what_would_undo_it_is_refused_with_the_reason():
    bad = rules.environment_conflicts("bitwise", "ascend", {"HCCL_DETERMINISTIC": "false", "CLOSE_MATMUL_K_SHIFT": "0",
                                                            "ATB_MATMUL_SHUFFLE_K_ENABLE": "0"})
    assert len(bad) == 2 and "HCCL_DETERMINISTIC='false'" in bad[0] and "set HCCL_DETERMINISTIC=true" in bad[0]
    assert "CLOSE_MATMUL_K_SHIFT='0'" in bad[1] and "precision_alignment_zh.md" in bad[1]
    assert rules.environment_conflicts("bitwise", "ascend", {"HCCL_DETERMINISTIC": "strict"}) == []
    assert rules.environment_conflicts("bitwise", "cpu", {"CLOSE_MATMUL_K_SHIFT": "0"}) == []   # Ascend only
    assert rules.environment_conflicts("default", "ascend", {"HCCL_DETERMINISTIC": "false"}) == []
    assert "another data-parallel layout" in rules.launch_problems("bitwise", shrink=True)[0]
    assert rules.launch_problems("default", shrink=True) == []


def test_train_refuses_them_before_anything_starts(tmp_path):
    args = ("train", str(TINY), "--set", "determinism=bitwise", "--run-dir", str(tmp_path / "run"))
    res = port(*args, env={"HCCL_DETERMINISTIC": "false"})
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "undoes determinism: bitwise" in res.stderr
    res = port(*args, "--supervise", "--shrink")
    assert res.returncode == 2 and "--shrink relaunches on fewer devices" in res.stderr
    assert not (tmp_path / "run").exists()


def test_cann_batch_consistency_where_the_installed_cann_has_it():
    assert rules.cann_level("9.2.RC1", "ascend")[0] == "3"
    assert rules.cann_level("10.0.0", "ascend")[0] == "3"
    level, words = rules.cann_level("8.3.RC1", "ascend")
    assert level is None and words == "not available: CANN 8.3.RC1 is older than 9.2"
    assert rules.cann_level(None, "ascend") == (None, "not available: no CANN version found")
    assert rules.cann_level("9.2.0", "cpu") == (None, "not applicable (CPU)")


def test_doctor_reports_the_switches_in_force():
    from porting.diagnostics.doctor import determinism_line, determinism_switches

    d = determinism_switches({"HCCL_DETERMINISTIC": "false", "CLOSE_MATMUL_K_SHIFT": "1"}, None, npu=False)
    assert d["switches"]["HCCL_DETERMINISTIC"] == "false" and d["switches"]["ATB_MATMUL_SHUFFLE_K_ENABLE"] == "unset"
    assert d["undone"] == ["HCCL_DETERMINISTIC"]
    line = determinism_line(d)
    assert "HCCL_DETERMINISTIC=false" in line and "CLOSE_MATMUL_K_SHIFT=1" in line
    assert "set to a value determinism: bitwise refuses" in line
    res = port("doctor")
    assert "determinism switches in force:" in res.stdout


@pytest.mark.msrun
@pytest.mark.slow
def test_two_launches_give_the_same_bits(tmp_path, model_dir, dp2_bitwise):
    """The same 2-worker recipe launched twice: bit-identical losses (metrics.jsonl) and final weights (sha256 of
    every rank's checkpoint file) over 8 steps (micro-batch 4 x DP 2 of the 16 windows: 4 epochs); the switches each
    run recorded are the port side of the settings table. The first launch is the suite's shared one
    (tests/train/conftest.py dp2_bitwise, also tests/baseline/test_data_parallel.py's port side)."""
    from porting.baseline.port_side import run_side
    from porting.rundir import read_run

    run = tmp_path / "b"
    args = [a for s in DP2_BITWISE + [f"model.source={model_dir}", f"cluster.master_port={free_port()}"]
            for a in ("--set", s)]
    port_process("train", str(TINY), "--run-dir", str(run), *args, check=True, timeout=500)
    runs = [dp2_bitwise, run]
    losses = [[s["loss"] for s in metrics(r)[0]] for r in runs]
    assert len(losses[0]) == 8 and losses[0] == losses[1]   # every step's float, bit for bit
    digests = [[hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(r.glob("checkpoints/step_8/*.safetensors"))]
               for r in runs]
    assert digests[0] and digests[0] == digests[1]
    recorded = json.loads((runs[0] / "manifest.json").read_text())["determinism"]
    assert recorded["mindspore_deterministic"] == "ON" and recorded["HCCL_DETERMINISTIC"] == "true"
    assert recorded["seed"] == 0 and recorded["cann_batch_consistency"] == "not applicable (CPU)"
    fact = run_side(read_run(runs[0]))["determinism"]
    assert fact.value == "bitwise" and "mindspore_deterministic=ON" in fact.shown
    assert load_recipe(TINY, ["determinism=bitwise"]).determinism == "bitwise"
