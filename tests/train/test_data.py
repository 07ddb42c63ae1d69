"""The framework-neutral data pipeline: tokenisation, masking, truncation, bad rows, bucketing, and
the step structure that makes accumulation and data parallel equal."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_zoo.errors import RecipeError
from porting.train.data.batching import build_plan, choose_boundaries, padding_stats
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import validate_recipe
from porting.tokenizer import load_tokenizer
from tests.train.conftest import ROOT, error_line
from tests.helpers import port

EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
TEXT = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(EMBEDDED)


def _recipe(path, **over):
    raw = {"model": {"source": "stories260k"}, "data": {"path": str(path)}}
    for k, v in over.items():
        raw.setdefault(k, {}).update(v)
    return validate_recipe(raw)


def test_alpaca_prompt_masked_and_truncation_counted(tok, alpaca):
    r = _recipe(alpaca, data={"max_seq_length": 256})
    td = tokenize_dataset(r.data, tok)
    rep = td.report
    assert rep.format == "alpaca" and rep.rows == len(json.loads(alpaca.read_text())) and rep.bad_rows == 0
    # prompts longer than the limit leave nothing to learn from: counted and skipped
    assert rep.no_target > 0 and rep.examples == rep.rows - rep.no_target
    assert rep.truncated >= sum(1 for e in td.examples if e.length == 256) > 0
    row = json.loads(alpaca.read_text())[0]
    e = td.examples[0]
    prompt = r.data.prompt_template.format(instruction=row["instruction"])
    n_prompt = 1 + len(tok.encode(prompt, add_special_tokens=False))
    assert e.input_ids[0] == tok.bos_token_id
    assert (e.labels[:n_prompt] == IGNORE_INDEX).all()
    assert (e.labels[n_prompt:] == e.input_ids[n_prompt:]).all()
    target = tok.decode(e.input_ids[n_prompt:], skip_special_tokens=True)
    assert row["output"].startswith(target[:40])


def test_chat_masks_everything_but_assistant(tok, tmp_path):
    p = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": "Tell a story."},
                          {"role": "assistant", "content": "Once upon a time there was a cat."}]}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    td = tokenize_dataset(_recipe(p).data, tok)
    e = td.examples[0]
    kept = [int(t) for t, l in zip(e.input_ids, e.labels) if l != IGNORE_INDEX]
    assert tok.decode(kept, skip_special_tokens=True).strip() == "Once upon a time there was a cat."


def test_malformed_rows_counted_then_fatal_with_option(tok, tmp_path):
    p = tmp_path / "mixed.jsonl"
    good = {"instruction": "Say hi.", "input": "", "output": "Hi!"}
    p.write_text("\n".join([json.dumps(good), "{not json", json.dumps({"instruction": "x"}),
                            json.dumps({"instruction": "y", "output": 3}), json.dumps(good)]) + "\n")
    td = tokenize_dataset(_recipe(p, data={"format": "alpaca"}).data, tok)
    assert td.report.rows == 5 and td.report.bad_rows == 3 and td.report.examples == 2
    assert any("row 2: not valid JSON" in s for s in td.report.bad_row_samples)
    assert any("row 3: missing key 'output'" in s for s in td.report.bad_row_samples)
    with pytest.raises(RecipeError, match="row 2: not valid JSON.*data.on_bad_row=fail"):
        tokenize_dataset(_recipe(p, data={"format": "alpaca", "on_bad_row": "fail"}).data, tok)
    r = port("train", "recipes/tiny-cpu.yaml", "--set", f"data.path={p}", "--set", "data.format=alpaca",
             "--set", "data.long_text=truncate", "--set", "data.on_bad_row=fail", "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2 and "row 2: not valid JSON" in error_line(r)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_steps_are_deterministic_and_resume_anywhere(tok):
    r = _recipe(TEXT, data={"max_seq_length": 64, "long_text": "split"}, batching={"micro_batch_size": 2},
                schedule={"epochs": 3})
    p1, p2 = build_plan(r, tok), build_plan(r, tok)
    s1, s2 = list(p1.steps()), list(p2.steps(start=5))
    assert len(s1) == p1.total_steps == 3 * p1.steps_per_epoch
    for a, b in zip(s1[5:], s2):
        assert a.index == b.index and a.micro_batches[0].example_ids == b.micro_batches[0].example_ids
        assert np.array_equal(a.micro_batches[0].input_ids, b.micro_batches[0].input_ids)
    orders = [tuple(s.micro_batches[0].example_ids for s in s1[e * p1.steps_per_epoch:(e + 1) * p1.steps_per_epoch])
              for e in range(3)]
    assert len(set(orders)) == 3, "each epoch draws a new order"
    mb = s1[0].micro_batches[0]
    assert mb.input_ids.dtype == np.int32 and mb.labels.dtype == np.int32
    assert mb.tokens == int((mb.labels[:, 1:] != IGNORE_INDEX).sum())


def test_accumulation_and_data_parallel_see_the_same_examples(tok, alpaca):
    base = {"data": {"max_seq_length": 256}}
    plans = {
        "4x1x1": build_plan(_recipe(alpaca, **base, batching={"micro_batch_size": 4, "grad_accum_steps": 1}), tok),
        "1x4x1": build_plan(_recipe(alpaca, **base, batching={"micro_batch_size": 1, "grad_accum_steps": 4}), tok),
        "1x2x2": build_plan(_recipe(alpaca, **base, batching={"micro_batch_size": 1, "grad_accum_steps": 2}), tok,
                              world_size=2),
    }
    for i in range(5):
        ref = plans["4x1x1"].step(i, 0)
        ids = sorted(ref.micro_batches[0].example_ids)
        one = plans["1x4x1"].step(i, 0)
        assert sorted(x for mb in one.micro_batches for x in mb.example_ids) == ids
        dp = [plans["1x2x2"].step(i, r) for r in (0, 1)]
        assert sorted(x for s in dp for mb in s.micro_batches for x in mb.example_ids) == ids
        assert ref.global_tokens == one.global_tokens == dp[0].global_tokens == dp[1].global_tokens
        assert sum(mb.tokens for mb in one.micro_batches) == one.global_tokens


def test_bucketing_on_alpaca_wastes_under_5_percent_with_16_shapes(tok, alpaca):
    r = _recipe(alpaca, data={"max_seq_length": 512}, batching={"micro_batch_size": 4})
    plan = build_plan(r, tok)
    stats = padding_stats(plan)
    assert stats["shapes"] <= 16
    assert stats["padding_fraction"] <= 0.05, stats
    shapes = {mb.shape for s in plan.steps() for mb in s.micro_batches}
    assert shapes <= set(plan.shapes())
    flat = padding_stats(build_plan(_recipe(alpaca, data={"max_seq_length": 512}, batching={
        "micro_batch_size": 4, "bucketing": {"enabled": False}}), tok))
    assert flat["shapes"] == 1 and flat["padding_fraction"] > 0.25


def test_choose_boundaries_is_optimal_on_small_case():
    lengths = np.array([10, 11, 12, 30, 31, 90])
    assert choose_boundaries(lengths, 3, 1, 128) == [12, 31, 90]
    assert choose_boundaries(lengths, 1, 8, 128) == [96]


def test_text_jsonl_rows_use_text_field(tok, tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"body": "Once upon a time."}) + "\n" + json.dumps({"body": ""}) + "\n")
    td = tokenize_dataset(_recipe(p, data={"text_field": "body"}).data, tok)
    assert td.report.format == "text" and td.report.examples == 1 and td.report.bad_rows == 1
    e = td.examples[0]
    assert (e.labels[1:] == e.input_ids[1:]).all() and e.input_ids[-1] == tok.eos_token_id


def test_data_parallel_ranks_of_one_step_share_one_shape(tok, alpaca):
    """Issue 22: every rank (and every accumulation micro-batch) of a step is padded to the bucket of the
    step's longest row, so no rank meets a new shape (a graph compile) while the others wait in the
    all-reduce. Alpaca's lengths spread over many buckets, so per-micro-batch padding would differ."""
    r = _recipe(alpaca, data={"max_seq_length": 512}, batching={"micro_batch_size": 1, "grad_accum_steps": 2})
    plan = build_plan(r, tok, world_size=4)
    assert len(plan.boundaries) > 4
    seen = set()
    for i in range(plan.total_steps):
        shapes = {mb.shape for rank in range(4) for mb in plan.step(i, rank).micro_batches}
        assert len(shapes) == 1, (i, shapes)
        seen |= shapes
    assert len(seen) > 1 and seen <= set(plan.shapes())   # still bucketed: steps differ, ranks do not
    stats = padding_stats(plan)
    real = sum(s.global_real_tokens for s in plan.steps() if s.epoch == 0)
    padded = sum(s.global_padded_tokens for s in plan.steps() if s.epoch == 0)
    assert stats["padding_fraction"] == pytest.approx(1 - real / padded)   # the stats pad as the steps do


@pytest.mark.parametrize("start", [0, 3])
def test_run_shapes_are_the_shapes_the_steps_use(tok, alpaca, start):
    """What is compiled before step 1 (porting/train/run/step/precompile.py) is exactly what the steps from
    ``start`` on use, over more than one epoch, and no more."""
    r = _recipe(alpaca, data={"max_seq_length": 512}, batching={"micro_batch_size": 2},
                schedule={"epochs": 2})
    plan = build_plan(r, tok, world_size=2)
    used = {mb.shape for s in plan.steps(1, start) for mb in s.micro_batches}
    assert plan.run_shapes(start) == sorted(used)
    assert len(plan.run_shapes(start)) > 1
