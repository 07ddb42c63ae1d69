"""`port eval`: mean token loss and perplexity of the real stories260K, zoo cell against HF transformers,
on text and chat data; and `port train`'s held-out evaluation (data.eval_split)."""

from __future__ import annotations

import json
import math

import pytest

from porting.train.data.batching import build_plan
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import validate_recipe
from porting.tokenizer import load_tokenizer
from tests.train.conftest import FAST, ROOT, TINY, error_line, metrics
from tests.helpers import port

TEXT = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"
PARTS = ROOT / "tests" / "train" / "fixtures" / "openai_parts_v1_sft_demo.jsonl"


def _eval(*args) -> dict:
    r = port("eval", *args, "--json", check=True)
    return json.loads(r.stdout[r.stdout.index("{"):])


@pytest.mark.slow
def test_zoo_cell_matches_hf_on_real_text():
    four = _eval("--hf", "stories260k", "--data", str(TEXT), "--long-text", "split", "--batch-size", "4")
    z, h = four["zoo"], four["hf"]
    assert z["examples"] == 5 and z["tokens"] == h["tokens"] > 1000
    assert four["abs_diff_mean_loss"] < 1e-4, four
    # the verdict is the one result row, held to the float32 loss tolerance of porting/verify/stats.py
    assert four["passed"] and [(c["name"], c["measure"], c["tolerance"]) for c in four["checks"]] == [
        ("mean loss, zoo vs HF", "abs_diff", 1e-5)] and four["checks"][0]["value"] == four["abs_diff_mean_loss"]
    # shared/README.md: about 1.27 nats/token on TinyStories (validation 1.297)
    assert 1.0 < z["mean_loss"] < 1.6 and z["perplexity"] == pytest.approx(math.exp(z["mean_loss"]))
    # a token-weighted mean: batching does not change it (HF on batches of 1, in process)
    from porting.train.run.heldout import batches
    from porting.verify.evaluate import hf_loss

    tok = load_tokenizer(ROOT / "model_zoo" / "assets" / "stories260k")
    raw = {"model": {"source": "stories260k"}, "data": {"path": str(TEXT), "max_seq_length": 512, "long_text": "split"}}
    td = tokenize_dataset(validate_recipe(raw).data, tok)
    s1, n1 = hf_loss(ROOT / "model_zoo" / "assets" / "stories260k", batches(td, 1, four["shapes"]))
    assert n1 == z["tokens"] and s1 / n1 == pytest.approx(h["mean_loss"], abs=1e-5)


@pytest.mark.slow
def test_converted_checkpoint_on_chat_data_against_its_hf_source(tmp_path):
    out = tmp_path / "ms"
    port("convert", "--hf", "stories260k", "--out", str(out), "-q", check=True)
    rep = _eval("--ms", str(out), "--data", str(PARTS), "--reference", "stories260k")
    assert rep["data"]["format"] == "chat" and rep["zoo"]["examples"] == 16
    assert rep["zoo"]["tokens"] == rep["data"]["loss_tokens"] and rep["abs_diff_mean_loss"] < 1e-4, rep
    # a weight changed in the conversion: the zoo cell no longer matches its source, the row fails, exit 1
    import os

    from safetensors.numpy import load_file, save_file

    f = out / "model.safetensors"
    tensors = load_file(f)
    tensors["model.norm_out.weight"] = tensors["model.norm_out.weight"] * 1.5
    os.chmod(f, 0o644)
    save_file(tensors, f)
    bad = port("eval", "--ms", str(out), "--data", str(PARTS), "--reference", "stories260k")
    assert bad.returncode == 1 and "mean loss, zoo vs HF" in bad.stdout and "FAIL" in bad.stdout, bad.stdout


def test_eval_bad_input_is_one_line(tmp_path):
    both = port("eval", "--hf", "stories260k", "--ms", str(tmp_path), "--data", str(PARTS))
    assert both.returncode == 2 and "exactly one of --hf MODEL or --ms DIR" in error_line(both)
    missing = port("eval", "--hf", "stories260k", "--data", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and "data.path: file not found" in error_line(missing)
    assert "Traceback" not in both.stderr + missing.stderr


def test_held_out_split_is_never_trained_on():
    tok = load_tokenizer(ROOT / "model_zoo" / "assets" / "stories260k")
    raw = {"model": {"source": "stories260k"}, "data": {"path": str(TEXT), "max_seq_length": 64, "long_text": "split",
                                                        "eval_split": 0.25}}
    plan = build_plan(validate_recipe(raw), tok)
    held = {e.input_ids.tobytes() for e in plan.eval_data.examples}
    trained = {plan.data.examples[i].input_ids.tobytes() for s in plan.steps() for mb in s.micro_batches
               for i in mb.example_ids}
    assert held and trained and not held & trained
    assert len(plan.eval_data.examples) == plan.data.report.eval_examples == round(0.25 * (len(held) + len(plan.data.examples)))
    assert max(e.length for e in plan.eval_data.examples) <= max(plan.boundaries)


@pytest.mark.slow
def test_port_train_evaluates_every_n_steps(tmp_path):
    run = tmp_path / "run"
    port("train", str(TINY), *FAST, "--set", "schedule.max_steps=4", "--set", "data.eval_split=0.25",
         "--set", "data.eval_every_steps=2", "--set", "logging.tensorboard=true", "--run-dir", str(run), check=True)
    steps, _ = metrics(run)
    assert [s["step"] for s in steps if "eval_loss" in s] == [2, 4]
    ev = [s for s in steps if "eval_loss" in s]
    assert all(math.isfinite(s["eval_loss"]) and s["eval_perplexity"] == pytest.approx(math.exp(s["eval_loss"]))
               for s in ev) and ev[0]["eval_tokens"] == ev[1]["eval_tokens"] > 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["data"]["eval_examples"] > 0 and manifest["bucketing"]["eval_examples"] > 0
    from porting.train.run.watch import read_scalars

    assert [s for s, _ in read_scalars(run)["eval/loss"]] == [2, 4]
    bad = port("train", str(TINY), "--set", "data.eval_split=1.5", "--run-dir", str(tmp_path / "r2"))
    assert bad.returncode == 2 and "data.eval_split" in error_line(bad)
