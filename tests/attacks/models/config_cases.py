"""Model configs of the new families as a new user (or a careless colleague) writes them (issue 51): RoPE keys
transformers would not accept or that make the model non-finite, keys that two transformers versions read
differently, Phi-3 checkpoints that do not hold what Phi-3 holds, and `verify` past what the model takes.
Every one is refused in one line naming the key, before a model is built or a file written. Each config.json
is first written by transformers' own config class, then edited as a user would edit it.
(Imported by tests/attacks/models/cases.py: the cases belong to the models folder.)"""

from __future__ import annotations

import json

from tests.attacks.harness import case

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def _model(d, cls: str = "LlamaConfig", *, weights: bool = False, edit: dict | None = None, **extra) -> str:
    """A model directory: transformers' ``cls`` config.json (and seeded weights when asked), then ``edit``
    applied to the JSON as a user's editor would (values the config class itself would refuse)."""
    import torch
    import transformers

    m = d / "model"
    cfg = getattr(transformers, cls)(**{**SMALL, **extra})
    if weights:
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(m)
    else:
        cfg.save_pretrained(m)
    if edit:
        raw = json.loads((m / "config.json").read_text())
        raw.update(edit)
        (m / "config.json").write_text(json.dumps(raw))
    return str(m)


def _rope(kind: str, **keys) -> dict:
    return {"rope_parameters": None, "rope_scaling": {"rope_type": kind, **keys}, "rope_theta": 10000.0}


# -- one key, two readings
@case("both rope_scaling", "and rope_parameters", "are set and differ", "transformers 5.x takes rope_scaling")
def rope_scaling_and_rope_parameters_differ_convert(d):
    m = _model(d, weights=True, edit={"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                      "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}})
    return ["convert", "--hf", m, "--out", str(d / "out")]


