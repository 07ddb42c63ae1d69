"""The door for what is not Llama-style: one line saying what differs and the nearest family port supports.

port's one builder is the dense Llama family (``config.SUPPORTED_MODEL_TYPES``): pre-norm RMSNorm
(``weight * x``), rotate-half RoPE on every head dimension, full causal softmax attention, a SwiGLU MLP
on every layer. A checkpoint that differs in its MLP (mixture of experts), its attention (linear or
latent attention, chunked or sliding layers), its norms (``(1 + weight)``, LayerNorm, norms after the
sublayer) or its rotary embedding is refused before anything is read or written, by :func:`refuse` with
one line naming the difference, from the model's ``config.json`` (``model_type``, MoE and layer-type keys),
or from an HF repo id alone (:func:`check_repo_id`, for configs that name a model not on this machine).
What differs is stated from transformers' modelling code of each family (``transformers/models/<type>/``).
"""

from __future__ import annotations

import re
from typing import Any

from model_zoo.errors import ConfigError

# The families port builds: model_type -> transformers' class (Phi-3/Phi-4 read their fused weights as
# separate ones, converters/fused.py).
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM"}

# model_type -> what transformers' config class gives a key config.json leaves out (the class's defaults in
# transformers/models/<type>/configuration_<type>.py, the same in 4.56 and 5.x; a key not listed here has
# the same default in every family: rope_theta 10000, tie_word_embeddings false, hidden_act silu).
# num_key_value_heads None and head_dim None mean: num_attention_heads, and hidden_size / num_attention_heads.
_LLAMA_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=None)
_QWEN = dict(num_key_value_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=None,
             eos_token_id=None, pad_token_id=None, use_sliding_window=False, sliding_window=4096, max_window_layers=28)
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(_LLAMA_IDS, num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                  rms_norm_eps=1e-6, sliding_window=None),                                  # LlamaConfig
    "mistral": dict(_LLAMA_IDS, num_key_value_heads=8, head_dim=None, max_position_embeddings=4096 * 32,
                    rms_norm_eps=1e-6, sliding_window=4096),                                # MistralConfig
    "qwen2": dict(_QWEN, head_dim=None),                                                    # Qwen2Config
    "qwen3": dict(_QWEN, head_dim=128),                                                     # Qwen3Config
    "phi3": dict(num_key_value_heads=None, head_dim=None, max_position_embeddings=4096, rms_norm_eps=1e-5,
                 bos_token_id=1, eos_token_id=32000, pad_token_id=32000, sliding_window=None,
                 original_max_position_embeddings=4096, partial_rotary_factor=1.0),        # Phi3Config
}

