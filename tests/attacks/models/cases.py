"""Checkpoints that are not dense Llama-style (mixture of experts, hybrid linear attention, other norm and
attention forms), and training configs naming such a model by HF repo id: every command that reads a
model refuses them in one line naming what differs and the nearest family port supports, and writes
nothing (model_zoo/families.py). Each config.json is written by transformers' own config class."""

from __future__ import annotations

import json
import shutil

from tests.attacks.harness import ROOT, case

FIX = ROOT / "tests" / "fixtures" / "cuda_jobs"
NOT_LLAMA = "not a dense Llama-style model"
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def _config(d, cls: str, **extra) -> str:
    """A model directory holding the config.json ``transformers.<cls>`` writes (no weights: the door is first)."""
    import transformers

    m = d / "model"
    getattr(transformers, cls)(**{**SMALL, **extra}).save_pretrained(m)
    return str(m)


@case(NOT_LLAMA, "mixture-of-experts", "the nearest is qwen3")
def qwen3_moe_verify(d):
    return ["verify", "--hf", _config(d, "Qwen3MoeConfig", num_experts=8, num_experts_per_tok=2)]


@case(NOT_LLAMA, "Gated DeltaNet linear-attention", "the nearest is qwen3")
def qwen3_5_hybrid_convert(d):
    return ["convert", "--hf", _config(d, "Qwen3_5TextConfig", head_dim=8), "--out", str(d / "out")]


@case(NOT_LLAMA, "mixture-of-experts", "chunked local attention", "the nearest is llama")
def llama4_moe_zoo_add(d):
    return ["zoo", "add", "my-llama4", "--hf", _config(d, "Llama4TextConfig", num_local_experts=4)]


@case(NOT_LLAMA, "(1 + weight) RMSNorm", "GeGLU", "the nearest is llama")
def gemma_norm_form_verify(d):
    return ["verify", "--hf", _config(d, "GemmaConfig", head_dim=8)]


@case(NOT_LLAMA, "q/k norms", "sliding-window", "the nearest is qwen3")
def gemma3_attention_kind_convert(d):
    return ["convert", "--hf", _config(d, "Gemma3TextConfig", head_dim=8), "--out", str(d / "out")]


@case(NOT_LLAMA, "half of each head", "the nearest is qwen2")
def glm4_partial_rotary_train(d):
    return ["train", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--dry-run", "--set",
            f"model.source={_config(d, 'Glm4Config', head_dim=8)}"]


@case(NOT_LLAMA, "mixture-of-experts", "GLM-4.5")
def glm4_moe_verify(d):
    return ["verify", "--hf", _config(d, "Glm4MoeConfig", n_routed_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=16, head_dim=8)]


@case(NOT_LLAMA, "latent attention", "mixture-of-experts")
def deepseek_v3_mla_convert(d):
    return ["convert", "--hf", _config(d, "DeepseekV3Config", n_routed_experts=4, num_experts_per_tok=2),
            "--out", str(d / "out")]


@case(NOT_LLAMA, "mixture-of-experts", "the nearest is mistral")
def mixtral_moe_generate(d):
    return ["generate", "--hf", _config(d, "MixtralConfig", num_local_experts=4), "--max-new-tokens", "2"]


@case(NOT_LLAMA, "num_local_experts in config.json")
def unknown_type_with_experts_verify(d):
    """A model type port has never heard of, whose config.json has experts: refused for what it has."""
    m = d / "model"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"model_type": "brand_new_moe", **SMALL, "num_local_experts": 16}))
    return ["verify", "--hf", str(m)]


@case(NOT_LLAMA, "linear_attention in layer_types")
def llama_type_with_linear_layers_convert(d):
    """A config that says llama but declares linear-attention layers: the layers decide, not the label."""
    m = d / "model"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"model_type": "llama", **SMALL,
                                               "layer_types": ["linear_attention", "full_attention"]}))
    return ["convert", "--hf", str(m), "--out", str(d / "out")]


def _lf_yaml(d, repo: str):
    """LLaMA-Factory's real Qwen3 full-SFT YAML, naming ``repo`` as its model."""
    text = (FIX / "configs" / "lf_qwen3_full_sft.yaml").read_text()
    p = d / "sft.yaml"
    p.write_text(text.replace("Qwen/Qwen3-4B-Instruct-2507", repo))
    return p


@case("HF repo Qwen/Qwen3-30B-A3B-Instruct-2507", NOT_LLAMA, "mixture-of-experts", "the nearest is qwen3")
def recipe_import_moe_repo_id(d):
    (d / "out").mkdir()
    return ["recipe", "import", str(_lf_yaml(d, "Qwen/Qwen3-30B-A3B-Instruct-2507")),
            str(FIX / "configs" / "lf_ds_z3_offload_config.json"), "--out", str(d / "out" / "r.yaml")]


@case("HF repo meta-llama/Llama-4-Scout-17B-16E-Instruct", NOT_LLAMA, "the nearest is llama")
def intake_llama4_repo_id(d):
    job = d / "job"
    job.mkdir()
    shutil.copy(_lf_yaml(d, "meta-llama/Llama-4-Scout-17B-16E-Instruct"), job / "sft.yaml")
    return ["intake", str(job), "--out", str(d / "out")]


@case(NOT_LLAMA, "Gated DeltaNet")
def intake_hybrid_model_directory(d):
    """--model pointing at a local Qwen3.5 directory: the recipe import reads its config.json and refuses."""
    job = d / "job"
    job.mkdir()
    shutil.copy(FIX / "configs" / "lf_qwen3_full_sft.yaml", job / "sft.yaml")
    return ["intake", str(job), "--out", str(d / "out"), "--model", _config(d, "Qwen3_5TextConfig", head_dim=8)]


@case("port bisect: phi3 checkpoints fuse q/k/v and gate/up", "port verify --hf DIR --hidden-states --grads")
def bisect_fused_weights(d):
    """A fused-weight checkpoint (Phi-3) converts and verifies, but bisect taps q/k/v one by one: refused."""
    import torch
    import transformers

    m = d / "model"
    torch.manual_seed(0)
    transformers.Phi3ForCausalLM(transformers.Phi3Config(**SMALL, pad_token_id=0)).save_pretrained(m)
    return ["bisect", "--hf", str(m), "--ms", str(m)]


from tests.attacks.models import config_cases  # noqa: E402,F401 (issue 51's model configs, in this folder)
