"""Typed configuration of the Llama family, read from and written to HF ``config.json``.

One dataclass covers Llama 1/2/3/3.1, CodeLlama, TinyLlama, Mistral, Qwen2, Qwen3 dense and Phi-3/Phi-4:
they differ only in fields (GQA, tied embeddings, RoPE scaling, q/k/v bias, head_dim, Qwen3's per-head q/k RMSNorm). Validation collects every
problem and raises one :class:`ConfigError` that names each bad field.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping

from model_zoo import families
from model_zoo.errors import ConfigError
from model_zoo.files import read_json_object

# HF model_type -> how its attention biases are laid out. Anything else is refused with this list.
ARCHITECTURES = families.ARCHITECTURES   # model_type -> transformers' class, of every family port builds
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES.values())
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# rope_type -> the keys transformers' initialiser reads (model_zoo/rope.py), required then optional.
ROPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (("original_max_position_embeddings",),
             ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "dynamic": (("factor",), ()),
    "longrope": (("short_factor", "long_factor", "original_max_position_embeddings"), ("factor", "attention_factor")),
}
SUPPORTED_ACTIVATIONS = ("silu",)

MAX_CONFIG_JSON_BYTES = 1 << 20   # an HF config.json is a few KB; the largest seen are tens of KB


# Upper bound of every size field, checked before anything is allocated from it (a config.json saying
# num_hidden_layers: 100000000 must be refused in microseconds, not after 200 GB of tensor plans).
# Each bound is a few times the largest real model of the family, so no real config comes near it.
SIZE_LIMITS: dict[str, tuple[int, str]] = {
    "vocab_size": (1 << 22, "token ids must fit int32 embeddings; the largest real vocabularies are ~256k"),
    "hidden_size": (1 << 16, "Llama 3.1 405B has 16384"),
    "intermediate_size": (1 << 18, "Llama 3.1 405B has 53248"),
    "num_hidden_layers": (1024, "Llama 3.1 405B has 126"),
    "num_attention_heads": (1024, "Llama 3.1 405B has 128"),
    "num_key_value_heads": (1024, "never more than num_attention_heads"),
    "head_dim": (1024, "real models use 64..256"),
    "max_position_embeddings": (1 << 24, "16M positions; the longest real context (Qwen2.5-1M) is ~1M"),
}
MAX_PARAMETERS = 4 * 10 ** 12   # 10x Llama 3.1 405B; the product of in-range sizes can still be absurd
MAX_ROPE_THETA = 1e12           # Llama 3: 5e5, Qwen2.5-1M: 1e7


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Every number the zoo's Llama builder needs. Field names follow HF ``config.json``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # bias on q/k/v projections (Qwen2, or Llama's attention_bias)
    o_bias: bool = False  # bias on the output projection (Llama's attention_bias only)
    mlp_bias: bool = False
    # Qwen3: an RMSNorm over head_dim on every query and key head, before RoPE (transformers'
    # Qwen3Attention q_norm/k_norm; one weight of head_dim shared by the heads).
    qk_norm: bool = False
    hidden_act: str = "silu"
    sliding_window: int | None = None
    model_type: str = "llama"
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    # transformers' nn.Embedding(padding_idx=pad_token_id): that row gets no gradient from the lookup
    pad_token_id: int | None = dataclasses.field(default=None, compare=False)
    torch_dtype: str | None = dataclasses.field(default=None, compare=False)  # storage metadata only

    def __post_init__(self) -> None:
        # Derived fields are filled in here so a preset can leave them out, as HF configs do.
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None and isinstance(self.num_attention_heads, int) and self.num_attention_heads > 0:
            if isinstance(self.hidden_size, int) and self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    f"hidden_size: found {self.hidden_size}, expected a multiple of num_attention_heads="
                    f"{self.num_attention_heads} (or give head_dim explicitly)")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        self.validate()

    # ------------------------------------------------------------------ validation
    def problems(self) -> list[str]:
        """Every inconsistency, as 'field: found X, expected Y' strings."""
        out: list[str] = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                out.append(f"{name}: found {v!r}, expected a positive integer")
            elif v > SIZE_LIMITS[name][0]:
                out.append(f"{name}: found {v:,}, expected at most {SIZE_LIMITS[name][0]:,} ({SIZE_LIMITS[name][1]})")
        if out:
            return out
        if self.num_parameters() > MAX_PARAMETERS:
            return [f"sizes: they imply {self.num_parameters():,} parameters, expected at most {MAX_PARAMETERS:,}; "
                    "check hidden_size, intermediate_size, num_hidden_layers and vocab_size"]
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            out.append(f"model_type: found {self.model_type!r}, expected one of {', '.join(SUPPORTED_MODEL_TYPES)}")
        if self.qk_norm != (self.model_type == "qwen3"):
            out.append(f"qk_norm: found {self.qk_norm!r}, expected {self.model_type == 'qwen3'} for model_type "
                       f"{self.model_type!r} (the per-head q/k RMSNorm is Qwen3's)")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            out.append(f"hidden_act: found {self.hidden_act!r}, expected one of {', '.join(SUPPORTED_ACTIVATIONS)}")
        if self.num_attention_heads % self.num_key_value_heads:
            out.append(f"num_key_value_heads: found {self.num_key_value_heads}, expected a divisor of "
                       f"num_attention_heads={self.num_attention_heads}")
        if self.head_dim % 2:
            out.append(f"head_dim: found {self.head_dim}, expected an even number (RoPE rotates pairs)")
        if not (_number(self.rms_norm_eps) and 0 < self.rms_norm_eps < 1):
            out.append(f"rms_norm_eps: found {self.rms_norm_eps!r}, expected a small positive number below 1")
        if not (_number(self.rope_theta) and 0 < self.rope_theta <= MAX_ROPE_THETA):
            out.append(f"rope_theta: found {self.rope_theta!r}, expected a positive number up to {MAX_ROPE_THETA:g}")
        if self.sliding_window is not None and not (isinstance(self.sliding_window, int)
                                                    and not isinstance(self.sliding_window, bool)
                                                    and 0 < self.sliding_window <= SIZE_LIMITS["max_position_embeddings"][0]):
            out.append(f"sliding_window: found {self.sliding_window!r}, expected null or a positive integer up to "
                       f"{SIZE_LIMITS['max_position_embeddings'][0]:,}")
        out.extend(_rope_scaling_problems(self.rope_scaling, self.head_dim))
        return out

    def validate(self) -> None:
        probs = self.problems()
        if probs:
            raise ConfigError("invalid model config: " + "; ".join(probs))

    # ------------------------------------------------------------------ derived numbers
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def longest_sequence(self) -> int:
        """The longest sequence the config is made for: max_position_embeddings, or for dynamic NTK RoPE
        (whose max_position_embeddings is the original context it stretches) that times its factor."""
        rs = self.rope_scaling or {}
        if rs.get("rope_type") == "dynamic":
            return int(self.max_position_embeddings * rs["factor"])
        return self.max_position_embeddings

    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.o_bias:
            attn += h
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        emb = v * h
        head = 0 if self.tie_word_embeddings else v * h
        return self.num_hidden_layers * per_layer + emb + head + h

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf(cls, source: str | Path | Mapping[str, Any]) -> "LlamaConfig":
        """Read an HF ``config.json`` (a path to it, its directory, or the parsed dict)."""
        where = "config"
        if isinstance(source, Mapping):
            raw = dict(source)
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            where = str(path)
            if not path.exists():
                raise ConfigError(f"{path}: no config.json found; expected an HF model directory with "
                                  "config.json (as written by transformers' save_pretrained)")
            # bounded in size (config.json is a few KB) and depth, UTF-8, an object: or one line saying not
            raw = read_json_object(path, what="config.json", max_bytes=MAX_CONFIG_JSON_BYTES, error=ConfigError)
        return cls._from_raw(raw, where)

    @classmethod
    def _from_raw(cls, raw: dict[str, Any], where: str) -> "LlamaConfig":
        model_type = raw.get("model_type")
        archs = raw.get("architectures") or []
        why = families.differs(raw)   # MoE, hybrid or another attention / norm form: one line, before anything else
        if why is not None:
            raise families.refusal(where, raw, why)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"{where}: unsupported architecture model_type={model_type!r} "
                f"(architectures={archs}); supported: model_type in {list(SUPPORTED_MODEL_TYPES)} "
                f"({', '.join(SUPPORTED_ARCHITECTURES)})")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:
            raise ConfigError(f"{where}: missing required field(s) {', '.join(missing)}")
        # transformers >= 5 writes rope_parameters {rope_type, rope_theta, ...}; 4.x writes
        # rope_theta plus rope_scaling {type|rope_type, factor, ...}.
        rope_params = raw.get("rope_parameters")
        rope_theta = raw.get("rope_theta")
        rope_scaling = raw.get("rope_scaling")
        if isinstance(rope_params, dict):
            rope_theta = rope_params.get("rope_theta", rope_theta)
            extra = {k: v for k, v in rope_params.items() if k != "rope_theta"}
            rope_scaling = extra or rope_scaling
        rope_scaling = _normalise_rope_scaling(rope_scaling)
        if rope_scaling and rope_scaling.get("rope_type") in ("llama3", "yarn", "longrope"):
            # transformers' standardize_rope_params: a top-level original_max_position_embeddings (Phi-3 saves
            # it there) wins, else the rope dict's own, else max_position_embeddings
            if "original_max_position_embeddings" in raw:
                rope_scaling["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
            else:
                rope_scaling.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings", 2048))
        if model_type == "qwen2":
            qkv_bias, o_bias = True, False
        elif model_type == "phi3":   # Phi3Attention's projections have no bias
            qkv_bias = o_bias = False
        else:
            qkv_bias = o_bias = bool(raw.get("attention_bias", False))
        sliding = raw.get("sliding_window")
        if model_type in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
            sliding = None
        if model_type == "qwen3" and sliding is not None:
            # transformers' Qwen3Config slides only layers >= max_window_layers (its layer_types); the zoo
            # slides all or none, so a config where only some layers slide is refused, not misread.
            mwl = raw.get("max_window_layers", 28)
            if not isinstance(mwl, int) or mwl > 0 and mwl < raw["num_hidden_layers"]:
                raise ConfigError(f"{where}: use_sliding_window true with max_window_layers={mwl!r} below "
                                  f"num_hidden_layers={raw['num_hidden_layers']} (sliding attention on some layers "
                                  "only) is not supported; set use_sliding_window false (no released Qwen3 sets it)")
        kwargs = dict(
            vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"], num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads"),
            head_dim=raw.get("head_dim"),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta if rope_theta is not None else 10000.0,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            hidden_act=raw.get("hidden_act", "silu"), sliding_window=sliding, model_type=model_type,
            bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"),
            pad_token_id=_pad_id(raw.get("pad_token_id"), raw["vocab_size"]),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
        )
        try:
            return cls(**kwargs)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` dict that transformers reads back into the same model."""
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]], "model_type": self.model_type,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": self.hidden_act,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
        }
        if self.pad_token_id is not None:
            d["pad_token_id"] = self.pad_token_id
        if self.model_type in ("qwen2", "qwen3"):
            d["use_sliding_window"] = self.sliding_window is not None
            d["sliding_window"] = self.sliding_window
        if self.model_type == "phi3":   # no bias options (transformers' Phi3Config)
            d["sliding_window"] = self.sliding_window
        elif self.model_type == "qwen3":
            d["attention_bias"] = self.qkv_bias
            d["max_window_layers"] = self.num_hidden_layers
        elif self.model_type != "qwen2":
            d["attention_bias"] = self.qkv_bias
            d["mlp_bias"] = self.mlp_bias
            if self.model_type == "mistral":
                d["sliding_window"] = self.sliding_window
        if self.torch_dtype:
            d["torch_dtype"] = self.torch_dtype
        return d


