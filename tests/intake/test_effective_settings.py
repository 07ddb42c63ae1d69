"""The settings table from real CUDA job folders (tests/fixtures/cuda_jobs: an HF Trainer job, training_args.bin and
trainer_state.json; a LLaMA-Factory job, its YAML and trainer_log.jsonl) against port's side of the tiny recipe: every
setting of both sides is listed, and a difference planted in each of loss normalisation, weight decay on norms,
warm-up units, max_grad_norm and padding side is named with its expected effect. Fast: no training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from porting.baseline import effective
from porting.baseline.port_side import recipe_side
from porting.intake.job import read_cuda_job
from porting.train.recipe.schema import load_recipe

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "cuda_jobs"


def hf_job(d: Path, tokenizer: dict | None = None) -> Path:
    job = d / "hf_job"
    job.mkdir(parents=True)
    shutil.copyfile(FIX / "configs" / "luojiu_training_args.bin", job / "training_args.bin")
    shutil.copyfile(FIX / "logs" / "luojiu_trainer_state.json", job / "trainer_state.json")
    if tokenizer is not None:
        (job / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return job


def lf_job(d: Path, extra: str = "", drop: tuple[str, ...] = ()) -> Path:
    job = d / "lf_job"
    job.mkdir(parents=True)
    text = (FIX / "configs" / "medical_full.yaml").read_text()
    text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(drop)) if drop else text
    (job / "train.yaml").write_text(text + "\n" + extra)
    shutil.copyfile(FIX / "logs" / "medical_trainer_log.jsonl", job / "trainer_log.jsonl")
    return job


def port(*sets: str) -> dict:
    return recipe_side(load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", list(sets), check_files=False))


def rows(cuda: dict, port_side: dict) -> dict:
    return {r.setting: r for r in effective.table(cuda, port_side)}


@pytest.mark.parametrize("make", [hf_job, lf_job], ids=["hf-trainer", "llamafactory"])
def test_every_setting_of_both_sides_is_listed(tmp_path, make):
    table = effective.table(read_cuda_job(make(tmp_path)), port())
    assert [r.setting for r in table] == [label for _, label in effective.SETTINGS]
    for r in table:
        assert r.cuda and r.port and r.cuda_source and r.port_source, r
        assert (r.equal is True) == (r.effect == ""), r   # an effect for every difference and every unknown
    text = "\n".join(effective.render(table, all_rows=True))
    assert text.count("\n  ") >= len(effective.SETTINGS)


def test_what_the_hf_job_really_ran_with(tmp_path):
    r = rows(read_cuda_job(hf_job(tmp_path)), port())
    # transformers 4.34's TrainingArguments (no average_tokens_across_devices): a mean of micro-batch means
    assert r["loss normalisation"].equal is False and "mean of micro-batch means" in r["loss normalisation"].cuda
    assert "training_args.bin" in r["loss normalisation"].cuda_source
    assert r["precision"].cuda.startswith("fp16-mixed") and r["seed"].cuda == "42"
    assert r["Adam betas"].cuda == "(0.9, 0.999)" and r["Adam betas"].equal is False
    assert r["max_grad_norm (clipping)"].cuda == "1" and r["max_grad_norm (clipping)"].equal is True
    assert r["global batch (sequences per step)"].equal is None   # the GPU count is in no file
    assert "GPU count" in r["global batch (sequences per step)"].cuda
    assert r["attention dropout"].equal is None and "config.json" in r["attention dropout"].cuda


def test_what_the_llamafactory_job_really_ran_with(tmp_path):
    r = rows(read_cuda_job(lf_job(tmp_path)), port())
    assert r["warm-up length (optimizer steps)"].cuda.startswith("675 (ceil(0.1 x 6750))")
    assert r["padding side"].cuda.startswith("right") and "loader.py" in r["padding side"].cuda_source
    assert r["truncation"].cuda.startswith("prompt and response cut in proportion")
    assert r["chat template"].cuda == "LLaMA-Factory template 'qwen'"
    assert r["loss normalisation"].equal is None and "transformers version" in r["loss normalisation"].cuda
    assert r["precision"].cuda.startswith("bf16-mixed")


def test_planted_loss_normalisation(tmp_path):
    r = rows(read_cuda_job(lf_job(tmp_path, "average_tokens_across_devices: false\n")), port())
    row = r["loss normalisation"]
    assert row.equal is False and "each device's accumulated micro-batches" in row.cuda
    assert "weighs the tokens of short micro-batches" in row.effect and "transformers#34242" in row.effect


def test_planted_weight_decay_on_norms(tmp_path):
    cuda = read_cuda_job(lf_job(tmp_path, "weight_decay: 0.1\n"))
    row = rows(cuda, port("optimizer.weight_decay=0.1"))["weight decay on norms and biases"]
    assert row.equal is False and row.cuda.startswith("not decayed") and row.port.startswith("decayed")
    assert "norm gains and biases shrink by lr x weight_decay" in row.effect
    # at weight decay 0 on both sides, decaying norms or not changes nothing
    same = rows(read_cuda_job(lf_job(tmp_path / "b")), port())["weight decay on norms and biases"]
    assert same.equal is True and same.effect == ""


def test_planted_warmup_units(tmp_path):
    # LLaMA-Factory counts 10 optimizer steps (8 accumulated micro-batches each); a port recipe of 80 counted
    # the same warm-up in micro-steps
    cuda = read_cuda_job(lf_job(tmp_path, "warmup_steps: 10\n", drop=("warmup_ratio",)))
    row = rows(cuda, port("schedule.warmup_steps=80", "batching.grad_accum_steps=8",
                          "batching.micro_batch_size=1"))["warm-up length (optimizer steps)"]
    assert row.equal is False and row.cuda == "10" and row.port == "80"
    assert "the port warm-up is the other's x 8 (the gradient accumulation): one side counted it in micro-steps" \
        in row.effect
    assert rows(cuda, port("schedule.warmup_steps=10"))["warm-up length (optimizer steps)"].equal is True


def test_planted_max_grad_norm(tmp_path):
    row = rows(read_cuda_job(lf_job(tmp_path, "max_grad_norm: 0.3\n")), port())["max_grad_norm (clipping)"]
    assert row.equal is False and row.cuda == "0.3" and row.port == "1"
    assert "exceeds the smaller threshold are scaled down on that side only" in row.effect
    off = rows(read_cuda_job(lf_job(tmp_path / "b", "max_grad_norm: 0\n")), port("optimizer.grad_clip=null"))
    assert off["max_grad_norm (clipping)"].equal is True   # 0 in transformers and null in port: no clipping


def test_planted_padding_side(tmp_path):
    row = rows(read_cuda_job(hf_job(tmp_path, {"padding_side": "left"})), port())["padding side"]
    assert row.equal is False and row.cuda == "left" and row.port.startswith("right")
    assert "tokenizer_config.json:padding_side" == row.cuda_source
    assert "rotary" in row.effect and "rounding differs" in row.effect
    right = rows(read_cuda_job(hf_job(tmp_path / "b", {"padding_side": "right"})), port())["padding side"]
    assert right.equal is True


def test_deepspeed_optimizer_decays_every_parameter(tmp_path):
    job = lf_job(tmp_path, "weight_decay: 0.1\n")
    (job / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2},
                                             "optimizer": {"type": "AdamW", "params": {"weight_decay": 0.1}}}))
    row = rows(read_cuda_job(job), port("optimizer.weight_decay=0.1"))["weight decay on norms and biases"]
    assert row.equal is True and "DeepSpeed's optimizer gets every trainable parameter" in row.cuda


def test_the_side_survives_the_baseline_file(tmp_path):
    """What intake stores in the imported baseline reads back as the same facts, and a forged one is refused."""
    side = read_cuda_job(lf_job(tmp_path))
    back = effective.side_from_dict(json.loads(json.dumps(effective.side_to_dict(side))), "x")
    assert back == side
    with pytest.raises(ValueError, match="x.seed: expected an object"):
        effective.side_from_dict({"seed": 5}, "x")


@pytest.mark.slow
def test_intake_then_compare_prints_the_table_and_the_gates(tmp_path, tiny_cpu_run):
    """`port intake` of the LLaMA-Factory folder stores its settings, evaluation loss and log in the baseline;
    `port compare` of the suite's tiny run against it prints the differing settings before any loss row, and the
    field's gates with figures; `--cuda-job` reads an HF job folder's settings instead."""
    from tests.helpers import port as port_cli

    mig = tmp_path / "mig"
    res = port_cli("intake", str(lf_job(tmp_path)), "--out", str(mig), "--model", "stories260k")
    assert res.returncode == 0, res.stderr[-2000:]
    base = json.loads((mig / "baseline.json").read_text())
    assert base["imported"]["effective_settings"]["padding_side"]["value"] == "right"
    assert len(base["evaluation"]["step"]) == 13 and base["evaluation"]["source"] == "trainer_log.jsonl eval_loss"
    out = port_cli("compare", str(mig / "baseline.json"), str(tiny_cpu_run), "--allow-settings-mismatch")
    assert out.returncode == 1   # another model's curve: the gates fail, and say so
    text = out.stdout
    assert text.index("EFFECTIVE SETTINGS (CUDA side | port side)") < text.index("THE FIELD'S GATES") \
        < text.index("CURVE GATE")
    assert "DIFFERS chat template: CUDA LLaMA-Factory template 'qwen'  |  port none (plain text)" in text
    assert "FAIL  loss-weighted per-step relative error" in text and "steps 10-20, 2 compared" in text
    assert "N/A   evaluation loss relative error" in text and "the run logged no evaluation loss" in text
    assert "N/A   throughput per device-equivalent" in text and "not known: baseline tokens/s" in text
    hf = port_cli("compare", str(mig / "baseline.json"), str(tiny_cpu_run), "--allow-settings-mismatch", "--json",
                  "--cuda-job", str(hf_job(tmp_path)))
    rows = {r["setting"]: r for r in json.loads(hf.stdout)["settings_table"]}
    assert "mean of micro-batch means" in rows["loss normalisation"]["cuda"]
