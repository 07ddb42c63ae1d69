"""A bucketed run of a dynamic-NTK model equals its PyTorch baseline (issue 47): `port baseline run`, then
`port train` for the same 12 steps over buckets of 16, 48, 96 and 112 tokens past the original context of
32 (factor 4), then `port compare`. Both sides give each call the frequencies of its own length
(docs/rope.md "State across calls"); a raw transformers model, which keeps a longer bucket's frequencies
for a shorter one past 32, fails the same comparison at several steps (measured: loss 0.25 off at 6 of 12)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import EMBEDDED
from tests.helpers import port

RECIPE = "recipes/tiny-cpu.yaml"


@pytest.mark.slow
def test_a_bucketed_dynamic_run_equals_its_baseline(tmp_path):
    import torch
    import transformers

    model = tmp_path / "model"
    torch.manual_seed(0)   # weights of 0.3: the frequencies move the loss by ~0.1 (a random model's 0.02 barely does)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=32, initializer_range=0.3, bos_token_id=1,
        eos_token_id=2, rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})
    ).save_pretrained(model)
    for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(EMBEDDED / f, model / f)
    sets = [a for kv in (f"model.source={model}", "data.max_seq_length=112", "batching.micro_batch_size=2",
                         "batching.bucketing.pad_to_multiple_of=16", "schedule.max_steps=12", "schedule.epochs=3")
            for a in ("--set", kv)]
    p = port("baseline", "run", "--recipe", RECIPE, *sets, "--out", str(tmp_path / "base.json"), "--threads", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    p = port("train", RECIPE, *sets, "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "shapes [16, 48, 96, 112]" in p.stdout + p.stderr
    p = port("compare", str(tmp_path / "base.json"), str(tmp_path / "run"), "--json")
    assert p.returncode == 0, p.stdout[-3000:]
    loss = json.loads(p.stdout)["loss"]
    assert loss["steps_compared"] == 12 and loss["failing_steps"] == [] and loss["max_abs_diff"] < 1e-4
