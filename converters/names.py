"""Weight-name maps between HF checkpoints and the zoo's MindSpore cells, as data.

``{}`` stands for the layer index. The reverse map is derived, never written by hand, and both are
checked one-to-one at import. Keys that HF may carry but that hold no weights are listed by name.
"""

from __future__ import annotations

import re

from model_zoo.config import LlamaConfig
from model_zoo.errors import CheckpointError

# HF name -> zoo (MindFormers-compatible) name. Shared by llama, mistral and qwen2: they differ only
# in which optional tensors (biases, lm_head) exist, which config decides.
LLAMA_HF_TO_MS: dict[str, str] = {
    "model.embed_tokens.weight": "model.tok_embeddings.embedding_weight",
    "model.layers.{}.input_layernorm.weight": "model.layers.{}.attention_norm.weight",
    "model.layers.{}.self_attn.q_proj.weight": "model.layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "model.layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "model.layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "model.layers.{}.attention.wo.weight",
    "model.layers.{}.self_attn.q_proj.bias": "model.layers.{}.attention.wq.bias",
    "model.layers.{}.self_attn.k_proj.bias": "model.layers.{}.attention.wk.bias",
    "model.layers.{}.self_attn.v_proj.bias": "model.layers.{}.attention.wv.bias",
    "model.layers.{}.self_attn.o_proj.bias": "model.layers.{}.attention.wo.bias",
    "model.layers.{}.post_attention_layernorm.weight": "model.layers.{}.ffn_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "model.layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.down_proj.weight": "model.layers.{}.feed_forward.w2.weight",
    "model.layers.{}.mlp.up_proj.weight": "model.layers.{}.feed_forward.w3.weight",
    "model.layers.{}.mlp.gate_proj.bias": "model.layers.{}.feed_forward.w1.bias",
    "model.layers.{}.mlp.down_proj.bias": "model.layers.{}.feed_forward.w2.bias",
    "model.layers.{}.mlp.up_proj.bias": "model.layers.{}.feed_forward.w3.bias",
    "model.norm.weight": "model.norm_out.weight",
    "lm_head.weight": "lm_head.weight",
}
LLAMA_MS_TO_HF: dict[str, str] = {v: k for k, v in LLAMA_HF_TO_MS.items()}

# Qwen3 = the Llama map plus the per-head q/k RMSNorm. Their zoo names take MindSpore Transformers' leaf
# names for these tensors (mindformers/models/qwen3/utils.py, Qwen3PreTrainedModel.weight_mapping:
# '.self_attn.q_norm.' -> '.self_attention.q_layernorm.', '.self_attn.k_norm.' -> '.self_attention.k_layernorm.')
# under the zoo's attention cell; the rest of that file's names are its Megatron-style GPTModel's
# (decoder.layers.N.self_attention.linear_q), which the zoo's MindFormers-Llama names do not follow.
QWEN3_HF_TO_MS: dict[str, str] = {
    **LLAMA_HF_TO_MS,
    "model.layers.{}.self_attn.q_norm.weight": "model.layers.{}.attention.q_layernorm.weight",
    "model.layers.{}.self_attn.k_norm.weight": "model.layers.{}.attention.k_layernorm.weight",
}

# HF keys that carry no weights (older checkpoints store RoPE's inverse frequencies).
IGNORED_HF_KEYS = ("model.layers.{}.self_attn.rotary_emb.inv_freq",)

# phi3: the Llama map on the separate weights its fused qkv_proj / gate_up_proj are read as (converters/fused.py).
NAME_MAPS = {"llama": LLAMA_HF_TO_MS, "mistral": LLAMA_HF_TO_MS, "qwen2": LLAMA_HF_TO_MS, "qwen3": QWEN3_HF_TO_MS,
             "phi3": LLAMA_HF_TO_MS}


def _check_one_to_one(m: dict[str, str]) -> None:
    if len(set(m.values())) != len(m):
        dup = sorted(v for v in set(m.values()) if list(m.values()).count(v) > 1)
        raise AssertionError(f"name map is not one-to-one: {dup}")