@case("partial_rotary_factor is 0.5 at the top level and 0.75 in the rope dict")
def partial_rotary_factor_two_values_verify(d):
    return ["verify", "--hf", _model(d, "Phi3Config", pad_token_id=0, edit={
        "partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.75}})]


@case("rope_scaling.original_max_position_embeddings=8192 differs from the top-level", "Phi3Config's default 4096")
def phi3_original_context_in_two_places_verify(d):
    long = [1.0] * 4
    return ["verify", "--hf", _model(d, "Phi3Config", pad_token_id=0, edit={
        "original_max_position_embeddings": 4096, "max_position_embeddings": 65536,
        "rope_parameters": None, "rope_scaling": {"type": "longrope", "short_factor": long, "long_factor": long,
                                                  "original_max_position_embeddings": 8192}})]


# -- values without a bound, or that break the arithmetic (the model would be NaN, or the maths would raise)
@case("rope_scaling.factor: found 1e+17, expected a number in [1, 1024]")
def dynamic_factor_1e17_generate(d):
    return ["generate", "--hf", _model(d, edit=_rope("dynamic", factor=1e17)), "--max-new-tokens", "2"]


@case("rope_scaling.attention_factor: found 1e+300, expected a number in (0, 8]")
def yarn_attention_factor_1e300_generate(d):
    m = _model(d, edit=_rope("yarn", factor=4.0, attention_factor=1e300, original_max_position_embeddings=512))
    return ["generate", "--hf", m, "--max-new-tokens", "2"]


@case("rope_scaling.factor: found 1e+306")
def linear_factor_1e306_convert(d):
    return ["convert", "--hf", _model(d, weights=True, edit=_rope("linear", factor=1e306)), "--out", str(d / "out")]


@case("dynamic NTK scaling needs more than 2 rotated dimensions", "found 2")
def dynamic_with_head_dim_2_verify(d):
    return ["verify", "--hf", _model(d, hidden_size=8, head_dim=2, edit=_rope("dynamic", factor=2.0))]


@case("rope_theta: found 1.0, expected a number above 1")
def yarn_with_rope_theta_1_verify(d):
    m = _model(d, edit={**_rope("yarn", factor=4.0, original_max_position_embeddings=512), "rope_theta": 1.0})
    return ["verify", "--hf", m]


@case("rope_scaling.beta_fast: found 1e+300, expected a number in [0.001, 10000]")
def yarn_extreme_beta_fast_verify(d):
    m = _model(d, edit=_rope("yarn", factor=4.0, beta_fast=1e300, original_max_position_embeddings=512))
    return ["verify", "--hf", m]


def _llama3(**freq) -> dict:
    return _rope("llama3", factor=8.0, original_max_position_embeddings=256,
                 **{"low_freq_factor": 1.0, "high_freq_factor": 4.0, **freq})


for _n, _f, _e in [
    ("llama3_low_freq_factor_string", {"low_freq_factor": "1"}, "rope_scaling.low_freq_factor: found '1'"),
    ("llama3_low_freq_factor_list", {"low_freq_factor": [1.0]}, "rope_scaling.low_freq_factor: found [1.0]"),
    ("llama3_high_freq_factor_bool", {"high_freq_factor": True}, "rope_scaling.high_freq_factor: found True"),
    ("llama3_low_freq_factor_zero", {"low_freq_factor": 0}, "rope_scaling.low_freq_factor: found 0, expected"),
    ("llama3_high_not_above_low", {"low_freq_factor": 4.0}, "high_freq_factor: found 4.0, expected more than"),
]:
    def _gen(d, f=_f):
        return ["convert", "--hf", _model(d, weights=True, edit=_llama3(**f)), "--out", str(d / "out")]
    _gen.__name__ = _n + "_convert"
    case(_e, "config.json")(_gen)


@case("rope_scaling.short_factor[2]: found 'x', expected a number")
def longrope_list_holding_a_string_verify(d):
    short = [1.0, 1.0, "x", 1.0]
    m = _model(d, edit=_rope("longrope", short_factor=short, long_factor=[2.0] * 4, original_max_position_embeddings=64))
    return ["verify", "--hf", m]


@case("rope_type 'dynamic' is not one transformers' Phi3Config accepts")
def phi3_with_dynamic_rope_verify(d):
    return ["verify", "--hf", _model(d, "Phi3Config", pad_token_id=0, edit=_rope("dynamic", factor=2.0))]


@case("partial_rotary_factor: found 0.75; transformers' llama attention rotates the whole head")
def llama_with_partial_rotation_train(d):
    from tests.attacks.harness import ROOT

    m = _model(d, edit={"partial_rotary_factor": 0.75})
    return ["train", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--dry-run", "--set", f"model.source={m}"]


# -- Phi-3: what its checkpoints hold, and verify's own limits
@case("model_type 'phi3' stores fused tensors", "model.layers.N.self_attn.qkv_proj.weight",
      "set model_type to llama")
def llama_weights_labelled_phi3_convert(d):
    m = _model(d, weights=True, edit={"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "pad_token_id": 0})
    return ["convert", "--hf", m, "--out", str(d / "out")]


def _names_only_fused(line: str, d) -> None:
    assert "qkv_proj" in line and "gate_up_proj" in line, line
    assert not any(p in line for p in (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")), line


@case("missing", "model.layers.2.mlp.gate_up_proj.weight", "model.layers.2.self_attn.qkv_proj.weight",
      check=_names_only_fused)
def phi3_missing_layer_named_as_stored_convert(d):
    m = _model(d, "Phi3Config", weights=True, pad_token_id=0)
    raw = json.loads((d / "model" / "config.json").read_text())
    raw["num_hidden_layers"] = 3
    (d / "model" / "config.json").write_text(json.dumps(raw))
    return ["convert", "--hf", m, "--out", str(d / "out")]


@case("pad_token_id: found 32000 (transformers' Phi3ForCausalLM default, config.json has none)",
      "expected null or an id below vocab_size=64")
def phi3_without_pad_token_id_verify(d):
    m = _model(d, "Phi3Config", weights=True, pad_token_id=0)
    raw = json.loads((d / "model" / "config.json").read_text())
    del raw["pad_token_id"]
    (d / "model" / "config.json").write_text(json.dumps(raw))
    return ["verify", "--hf", m]


@case("--seq 32 is longer than the model's sliding_window=8", "use --seq 8 or less")
def verify_past_the_sliding_window(d):
    return ["verify", "--hf", _model(d, "MistralConfig", weights=True, sliding_window=8), "--seq", "32"]


# -- repo ids of models that are not dense Llama-style
def _lf_job(d, repo: str):
    from tests.attacks.harness import ROOT

    text = (ROOT / "tests" / "fixtures" / "cuda_jobs" / "configs" / "lf_qwen3_full_sft.yaml").read_text()
    job = d / "job"
    job.mkdir()
    (job / "sft.yaml").write_text(text.replace("Qwen/Qwen3-4B-Instruct-2507", repo))
    return job


@case("HF repo Qwen/Qwen3-Coder-30B-A3B-Instruct", "not a dense Llama-style model", "mixture-of-experts")
def intake_qwen3_coder_moe_repo_id(d):
    return ["intake", str(_lf_job(d, "Qwen/Qwen3-Coder-30B-A3B-Instruct")), "--out", str(d / "out")]


@case("HF repo Qwen/Qwen3-VL-8B-Instruct", "not a dense Llama-style model", "vision tower")
def intake_qwen3_vl_repo_id(d):
    return ["intake", str(_lf_job(d, "Qwen/Qwen3-VL-8B-Instruct")), "--out", str(d / "out")]


@case("HF repo Qwen/Qwen3-VL-30B-A3B-Instruct", "mixture-of-experts")
def intake_qwen3_vl_moe_repo_id(d):
    return ["intake", str(_lf_job(d, "Qwen/Qwen3-VL-30B-A3B-Instruct")), "--out", str(d / "out")]
