"""The zoo cell against HF transformers on tiny random models of every supported variant."""

from __future__ import annotations

import pytest

from porting.verify.parity import check_parity

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128)

VARIANTS = {
    "llama-gqa-untied": ("LlamaConfig", dict(num_key_value_heads=2)),
    "llama-mqa-tied": ("LlamaConfig", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "llama-mha": ("LlamaConfig", dict(num_key_value_heads=4, rms_norm_eps=1e-5, rope_theta=500000.0)),
    "llama3-rope-scaling": ("LlamaConfig", dict(num_key_value_heads=2, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "linear-rope-scaling": ("LlamaConfig", dict(num_key_value_heads=2, rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "llama-attention-and-mlp-bias": ("LlamaConfig", dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    "explicit-head-dim": ("LlamaConfig", dict(num_key_value_heads=2, head_dim=32)),
    "qwen2-qkv-bias": ("Qwen2Config", dict(num_key_value_heads=2)),
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=None)),
    # Qwen3: per-head q/k RMSNorm before RoPE; head_dim 32 and 24, not hidden/heads = 16
    "qwen3-gqa-untied": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=32)),
    "qwen3-mqa-tied": ("Qwen3Config", dict(num_key_value_heads=1, head_dim=24, tie_word_embeddings=True)),
}


def make_hf_model(tmp_path, cls_name: str, extra: dict, seed: int = 0):
    import torch
    import transformers

    cfg = getattr(transformers, cls_name)(**TINY, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # random biases and norms, so a dropped bias or norm weight shows up
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_and_loss_match_hf(tmp_path, variant):
    cls_name, extra = VARIANTS[variant]
    d = make_hf_model(tmp_path, cls_name, extra)
    report = check_parity(d, batch=2, seq=24)
    rows = {r["name"]: r for r in report["checks"]}
    assert rows["logits"]["measure"] == "max_abs" and rows["logits"]["value"] <= 1e-4, rows["logits"]
    assert report["passed"], report["checks"]


def test_hidden_states_and_grads_match_hf(tmp_path):
    d = make_hf_model(tmp_path, "LlamaConfig", dict(num_key_value_heads=2, attention_bias=True))
    report = check_parity(d, batch=2, seq=16, hidden_states=True, grads=True)
    names = [r["name"] for r in report["checks"]]
    assert sum(n.startswith("hidden[") for n in names) == TINY["num_hidden_layers"] + 1
    assert any(n.startswith("grad norms") for n in names)
    assert report["passed"], report["checks"]


@pytest.mark.parametrize("rmsnorm", ["auto", "reference"])   # port's CPU kernel, then the plain-op reference
def test_qwen3_hidden_states_and_grads_match_hf(tmp_path, rmsnorm):
    d = make_hf_model(tmp_path, "Qwen3Config", dict(num_key_value_heads=2, head_dim=32))
    report = check_parity(d, batch=2, seq=16, hidden_states=True, grads=True, kernels_override={"rmsnorm": rmsnorm})
    rows = {r["name"]: r for r in report["checks"]}
    # 2 layers x (2 norms, q/k norms, 4 projections, 3 MLP) + embedding, final norm, LM head
    assert "grad norms (25 tensors)" in rows
    assert report["passed"], report["checks"]


def test_parity_detects_a_wrong_qk_norm(tmp_path, monkeypatch):
    """A dropped per-head k norm must fail parity: the norm weights are random around 1."""
    import converters.loading as loading
    from mindspore import Tensor

    d = make_hf_model(tmp_path, "Qwen3Config", dict(num_key_value_heads=2, head_dim=32))
    real = loading.load_hf_dir

    def load_then_reset(model, path):
        real(model, path)
        p = model.model.layers[0].attention.k_layernorm.weight
        p.set_data(Tensor(p.asnumpy() * 0 + 1))

    monkeypatch.setattr(loading, "load_hf_dir", load_then_reset)
    assert not check_parity(d, batch=1, seq=8)["passed"]


@pytest.mark.compat
def test_parity_detects_a_wrong_weight(tmp_path, monkeypatch):
    """A check that cannot fail is no check: nudge one loaded zoo tensor and parity must fail."""
    import numpy as np
    from mindspore import Tensor

    import converters.loading as loading

    d = make_hf_model(tmp_path, "LlamaConfig", dict(num_key_value_heads=2))
    real = loading.load_hf_dir

    def load_then_corrupt(model, path):
        real(model, path)
        p = model.model.layers[1].feed_forward.w3.weight
        p.set_data(Tensor(p.asnumpy() + np.float32(1e-2)))   # MindSpore 2.7: no Tensor + NumPy scalar

    monkeypatch.setattr(loading, "load_hf_dir", load_then_corrupt)
    report = check_parity(d, batch=1, seq=8)
    assert not report["passed"]


@pytest.mark.parametrize("cache", ["static", "dynamic", "none"])
def test_qwen3_greedy_generation_with_kv_cache_equals_hf_generate(tmp_path, cache):
    from porting.verify.generation import check_generation as run_generation_check

    d = make_hf_model(tmp_path, "Qwen3Config", dict(num_key_value_heads=2, head_dim=32, bos_token_id=1))
    res = run_generation_check(d, 24, cache=cache)
    assert res["tokens_equal"], (res["zoo_ids"], res["hf_ids"])
    assert len(set(res["hf_ids"])) > 3   # not one repeated token: the comparison can tell caches apart