for _table in NAME_MAPS.values():
    _check_one_to_one(_table)


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{\}", r"(\d+)") + "$")


def map_name(name: str, table: dict[str, str]) -> str | None:
    """Translate one tensor name through a template table; None when no template matches."""
    for src, dst in table.items():
        if "{}" not in src:
            if name == src:
                return dst
            continue
        m = _pattern(src).match(name)
        if m:
            return dst.replace("{}", m.group(1))
    return None


def is_ignored_hf(name: str) -> bool:
    return any(_pattern(t).match(name) for t in IGNORED_HF_KEYS)


def expected_hf_names(cfg: LlamaConfig) -> list[str]:
    """Every tensor name an HF checkpoint of this config holds, in a stable order."""
    out = ["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [p + "input_layernorm.weight"]
        for proj in ("q", "k", "v", "o"):
            out.append(p + f"self_attn.{proj}_proj.weight")
            if (proj != "o" and cfg.qkv_bias) or (proj == "o" and cfg.o_bias):
                out.append(p + f"self_attn.{proj}_proj.bias")
        if cfg.qk_norm:
            out += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        out += [p + "post_attention_layernorm.weight"]
        for proj in ("gate", "up", "down"):
            out.append(p + f"mlp.{proj}_proj.weight")
            if cfg.mlp_bias:
                out.append(p + f"mlp.{proj}_proj.bias")
    out.append("model.norm.weight")
    if not cfg.tie_word_embeddings:
        out.append("lm_head.weight")
    return out


def coverage_error(where: str, missing: list[str], unexpected: list[str]) -> CheckpointError:
    def show(xs: list[str]) -> str:
        xs = sorted(xs)
        return ", ".join(xs[:8]) + (f" (+{len(xs) - 8} more)" if len(xs) > 8 else "")
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} tensor(s): {show(missing)}")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)} tensor(s): {show(unexpected)}")
    return CheckpointError(f"{where}: " + "; ".join(parts) +
                           "; the checkpoint does not match its config.json (check num_hidden_layers, "
                           "tie_word_embeddings, attention_bias/mlp_bias)")


# Keys a MindSpore *training* checkpoint holds beside the weights (optimizer states, step counters,
# loss scale). They are not model weights: MS -> HF skips them and lists them in the manifest.
IGNORED_MS_PREFIXES = ("adam_m.", "adam_v.", "moment1.", "moment2.", "accu_grads.", "global_step",
                       "learning_rate", "beta1_power", "beta2_power", "scale_sense", "loss_scale",
                       "current_iterator_step", "last_overflow_iterator_step", "epoch_num", "step_num")


def is_ignored_ms(name: str) -> bool:
    return name.startswith(IGNORED_MS_PREFIXES)


def expected_hf_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every HF tensor this config implies (weights are (out_features, in_features))."""
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    per_layer = {
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (cfg.q_size, h), "self_attn.k_proj.weight": (cfg.kv_size, h),
        "self_attn.v_proj.weight": (cfg.kv_size, h), "self_attn.o_proj.weight": (h, cfg.q_size),
        "self_attn.q_proj.bias": (cfg.q_size,), "self_attn.k_proj.bias": (cfg.kv_size,),
        "self_attn.v_proj.bias": (cfg.kv_size,), "self_attn.o_proj.bias": (h,),
        "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i),
        "mlp.gate_proj.bias": (i,), "mlp.up_proj.bias": (i,), "mlp.down_proj.bias": (h,),
        "self_attn.q_norm.weight": (cfg.head_dim,), "self_attn.k_norm.weight": (cfg.head_dim,),
    }
    top = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    out = {}
    for name in expected_hf_names(cfg):
        m = re.match(r"model\.layers\.\d+\.(.*)$", name)
        out[name] = per_layer[m.group(1)] if m else top[name]
    return out
