"""`port intake DIR`: a CUDA job folder of real public files in, a migration folder out."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from porting.cli import main
from porting.intake import IntakeError
from porting.intake.job import run_intake
from porting.intake.recipe_import import Target
from tests.attacks.harness import ROOT

FIX = ROOT / "tests" / "fixtures" / "cuda_jobs"


@pytest.fixture
def job(tmp_path):
    j = tmp_path / "job"
    (j / "checkpoint-500").mkdir(parents=True)
    shutil.copy(FIX / "configs" / "luojiu_training_args.bin", j / "training_args.bin")
    shutil.copy(FIX / "configs" / "lf_ds_z2_config.json", j / "ds_z2_config.json")
    shutil.copy(FIX / "logs" / "luojiu_trainer_state.json", j / "trainer_state.json")
    shutil.copy(FIX / "logs" / "whisper_ja_trainer_state.json", j / "checkpoint-500" / "trainer_state.json")
    shutil.copytree(FIX / "scripts", j / "scripts")
    (j / "config.json").write_text(json.dumps({"model_type": "llama"}))   # a model config: not a training config
    return j


def test_intake_writes_recipe_baseline_scan_and_readme(job, tmp_path):
    out = tmp_path / "migration"
    s = run_intake(job, out, Target(model="llama2-7b"))
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "baseline.json", "intake.json", "recipe.mapping.json",
                                                     "recipe.yaml", "script_scan.json"]
    assert s["log"].endswith("job/trainer_state.json")   # 8,712 steps beat the checkpoint's 5,000
    base = json.loads((out / "baseline.json").read_text())
    assert base["settings"]["global_batch"] == 32 and base["settings"]["seq_length"] == 2048
    assert s["scan"]["findings"] == 27 and sorted(s["configs"]) == sorted(
        [str(job / "ds_z2_config.json"), str(job / "training_args.bin")])
    readme = (out / "README.md").read_text()
    assert f"port train {out}/recipe.yaml --dry-run" in readme and "port convert --hf llama2-7b" in readme
    res = CliRunner().invoke(main, ["train", str(out / "recipe.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output[-2000:]


def test_intake_refuses_a_non_empty_out_and_leaves_it(job, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(IntakeError, match="exists and is not empty"):
        run_intake(job, out, Target(model="llama2-7b"))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
