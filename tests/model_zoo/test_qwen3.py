"""Qwen3 dense beyond parity (tests/model_zoo/test_parity.py): its config fields, the kernel report's
q/k-norm rows, `port ops scan` on it, and the configs the zoo refuses."""

from __future__ import annotations

import json

import pytest

from model_zoo import LlamaConfig, build, presets
from model_zoo.errors import ConfigError
from tests.converters.conftest import make_hf
from tests.helpers import port

QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=64, hidden_size=32,
             intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def test_qwen3_config_reads_its_fields():
    cfg = LlamaConfig.from_hf({**QWEN3, "attention_bias": False, "use_sliding_window": False,
                               "sliding_window": 4096, "max_window_layers": 2})
    assert cfg.qk_norm and cfg.head_dim == 16 and cfg.q_size == 64 != cfg.hidden_size
    assert not cfg.qkv_bias and not cfg.o_bias and cfg.sliding_window is None
    biased = LlamaConfig.from_hf({**QWEN3, "attention_bias": True})
    assert biased.qkv_bias and biased.o_bias   # Qwen3's attention_bias covers q, k, v and o
    assert LlamaConfig.from_hf(cfg.to_hf()) == cfg


def test_qwen3_sliding_window_on_some_layers_is_refused():
    with pytest.raises(ConfigError, match="max_window_layers=1 below num_hidden_layers=2"):
        LlamaConfig.from_hf({**QWEN3, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1})


def test_qk_norm_belongs_to_qwen3_only():
    with pytest.raises(ConfigError, match="qk_norm: found True, expected False for model_type 'llama'"):
        LlamaConfig(**{k: v for k, v in QWEN3.items() if k != "architectures"} | {"model_type": "llama",
                                                                                  "qk_norm": True})


def test_presets_are_the_released_dense_sizes():
    sizes = {n: presets.config(n) for n in presets.names() if n.startswith("qwen3-")}
    assert set(sizes) == {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"}
    assert all(c.head_dim == 128 and c.qk_norm and c.num_key_value_heads == 8 for c in sizes.values())
    assert [sizes[n].tie_word_embeddings for n in ("qwen3-0.6b", "qwen3-4b", "qwen3-8b")] == [True, True, False]
    assert all(presets.get(n)["hf_repo"].startswith("Qwen/Qwen3-") for n in sizes)


def test_kernel_report_names_the_qk_norm_kernel():
    rows = build(LlamaConfig.from_hf(QWEN3), device="CPU").kernel_report()
    qk = [r for r in rows if r.get("site")]
    assert [r["layer"] for r in qk] == [0, 1] and all(r["kernel"] == "rmsnorm" for r in qk)
    assert qk[0]["impl"] == "cpu" and "q_layernorm" in qk[0]["site"] and qk[0]["cann_op"] == "RmsNorm"


def test_port_ops_scan_traces_qwen3(tmp_path):
    d = make_hf(tmp_path / "q3", "qwen3")
    r = port("ops", "scan", "--hf", str(d), "--json")
    assert r.returncode == 0, r.stderr
    scan = json.loads(r.stdout)
    assert scan["blocking"] == [] or scan["blocking"] == 0, scan["blocking"]
    assert any("rsqrt" in op["op"] for op in scan["ops"])   # the q/k norms' and layer norms' rsqrt


def test_a_recipe_naming_the_hf_repo_id_plans_with_the_zoo_config():
    """model.source: Qwen/Qwen3-8B, not in the local cache: the dry run plans with the zoo's copy of its
    config.json (qwen3-8b), as it does for a zoo name; a Qwen3 MoE repo id is refused in one line."""
    assert presets.by_hf_repo("qwen/QWEN3-8B") == "qwen3-8b" and presets.by_hf_repo("Qwen/Qwen3-30B-A3B") is None
    r = port("train", "recipes/qwen3-8b-16die.yaml", "--dry-run", "--set", "model.source=Qwen/Qwen3-8B")
    assert r.returncode == 0, r.stderr
    assert "model: 8.191 B parameters" in r.stdout and "fits, margin" in r.stdout
    assert "planned with the zoo's copy of its config.json (qwen3-8b)" in r.stdout + r.stderr
    moe = port("train", "recipes/qwen3-8b-16die.yaml", "--dry-run", "--set", "model.source=Qwen/Qwen3-30B-A3B")
    lines = [ln for ln in moe.stderr.splitlines() if ln.strip()]
    assert moe.returncode == 2 and len(lines) == 1 and "mixture-of-experts" in lines[0] and "qwen3" in lines[0]
