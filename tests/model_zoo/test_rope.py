"""RoPE scaling as transformers computes it: yarn, dynamic (NTK) and longrope against transformers' own
initialisers (ROPE_INIT_FUNCTIONS) and rotary-embedding modules, below and above the original context, on
every kernel path (plain ops, port's C++ CPU kernel, the fused RotaryPositionEmbedding's NumPy model); then
whole models against HF at lengths past the original context, and `port verify` there."""

from __future__ import annotations

import numpy as np
import pytest

from model_zoo import LlamaConfig, build, rope
from model_zoo.errors import ConfigError

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, bos_token_id=1)
LONG = [1.0 + 0.5 * i for i in range(16)]
SHORT = [1.0 + 0.05 * i for i in range(16)]
# name -> (max_position_embeddings, rope_parameters, the original context)
KINDS = {
    "yarn": (128, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, 32),
    "yarn-untruncated-betas": (128, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                     "truncate": False, "beta_fast": 16.0, "beta_slow": 2.0}, 32),
    "yarn-mscale": (128, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                          "mscale": 0.707, "mscale_all_dim": 1.0}, 32),
    "yarn-attention-factor": (128, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                    "attention_factor": 1.25}, 32),
    "dynamic": (32, {"rope_type": "dynamic", "factor": 4.0}, 32),
    "longrope": (128, {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                       "original_max_position_embeddings": 32}, 32),
    "llama3": (128, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32}, 32),
}


def _hf_config(kind: str, model: str = "Qwen3Config"):
    import transformers

    max_pos, params, _ = KINDS[kind]
    return getattr(transformers, model)(**BASE, max_position_embeddings=max_pos,
                                        rope_parameters={"rope_theta": 10000.0, **params})


def _hf_cos_sin(hf_cfg, s: int):
    """cos and sin a freshly loaded HF model uses for a call over positions 0..s-1 (dynamic_rope_update)."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    x = torch.zeros(1, s, 8)
    cos, sin = Qwen3RotaryEmbedding(hf_cfg)(x, torch.arange(s)[None])
    return cos[0].numpy(), sin[0].numpy()


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("where", ["below", "above"])
def test_inverse_frequencies_are_transformers(kind, where):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = _hf_config(kind)
    original = KINDS[kind][2]
    seq_len = original // 2 if where == "below" else original * 3
    want, want_factor = ROPE_INIT_FUNCTIONS[hf.rope_parameters["rope_type"]](hf, None, seq_len=seq_len)
    got, factor = rope.inv_freq(LlamaConfig.from_hf(hf.to_dict()), seq_len)
    # Bitwise on the machines measured; 1 ulp allowed: torch's vectorised float32 pow is accurate to 1 ulp,
    # not correctly rounded, on every instruction set.
    np.testing.assert_array_max_ulp(got, want.numpy(), maxulp=1)
    assert factor == want_factor


def _rotated(kind: str, s: int, path: str):
    """q (1, 4, s, 32) rotated on one kernel path with the zoo model's tables for a call of length s."""
    import mindspore as ms

    from model_zoo.cpu_cells import CpuRope
    from model_zoo.llama import apply_rope
    from tests.npu_models import NUMPY_KERNELS

    model = build(LlamaConfig.from_hf(_hf_config(kind).to_dict()), device="CPU")
    cos, sin = model.rope_for(s)
    q = ms.Tensor(np.random.default_rng(0).standard_normal((1, 4, s, 32)).astype(np.float32))
    if path == "cpu":
        return CpuRope()(q, cos, sin).asnumpy()
    op = NUMPY_KERNELS["rotary_position_embedding"] if path == "fused" else None
    return apply_rope(q, cos, sin, path == "fused", op).asnumpy()


@pytest.mark.parametrize("kind", ["yarn", "dynamic", "longrope"])
@pytest.mark.parametrize("s", [24, 96])          # within the original 32 positions, and three times past them
@pytest.mark.parametrize("path", ["reference", "cpu", "fused"])
def test_rotation_on_every_kernel_path_is_transformers(kind, s, path):
    import torch
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    cos, sin = _hf_cos_sin(_hf_config(kind), s)
    q = torch.tensor(np.random.default_rng(0).standard_normal((1, 4, s, 32)).astype(np.float32))
    want, _ = apply_rotary_pos_emb(q, q, torch.tensor(cos)[None], torch.tensor(sin)[None])
    np.testing.assert_allclose(_rotated(kind, s, path), want.numpy(), rtol=0, atol=2e-6)


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_length_dependent_tables_change_past_the_original_context(kind):
    """The comparison above can fail: past the original context HF's tables are not the initial ones."""
    cfg = LlamaConfig.from_hf(_hf_config(kind).to_dict())
    cos, _ = _hf_cos_sin(_hf_config(kind), 96)
    initial, _ = rope.rope_tables(cfg, 96)
    assert np.abs(cos - initial).max() > 1e-2
    assert build(cfg, device="CPU").rope_threshold == 32


def _save(tmp_path, kind: str, model: str):
    import torch
    import transformers

    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(_hf_config(kind, model))
    m.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("kind,model", [("yarn", "Qwen3Config"), ("dynamic", "LlamaConfig"),
                                        ("longrope", "Qwen2Config")])
def test_whole_model_matches_hf_past_the_original_context(tmp_path, kind, model):
    from porting.verify.parity import check_parity

    report = check_parity(_save(tmp_path, kind, model), batch=2, seq=96, hidden_states=True, grads=True)
    assert report["seq"] == 96 and report["passed"], report["checks"]


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_generation_past_the_original_context_equals_hf_generate(tmp_path, cache):
    from porting.verify.generation import check_generation as run_generation_check

    res = run_generation_check(_save(tmp_path, "dynamic", "LlamaConfig"), 48, cache=cache)   # 49 > 32 positions
    assert res["tokens_equal"], (res["zoo_ids"], res["hf_ids"])


def test_port_verify_at_a_length_past_the_original_context(tmp_path):
    from tests.helpers import port

    d = _save(tmp_path / "yarn", "yarn", "Qwen3Config")
    r = port("verify", "--hf", str(d), "--seq", "100", "--batch", "1")
    assert r.returncode == 0 and "ids 1x100" in r.stdout and "PASS" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("rope_scaling,message", [
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": "32"}, "expected a positive integer"),
    ({"type": "yarn", "factor": 0.5, "original_max_position_embeddings": 32}, r"expected a number in \[1, 1024\]"),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": LONG, "original_max_position_embeddings": 32},
     "short_factor: found 1 numbers, expected 16"),
    ({"type": "dynamic"}, "rope_scaling.factor: missing"),
    ({"type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor: found 0.5; transformers' llama"),
    ({"type": "yarn", "factor": 4.0, "beta_fast": -1}, "beta_fast: found -1"),
])
def test_bad_rope_scaling_is_named(rope_scaling, message):
    raw = {"model_type": "llama", **BASE, "max_position_embeddings": 128, "rope_scaling": rope_scaling}
    with pytest.raises(ConfigError, match=message):
        LlamaConfig.from_hf(raw)