def _pad_id(v: Any, vocab: Any) -> int | None:
    """pad_token_id as transformers' embedding uses it: an id inside the vocabulary, else none (a config may
    name a pad id its embedding does not have; nn.Embedding would refuse it)."""
    ok = isinstance(v, int) and not isinstance(v, bool) and isinstance(vocab, int) and 0 <= v < vocab
    return v if ok else None


def _number(v: Any) -> bool:
    """A finite int or float (not a bool: ``true`` is not an epsilon)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _normalise_rope_scaling(rs: Any) -> dict[str, Any] | None:
    if rs is None:
        return None
    if not isinstance(rs, dict):
        return {"rope_type": rs}  # refused by validation with the value shown
    rs = dict(rs)
    kind = rs.pop("rope_type", None) or rs.pop("type", None) or "default"
    rs.pop("type", None)
    if rs.get("partial_rotary_factor") == 1.0:   # transformers 5 writes the full rotation explicitly (Phi-3)
        del rs["partial_rotary_factor"]
    if kind == "default" and not rs:
        return None
    return {"rope_type": kind, **rs}


def _rope_scaling_problems(rs: dict[str, Any] | None, head_dim: int) -> list[str]:
    if rs is None:
        return []
    if not isinstance(rs, dict):
        return [f"rope_scaling: found {rs!r}, expected a mapping with rope_type"]
    kind = rs.get("rope_type")
    if kind not in SUPPORTED_ROPE_TYPES:
        return [f"rope_scaling: rope_type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"]
    need, may = ROPE_KEYS[kind]
    out = [f"rope_scaling.{k}: missing, required for rope_type {kind!r}" for k in need if k not in rs]
    unknown = sorted(set(rs) - set(need) - set(may) - {"rope_type"})
    if unknown:
        extra = " (a partial rotation: only part of each head rotated)" if "partial_rotary_factor" in unknown else ""
        out.append(f"rope_scaling: {', '.join(unknown)} not supported for rope_type {kind!r}{extra}; "
                   f"expected {', '.join(need + may) or 'no other keys'}")
    factor = rs.get("factor")
    if factor is not None and not (_number(factor) and factor >= 1):
        out.append(f"rope_scaling.factor: found {factor!r}, expected a number >= 1")
    orig = rs.get("original_max_position_embeddings")
    if orig is not None and not (isinstance(orig, int) and not isinstance(orig, bool) and 0 < orig <= 1 << 24):
        out.append(f"rope_scaling.original_max_position_embeddings: found {orig!r}, expected a positive integer")
    for k in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if rs.get(k) is not None and not (_number(rs[k]) and rs[k] > 0):
            out.append(f"rope_scaling.{k}: found {rs[k]!r}, expected a positive number")
    for k in ("short_factor", "long_factor"):
        v = rs.get(k)
        if v is not None and not (isinstance(v, list) and len(v) == head_dim // 2 and all(_number(x) and x > 0 for x in v)):
            out.append(f"rope_scaling.{k}: expected {head_dim // 2} positive numbers (head_dim / 2), found "
                       f"{len(v) if isinstance(v, list) else type(v).__name__}")
    return out


def divisibility_problems(cfg, size: int) -> list[str]:
    """What of the config ``size`` TP ranks cannot split evenly, as "name N" strings (empty: it divides)."""
    dims = {"num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size}
    return [f"{k} {v}" for k, v in dims.items() if v % size]