# model_type -> (what differs from the dense Llama family, the nearest family port supports)
NOT_LLAMA: dict[str, tuple[str, str]] = {
    "qwen3_moe": ("a mixture-of-experts MLP (Qwen3MoeSparseMoeBlock: num_experts routed experts, "
                  "num_experts_per_tok active) in place of the dense SwiGLU", "qwen3 (the dense Qwen3 sizes)"),
    "qwen2_moe": ("a mixture-of-experts MLP with a shared expert", "qwen2"),
    "qwen3_next": ("hybrid attention: Gated DeltaNet linear-attention layers between gated full-attention layers "
                   "(layer_types), a mixture-of-experts MLP and (1 + weight) RMSNorm", "qwen3"),
    "qwen3_5": ("hybrid attention: Gated DeltaNet linear-attention layers, one full-attention layer in "
                "full_attention_interval (layer_types), (1 + weight) RMSNorm and a vision tower", "qwen3"),
    "qwen3_5_text": ("hybrid attention: Gated DeltaNet linear-attention layers, one full-attention layer in "
                     "full_attention_interval (layer_types), and (1 + weight) RMSNorm", "qwen3"),
    "qwen3_5_moe": ("hybrid linear/full attention and a mixture-of-experts MLP", "qwen3"),
    "qwen3_5_moe_text": ("hybrid linear/full attention and a mixture-of-experts MLP", "qwen3"),
    "llama4": ("a mixture-of-experts MLP (routed and shared experts), chunked local attention with RoPE-free "
               "global layers, and a vision tower", "llama (Llama 3.x)"),
    "llama4_text": ("a mixture-of-experts MLP (routed and shared experts) and chunked local attention with "
                    "RoPE-free global layers", "llama (Llama 3.x)"),
    "mixtral": ("a mixture-of-experts MLP (num_local_experts, top num_experts_per_tok)", "mistral"),
    "phimoe": ("a mixture-of-experts MLP", "phi3"),
    "deepseek_v2": ("multi-head latent attention (compressed KV, kv_lora_rank) and a mixture-of-experts MLP",
                    "llama"),
    "deepseek_v3": ("multi-head latent attention (compressed KV, kv_lora_rank) and a mixture-of-experts MLP",
                    "llama"),
    "gpt_oss": ("a mixture-of-experts MLP, attention sinks and alternating sliding-window layers", "mistral"),
    "gemma": ("(1 + weight) RMSNorm, a GeGLU MLP (tanh GELU) and embeddings scaled by sqrt(hidden_size)", "llama"),
    "gemma2": ("(1 + weight) RMSNorm around as well as before each sublayer, a GeGLU MLP, attention and final "
               "logit soft-capping and alternating sliding-window layers", "llama"),
    "gemma3": ("(1 + weight) RMSNorm around each sublayer, q/k norms, 5 sliding-window layers to 1 global "
               "with RoPE bases of their own, a GeGLU MLP and a vision tower", "qwen3 (its q/k norms)"),
    "gemma3_text": ("(1 + weight) RMSNorm around each sublayer, q/k norms, 5 sliding-window layers to 1 global "
                    "with RoPE bases of their own and a GeGLU MLP", "qwen3 (its q/k norms)"),
    "glm": ("RoPE on half of each head in interleaved pairs (partial_rotary_factor 0.5) and a fused "
            "gate_up MLP", "qwen2 (q/k/v bias)"),
    "glm4": ("norms after as well as before each sublayer (post_self_attn_layernorm, post_mlp_layernorm) and "
             "RoPE on half of each head in interleaved pairs", "qwen2 (q/k/v bias)"),
    "glm4_moe": ("a mixture-of-experts MLP (GLM-4.5) and RoPE on part of each head", "qwen2"),
    "olmo2": ("RMSNorm after each sublayer instead of before, and q/k norms over all heads", "qwen3"),
    "cohere": ("LayerNorm, attention and MLP in parallel from one norm, and a logit scale", "llama"),
    "gpt2": ("learned position embeddings, LayerNorm and a GELU MLP", "llama"),
    "gpt_neox": ("LayerNorm, parallel attention and MLP, and RoPE on part of each head", "llama"),
    "falcon": ("LayerNorm, parallel attention and MLP, and multi-query attention layouts of its own", "llama"),
    "mamba": ("a state-space model (no attention)", "llama"),
    "jamba": ("state-space (Mamba) layers mixed with attention, and a mixture-of-experts MLP", "mistral"),
    "qwen2_vl": ("a vision tower and multimodal RoPE (mrope)", "qwen2 (its text tower, as a text model)"),
    "qwen2_5_vl": ("a vision tower and multimodal RoPE (mrope)", "qwen2 (its text tower, as a text model)"),
    "qwen3_vl": ("a vision tower and interleaved multimodal RoPE", "qwen3 (its text tower, as a text model)"),
    "qwen3_vl_moe": ("a vision tower, interleaved multimodal RoPE and a mixture-of-experts MLP", "qwen3"),
}
# config.json keys that only a mixture-of-experts model has (transformers' MoE configs)
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")
# layer kinds of hybrid models in config.json's layer_types
LINEAR_LAYERS = ("linear_attention", "mamba", "conv")
# HF repo ids of well-known models that are not Llama-style (case-insensitive), for configs that name one
REPO_IDS: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(p, re.I), t) for p, t in (
    (r"^Qwen/Qwen3-\d+(\.\d+)?B-A\d+(\.\d+)?B", "qwen3_moe"),            # Qwen3-30B-A3B, Qwen3-235B-A22B
    (r"^Qwen/Qwen3-Coder-\d+(\.\d+)?B-A\d+(\.\d+)?B", "qwen3_moe"),      # Qwen3-Coder-30B-A3B, -480B-A35B
    (r"^Qwen/Qwen3-VL-\d+(\.\d+)?B-A\d+(\.\d+)?B", "qwen3_vl_moe"),      # Qwen3-VL-30B-A3B, -235B-A22B
    (r"^Qwen/Qwen3-VL-", "qwen3_vl"),                                   # Qwen3-VL-2B/4B/8B/32B
    (r"^Qwen/Qwen2\.5-VL-", "qwen2_5_vl"),
    (r"^Qwen/Qwen2-VL-", "qwen2_vl"),
    (r"^Qwen/Qwen3-Next-", "qwen3_next"),
    (r"^Qwen/Qwen3\.5-\d+(\.\d+)?B-A\d+(\.\d+)?B", "qwen3_5_moe"),
    (r"^Qwen/Qwen3\.5-", "qwen3_5"),
    (r"^Qwen/Qwen1\.5-MoE|^Qwen/Qwen2-57B-A14B", "qwen2_moe"),
    (r"^meta-llama/Llama-4-", "llama4"),
    (r"^mistralai/Mixtral-", "mixtral"),
    (r"^deepseek-ai/DeepSeek-V3|^deepseek-ai/DeepSeek-R1(-\d+)?$", "deepseek_v3"),
    (r"^deepseek-ai/DeepSeek-V2", "deepseek_v2"),
    (r"^google/gemma-3-", "gemma3"),
    (r"^google/gemma-2-", "gemma2"),
    (r"^google/(code)?gemma-", "gemma"),
    (r"^(THUDM|zai-org)/GLM-4\.5|^(THUDM|zai-org)/GLM-4\.6", "glm4_moe"),
    (r"^(THUDM|zai-org)/GLM-4-\d+B-0414", "glm4"),
    (r"^(THUDM|zai-org)/glm-4-", "glm"),
    (r"^openai/gpt-oss-", "gpt_oss"),
    (r"^microsoft/Phi-3\.5-MoE", "phimoe"),
))


