"""LlamaConfig from HF config.json, presets checked against HF transformers, and bad configs."""

from __future__ import annotations

import json

import pytest

from model_zoo import LlamaConfig, presets
from model_zoo.errors import ConfigError, UnknownModelError


def test_embedded_stories_config(stories_dir):
    cfg = LlamaConfig.from_hf(stories_dir)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 5, 8, 4)
    assert cfg.tie_word_embeddings and cfg.head_dim == 8 and cfg == presets.config("stories260k")


@pytest.mark.parametrize("name", presets.names())
def test_preset_matches_hf_parameter_count(name):
    """Each preset, written out as config.json, builds the same-sized model in HF transformers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = presets.config(name)
    hf_cfg = AutoConfig.for_model(**cfg.to_hf())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_parameters()
    assert LlamaConfig.from_hf(hf_cfg.to_dict()) == cfg  # and reads back identically


def test_known_sizes():
    assert presets.config("llama-7b").num_parameters() == 6_738_415_616
    assert presets.config("llama2-13b").num_parameters() == 13_015_864_320
    assert presets.config("llama3-8b").num_parameters() == 8_030_261_248


def test_transformers_v4_and_v5_rope_fields_agree():
    base = dict(model_type="llama", vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4)
    v4 = LlamaConfig.from_hf({**base, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    v5 = LlamaConfig.from_hf({**base, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}})
    assert v4 == v5 and v4.rope_scaling == {"rope_type": "linear", "factor": 2.0} and v4.rope_theta == 5e5


def _write(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


BASE = dict(model_type="llama", vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4)


def test_missing_config_json(tmp_path):
    with pytest.raises(ConfigError, match=r"no config\.json found"):
        LlamaConfig.from_hf(tmp_path)


def test_unsupported_architecture_lists_supported(tmp_path):
    _write(tmp_path, {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768})
    with pytest.raises(ConfigError) as e:
        LlamaConfig.from_hf(tmp_path)
    msg = str(e.value)
    assert "gpt2" in msg and "LlamaForCausalLM" in msg and "qwen2" in msg and str(tmp_path) in msg


def test_hidden_not_divisible_by_heads(tmp_path):
    _write(tmp_path, {**BASE, "hidden_size": 30})
    with pytest.raises(ConfigError, match="hidden_size: found 30, expected a multiple of num_attention_heads=4"):
        LlamaConfig.from_hf(tmp_path)


def test_all_problems_reported_at_once(tmp_path):
    _write(tmp_path, {**BASE, "num_key_value_heads": 3, "hidden_act": "gelu", "rms_norm_eps": -1})
    with pytest.raises(ConfigError) as e:
        LlamaConfig.from_hf(tmp_path)
    for field in ("num_key_value_heads", "hidden_act", "rms_norm_eps"):
        assert field in str(e.value)


def test_rope_scaling_missing_keys_named():
    with pytest.raises(ConfigError, match="rope_scaling.factor: missing, required for rope_type 'dynamic'"):
        LlamaConfig.from_hf({**BASE, "rope_scaling": {"type": "dynamic"}})
    with pytest.raises(ConfigError, match="rope_type 'su' is not supported"):
        LlamaConfig.from_hf({**BASE, "rope_scaling": {"type": "su", "factor": 2.0}})
    with pytest.raises(ConfigError, match="low_freq_factor: missing"):
        LlamaConfig.from_hf({**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})


def test_malformed_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config.json: invalid config.json at line 1 column 2"):
        LlamaConfig.from_hf(tmp_path)


def test_unknown_zoo_name_suggests_nearest():
    with pytest.raises(UnknownModelError, match="did you mean llama2-13b"):
        presets.get("llama2-13")
