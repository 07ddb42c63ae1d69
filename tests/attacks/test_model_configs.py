"""Model configs whose right answer is a value, not a refusal (issue 51; the refusals are corpus cases in
tests/attacks/models/config_cases.py): each is read as transformers' own config class reads it, checked
against the installed transformers, and no value port accepts makes the RoPE tables non-finite.

* A key config.json leaves out takes the family's default (Qwen3's context and head_dim, Mistral's KV heads
  and window, Phi-3's original context, epsilon and ids), not Llama's.
* ``rope_scaling`` and ``rope_parameters`` both set: read once when they agree; when they differ port refuses
  (the corpus) and the installed transformers is shown to take ``rope_scaling``, as the refusal says.
* Every RoPE bound of docs/promises.md 3.2, taken at its edge, still gives finite tables at the longest length
  the config allows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from model_zoo import LlamaConfig, rope
from model_zoo.rope_config import BETA_RANGE, LIST_RANGE, MAX_ATTENTION_FACTOR, MAX_FACTOR, MAX_MSCALE

SIZES = dict(vocab_size=40000, hidden_size=256, intermediate_size=96, num_hidden_layers=2, num_attention_heads=32)
CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
           "phi3": "Phi3Config"}


def _hf(model_type: str, raw: dict):
    import transformers

    return getattr(transformers, CLASSES[model_type]).from_dict(raw)


@pytest.mark.parametrize("model_type", sorted(CLASSES))
def test_missing_keys_take_the_familys_defaults_as_transformers_does(model_type):
    raw = {"model_type": model_type, **SIZES}
    ours, hf = LlamaConfig.from_hf(raw), _hf(model_type, raw)
    hf_head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert ours.num_key_value_heads == hf.num_key_value_heads
    assert ours.head_dim == hf_head
    assert ours.max_position_embeddings == hf.max_position_embeddings
    assert ours.rms_norm_eps == hf.rms_norm_eps
    assert ours.rope_theta == hf.rope_parameters["rope_theta"]
    assert ours.partial_rotary_factor == hf.rope_parameters.get("partial_rotary_factor", 1.0)
    assert ours.sliding_window == getattr(hf, "sliding_window", None)
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (hf.bos_token_id, hf.eos_token_id,
                                                                       hf.pad_token_id)


def test_a_phi3_longrope_without_its_original_context_takes_phi3s_4096():
    long = [1.0] * 4   # head_dim 8: four frequencies
    raw = {"model_type": "phi3", **SIZES, "max_position_embeddings": 131072,
           "rope_scaling": {"type": "longrope", "short_factor": long, "long_factor": long}}
    ours, hf = LlamaConfig.from_hf(raw), _hf("phi3", raw)
    assert ours.rope_scaling["original_max_position_embeddings"] == hf.rope_parameters[
        "original_max_position_embeddings"] == 4096   # not max_position_embeddings, which Llama's rule would give


def test_a_qwen3_without_head_dim_or_context_is_qwen3s():
    ours = LlamaConfig.from_hf({"model_type": "qwen3", **SIZES})
    assert (ours.head_dim, ours.max_position_embeddings, ours.num_key_value_heads) == (128, 32768, 32)


def test_both_rope_keys_agreeing_are_read_once_and_differing_ones_are_what_transformers_splits_on():
    from model_zoo.errors import ConfigError

    same = {"model_type": "llama", **SIZES, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}
    assert LlamaConfig.from_hf(same).rope_scaling == {"rope_type": "linear", "factor": 2.0}
    differ = dict(same, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    with pytest.raises(ConfigError, match="both rope_scaling .* and rope_parameters .* are set and differ"):
        LlamaConfig.from_hf(differ)
    assert _hf("llama", differ).rope_parameters["factor"] == 2.0   # the installed transformers takes rope_scaling


EDGES = {   # each bound of docs/promises.md 3.2 at its edge
    "dynamic factor": ({"rope_type": "dynamic", "factor": MAX_FACTOR}, 64, 1e4),
    "linear factor": ({"rope_type": "linear", "factor": MAX_FACTOR}, 64, 1e4),
    "yarn everything at the top": ({"rope_type": "yarn", "factor": MAX_FACTOR, "original_max_position_embeddings": 16,
                                    "beta_fast": BETA_RANGE[1], "beta_slow": BETA_RANGE[0], "mscale": MAX_MSCALE,
                                    "mscale_all_dim": MAX_MSCALE, "attention_factor": MAX_ATTENTION_FACTOR}, 64, 1e12),
    "yarn betas at the bottom, theta just above 1": ({"rope_type": "yarn", "factor": 1.0, "beta_fast": BETA_RANGE[0],
                                                      "beta_slow": BETA_RANGE[0],
                                                      "original_max_position_embeddings": 1 << 24}, 64, 1.0001),
    "llama3 frequencies at the edges": ({"rope_type": "llama3", "factor": MAX_FACTOR, "low_freq_factor": 1e-9,
                                         "high_freq_factor": MAX_FACTOR, "original_max_position_embeddings": 16},
                                        64, 1e12),
    "longrope lists at the edges": ({"rope_type": "longrope", "short_factor": [LIST_RANGE[0]] * 4,
                                     "long_factor": [LIST_RANGE[1]] * 4, "original_max_position_embeddings": 16},
                                    64, 1e4),
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_every_rope_bound_at_its_edge_gives_finite_tables(name):
    rs, max_pos, theta = EDGES[name]
    cfg = LlamaConfig(**{**SIZES, "vocab_size": 64}, head_dim=8, max_position_embeddings=max_pos, rope_theta=theta,
                      rope_scaling=dict(rs))   # validates: every value here is accepted
    longest = max(cfg.longest_sequence, rs.get("original_max_position_embeddings", 0) + 1)
    for length in (None, longest):
        inv, attention = rope.inv_freq(cfg, length)
        positions = np.array([0, 1, longest // 2, longest - 1])
        cos, sin = rope.tables_from(inv, attention, positions)
        assert np.isfinite(cos).all() and np.isfinite(sin).all() and math.isfinite(attention), (name, length)