def differs(raw: dict[str, Any]) -> tuple[str, str] | None:
    """(what differs, nearest supported family) for a config.json of a known non-Llama kind, or of any
    kind with mixture-of-experts keys or linear-attention layers; None when nothing says so."""
    model_type = raw.get("model_type")
    if isinstance(model_type, str) and model_type in NOT_LLAMA:
        return NOT_LLAMA[model_type]
    moe = [k for k in MOE_KEYS if isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool) and raw[k] > 1]
    layers = raw.get("layer_types")
    linear = sorted({t for t in layers if t in LINEAR_LAYERS}) if isinstance(layers, list) and \
        len(layers) <= 4096 and all(isinstance(t, str) for t in layers) else []
    if linear:
        return f"hybrid layers ({', '.join(linear)} in layer_types) beside softmax attention", "llama"
    if moe:
        return f"a mixture-of-experts MLP ({', '.join(moe)} in config.json)", "llama"
    return None


def refusal(where: str, raw: dict[str, Any], why: tuple[str, str]) -> ConfigError:
    """The one-line error for a config that is not Llama-style."""
    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    what, nearest = why
    return ConfigError(f"{where}: unsupported architecture model_type={str(raw.get('model_type'))[:64]!r}"
                       f"{f' ({arch[:64]})' if arch else ''}, not a dense Llama-style model: {what}; supported: "
                       f"model_type in {list(ARCHITECTURES)} ({', '.join(ARCHITECTURES.values())}); the nearest is "
                       f"{nearest}: use a checkpoint of that family")


def check_repo_id(repo: str) -> None:
    """ConfigError (one line) when ``repo`` is the HF repo id of a well-known model that is not Llama-style
    (a training config naming a model that is not on this machine)."""
    for pattern, model_type in REPO_IDS:
        if pattern.search(str(repo)):
            raise refusal(f"HF repo {str(repo)[:200]}", {"model_type": model_type}, NOT_LLAMA[model_type])
