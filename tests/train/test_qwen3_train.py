"""Qwen3 trains: a random-weight Qwen3 (saved by transformers' Qwen3ForCausalLM, per-head q/k norms,
head_dim 16 != hidden/heads 8, GQA 8/4) with stories260K's real tokenizer, on real TinyStories text.

- `port baseline` (PyTorch, HF's Qwen3ForCausalLM), `port train` and `port compare` on the same batches
  agree within the same bounds as the Llama run (tests/baseline/test_compare_cli.py);
- TP=2 on 2 msrun workers equals 1 device (the q/k norm weights replicated, their gradients summed over
  the TP group), as tests/train/test_tensor_parallel.py checks for Llama.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.model_cards import write_random
from tests.helpers import port, port_process
from tests.train.conftest import TINY, free_port
from tests.train.conftest import small_settings as _settings
from tests.train.test_tensor_parallel import _args, _compare


def write_qwen3(out, seed: int = 0, layers: int = 2):
    """A random Qwen3 checkpoint written by transformers, with stories260K's tokenizer files."""
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                                   max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    return write_random(cfg, out, seed)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return write_qwen3(tmp_path_factory.mktemp("qwen3") / "hf")


@pytest.mark.slow
def test_qwen3_trains_like_its_pytorch_baseline(qwen3_dir, tmp_path):
    recipe = "recipes/tiny-cpu.yaml"
    sets = ("--set", f"model.source={qwen3_dir}", "--set", "schedule.max_steps=6")
    base, run = tmp_path / "base.json", tmp_path / "run"
    p = port("baseline", "run", "--recipe", recipe, *sets, "--out", str(base), "--threads", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    p = port("train", recipe, *sets, "--run-dir", str(run))
    assert p.returncode == 0, p.stderr[-3000:]
    p = port("compare", str(base), str(run), "--json")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = json.loads(p.stdout)
    assert rep["ok"] and rep["settings"]["differ"] == []
    loss = rep["loss"]
    # the bounds of the Llama run (tests/baseline/test_compare_cli.py)
    assert loss["steps_compared"] == 6 and loss["failing_steps"] == []
    assert loss["max_abs_diff"] < 1e-4 and loss["max_grad_norm_rel_diff"] < 1e-3
    assert rep["probe"]["available"] and rep["probe"]["max_abs_diff"] < 1e-3
    assert rep["probe"]["argmax_agreement"] == 1.0


@pytest.fixture(scope="module")
def qwen3_one_device(qwen3_dir, tmp_path_factory):
    from porting.train import load_recipe, train

    run = tmp_path_factory.mktemp("q3tp1") / "run"
    train(load_recipe(TINY, _settings(qwen3_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2",
                                      "schedule.max_steps=3")), run, echo=False)
    return run


@pytest.mark.msrun
@pytest.mark.slow
def test_qwen3_tp2_equals_one_device(qwen3_dir, qwen3_one_device, tmp_path):
    run = tmp_path / "run"
    # PyNative: TP 2 of the Qwen3 blocks is the subject, not the mode (the reference is compiled, and
    # tests/train/test_tensor_parallel.py compiles TP 2); two workers op by op cost less than compiling
    port_process("train", str(TINY), "--run-dir", str(run), *_args(_settings(
        qwen3_dir, "batching.micro_batch_size=4", "cluster.devices_per_node=2", "parallel.tensor_parallel=2",
        "schedule.max_steps=3", "execution=pynative", f"cluster.master_port={free_port()}")), check=True, timeout=600)
    _compare(run, qwen3_one_device, qwen3_dir)
    from safetensors.numpy import load_file

    w = load_file(str(run / "hf" / "model.safetensors"))
    start = load_file(str(qwen3_dir / "model.safetensors"))
    k = "model.layers.0.self_attn.k_norm.weight"
    assert np.abs(w[k] - start[k]).max() > 1e-5   # the per-head norms trained (their summed gradients reached them)
