"""`port recipe import` on real public configs: every key mapped or refused, the global batch kept, and the
written recipe plans with `port train --dry-run`; `training_args.bin` read without running its pickle."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from porting.cli import main
from porting.intake import IntakeError
from porting.intake.pickle_reader import read_training_args_bin
from porting.intake.recipe_import import Target, import_configs, read_config
from tests.attacks.harness import ROOT

CFG = ROOT / "tests" / "fixtures" / "cuda_jobs" / "configs"
# (configs, --model, --source-gpus): every fixture config appears at least once
JOBS = {
    "hf-bin+ds-z2": (["luojiu_training_args.bin", "lf_ds_z2_config.json"], "llama2-7b", None),
    "lf-full+ds-z3-offload": (["lf_qwen3_full_sft.yaml", "lf_ds_z3_offload_config.json"], "qwen2.5-7b", 8),
    "lf-qlora": (["medical_full.yaml"], "qwen2.5-7b", None),
    "lf-lora": (["lf_llama3_lora_sft.yaml"], "llama3-8b", None),
    "accelerate-fsdp+lf": (["lf_fsdp_config.yaml", "lf_qwen3_full_sft.yaml"], "llama3.2-3b", None),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, tuple[dict, Path]]:
    d = tmp_path_factory.mktemp("recipes")
    out = {}
    for name, (cfgs, model, gpus) in JOBS.items():
        rep = import_configs([str(CFG / c) for c in cfgs], d / f"{name}.yaml", Target(model=model, source_gpus=gpus))
        out[name] = (rep, d / f"{name}.yaml")
    return out


def _keys(path: Path) -> list[str]:
    return list(read_config(path)[1])


def test_every_key_of_every_fixture_config_is_mapped_or_refused(imported):
    seen = set()
    for name, (rep, _) in imported.items():
        for c in JOBS[name][0]:
            rows = [r for r in rep["keys"] if Path(r["file"]).name == c]
            assert [r["key"] for r in rows] == _keys(CFG / c), f"{name}: {c}: not every key has a row"
            for r in rows:
                assert (r["status"] == "mapped" and r["recipe_key"]) or (r["status"] == "refused" and r["reason"]), r
            seen.add(c)
    assert seen == {p.name for p in CFG.iterdir()}, "a fixture config is not imported by any job"


def test_training_args_bin_and_deepspeed(imported):
    rep, path = imported["hf-bin+ds-z2"]
    recipe = yaml.safe_load(path.read_text())
    # luojiu: 8 per device x 4 accumulation on one GPU (fp16, cosine, lr 5e-5, seed 42, 3 epochs)
    assert rep["global_batch"]["value"] == 32
    assert recipe["batching"] == {"micro_batch_size": 1, "grad_accum_steps": 2} and rep["plan"]["data_parallel"] == 16
    assert recipe["optimizer"]["lr"] == 5e-05 and recipe["seed"] == 42 and recipe["schedule"]["epochs"] == 3
    assert recipe["schedule"]["decay"] == "cosine" and recipe["schedule"]["min_lr_ratio"] == 0.0
    assert recipe["precision"]["compute_dtype"] == "float16" and recipe["precision"]["loss_scale"]["kind"] == "dynamic"
    assert recipe["parallel"]["optimizer_sharding"] is True and recipe["parallel"]["zero_stage"] == 2
    rows = {(Path(r["file"]).name, r["key"]): r for r in rep["keys"]}
    assert rows[("lf_ds_z2_config.json", "zero_optimization.stage")]["recipe_key"].startswith("parallel.optimizer_sharding")
    assert rows[("luojiu_training_args.bin", "hub_token")]["status"] == "refused"
    assert not rep["blocking"]
    assert json.loads(path.with_suffix(".mapping.json").read_text())["keys"] == rep["keys"]


def test_refusals_that_block(imported):
    blocked = {r["key"] for r in imported["lf-qlora"][0]["blocking"]}
    assert blocked == {"quantization_bit", "quantization_method"}   # QLoRA; its LoRA keys map (test_lora_intake.py)
    z3 = {r["key"]: r for r in imported["lf-full+ds-z3-offload"][0]["keys"]}
    assert z3["zero_optimization.offload_optimizer.device"]["blocking"] is True
    assert z3["zero_optimization.stage"]["status"] == "refused" and not z3["zero_optimization.stage"]["blocking"]
    assert z3["deepspeed"]["status"] == "refused" and "never follows" in z3["deepspeed"]["reason"]
    # the accelerate config says 2 GPUs: global batch 1 x 2 x 2
    assert imported["accelerate-fsdp+lf"][0]["global_batch"]["value"] == 4


def test_every_written_recipe_plans_with_port_train_dry_run(imported):
    for name, (rep, path) in imported.items():
        res = CliRunner().invoke(main, ["train", str(path), "--dry-run"])
        assert res.exit_code == 0, f"{name}: {res.output[-2000:]}"
        assert f"global batch {rep['global_batch']['value']}" in res.output.replace("global batch:", "global batch")


def test_existing_out_is_not_overwritten(imported, tmp_path):
    out = tmp_path / "mine.yaml"
    out.write_text("model: {source: x}\n")
    with pytest.raises(IntakeError, match="port never overwrites a file it did not write"):
        import_configs([str(CFG / "medical_full.yaml")], out, Target(model="qwen2.5-7b"))
    assert out.read_text() == "model: {source: x}\n"


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch CANARY",))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blob = pickle.dumps(_Boom(), protocol=2)
    with zipfile.ZipFile(tmp_path / "training_args.bin", "w") as z:
        z.writestr("training_args/data.pkl", blob)
    with pytest.raises(IntakeError, match="names posix.system|names os.system"):
        read_training_args_bin(tmp_path / "training_args.bin")
    assert not (tmp_path / "CANARY").exists()
    pickle.loads(blob)   # what torch.load without weights_only would have done
    assert (tmp_path / "CANARY").exists()


def test_real_training_args_bin_fields():
    d = read_training_args_bin(CFG / "luojiu_training_args.bin")
    assert d["__class__"] == "transformers.training_args_seq2seq.Seq2SeqTrainingArguments"
    assert (d["per_device_train_batch_size"], d["gradient_accumulation_steps"], d["fp16"]) == (8, 4, True)
    assert (d["lr_scheduler_type"], d["optim"], d["evaluation_strategy"]) == ("cosine", "adamw_torch", "no")
    assert d["distributed_state"] == "<accelerate.state.PartialState>"


def test_training_arguments_as_json_give_the_same_recipe(imported, tmp_path):
    """`trainer.args.to_dict()` dumped as JSON (what the pickle refusal advises) imports like the .bin."""
    args = read_training_args_bin(CFG / "luojiu_training_args.bin")
    (tmp_path / "args.json").write_text(json.dumps(args))
    rep = import_configs([str(tmp_path / "args.json"), str(CFG / "lf_ds_z2_config.json")], tmp_path / "r.yaml",
                         Target(model="llama2-7b"))
    want = yaml.safe_load(imported["hf-bin+ds-z2"][1].read_text())
    got = yaml.safe_load((tmp_path / "r.yaml").read_text())
    assert got == want and rep["configs"][str(tmp_path / "args.json")] == "hf-training-args"


@pytest.mark.parametrize("alpha, blocks", [(5, True), (None, False), (0, False)])
def test_neftune_noise_blocks_when_set(tmp_path, alpha, blocks):
    """NEFTune adds noise to the input embeddings every step (transformers neftune_noise_alpha): the trained weights
    differ, and port adds none, so a job that sets it is refused by name; unset (the real training_args.bin fixture
    has None) or 0 is not used and passes."""
    doc = yaml.safe_load((CFG / "lf_llama3_lora_sft.yaml").read_text())
    doc["neftune_noise_alpha"] = alpha
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    rep = import_configs([str(tmp_path / "job.yaml")], tmp_path / "r.yaml", Target(model="llama3-8b", source_gpus=None))
    row = {r["key"]: r for r in rep["keys"]}["neftune_noise_alpha"]
    assert row["status"] == "refused" and row["blocking"] is blocks and "NEFTune" in row["reason"]
    assert ({r["key"] for r in rep["blocking"]} == {"neftune_noise_alpha"}) is blocks
