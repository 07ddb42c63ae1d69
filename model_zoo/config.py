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

from model_zoo import families, rope_config
from model_zoo.errors import ConfigError
from model_zoo.files import read_json_object

# HF model_type -> how its attention biases are laid out. Anything else is refused with this list.
ARCHITECTURES = families.ARCHITECTURES   # model_type -> transformers' class, of every family port builds
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES.values())
SUPPORTED_ROPE_TYPES = rope_config.SUPPORTED_ROPE_TYPES
ROPE_KEYS = rope_config.ROPE_KEYS   # rope_type -> (required, optional) keys (model_zoo/rope_config.py)
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
MAX_ROPE_THETA = 1e12           # Llama 3: 5e5, Qwen2.5-1M: 1e7; above 1: a base of 1 or less has no decreasing
                                # frequencies, and YaRN divides by its logarithm


# Dropout probabilities transformers' configs of these families carry (LlamaConfig/MistralConfig/Qwen2Config/
# Qwen3Config attention_dropout; Phi3Config resid_pdrop, embd_pdrop); applied in training only.
DROPOUT_KEYS = ("attention_dropout", "resid_pdrop", "embd_pdrop")


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
    # the share of head_dim that RoPE rotates (Phi-4-mini 0.75; transformers' Phi3: the first
    # int(head_dim * factor) dimensions, the rest passed through); other families rotate all of it
    partial_rotary_factor: float = 1.0
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
    # training-time dropout config.json asks for and the zoo's cell does not apply (it has no dropout): each
    # (key, value) with a non-zero value; `port train` refuses them by name (porting/train/plan/make.py)
    dropout: tuple[tuple[str, float], ...] = dataclasses.field(default=(), compare=False)

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
        if not (_number(self.rope_theta) and 1 < self.rope_theta <= MAX_ROPE_THETA):
            out.append(f"rope_theta: found {self.rope_theta!r}, expected a number above 1, up to {MAX_ROPE_THETA:g}")
        if self.sliding_window is not None and not (isinstance(self.sliding_window, int)
                                                    and not isinstance(self.sliding_window, bool)
                                                    and 0 < self.sliding_window <= SIZE_LIMITS["max_position_embeddings"][0]):
            out.append(f"sliding_window: found {self.sliding_window!r}, expected null or a positive integer up to "
                       f"{SIZE_LIMITS['max_position_embeddings'][0]:,}")
        if not any(p.startswith(("rope_theta", "head_dim")) for p in out):   # the RoPE keys need both
            out.extend(rope_config.problems(self))
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
    def rotary_dim(self) -> int:
        """The dimensions of each head that RoPE rotates (transformers: ``int(head_dim * partial_rotary_factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

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
        # Keys config.json leaves out take the family's defaults, as transformers' config classes give them
        # (families.DEFAULTS); the RoPE keys resolve as transformers resolves them (model_zoo/rope_config.py).
        dflt = families.DEFAULTS[model_type]
        rope_theta, rope_scaling, partial = rope_config.resolve(raw, model_type, where, dflt)
        if model_type == "qwen2":
            qkv_bias, o_bias = True, False
        elif model_type == "phi3":   # Phi3Attention's projections have no bias
            qkv_bias = o_bias = False
        else:
            qkv_bias = o_bias = bool(raw.get("attention_bias", False))
        sliding = raw.get("sliding_window", dflt["sliding_window"])
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
            num_key_value_heads=raw.get("num_key_value_heads", dflt["num_key_value_heads"]),
            head_dim=raw.get("head_dim", dflt["head_dim"]),
            max_position_embeddings=raw.get("max_position_embeddings", dflt["max_position_embeddings"]),
            rms_norm_eps=raw.get("rms_norm_eps", dflt["rms_norm_eps"]),
            rope_theta=rope_theta if rope_theta is not None else 10000.0,
            rope_scaling=rope_scaling, partial_rotary_factor=partial,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            hidden_act=raw.get("hidden_act", "silu"), sliding_window=sliding, model_type=model_type,
            bos_token_id=raw.get("bos_token_id", dflt["bos_token_id"]),
            eos_token_id=raw.get("eos_token_id", dflt["eos_token_id"]),
            pad_token_id=_pad_id(raw, dflt["pad_token_id"], where),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            dropout=tuple((k, float(raw[k])) for k in DROPOUT_KEYS if isinstance(raw.get(k), (int, float))
                          and not isinstance(raw.get(k), bool) and raw[k] != 0),
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
        if self.pad_token_id is not None or self.model_type == "phi3":   # Phi3Config's default is 32000
            d["pad_token_id"] = self.pad_token_id
        if self.model_type in ("qwen2", "qwen3"):
            d["use_sliding_window"] = self.sliding_window is not None
            d["sliding_window"] = self.sliding_window
        if self.model_type == "phi3":   # no bias options (transformers' Phi3Config)
            d["sliding_window"] = self.sliding_window
            d["partial_rotary_factor"] = self.partial_rotary_factor
            # Phi3Config takes the top-level key over the rope dict's (default 4096 when absent)
            original = (self.rope_scaling or {}).get("original_max_position_embeddings")
            if original is not None:
                d["original_max_position_embeddings"] = original
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


def _pad_id(raw: dict[str, Any], default: int | None, where: str) -> int | None:
    """pad_token_id as transformers' ``nn.Embedding(vocab_size, hidden, padding_idx=pad_token_id)`` takes it:
    an id of the vocabulary, a negative one counted from its end (torch's rule), or none; anything else is
    refused, as the embedding refuses it ("Padding_idx must be within num_embeddings")."""
    v, vocab = raw.get("pad_token_id", default), raw.get("vocab_size")
    if v is None or not (isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0):
        return None   # no pad id, or a vocab_size that validation names
    if not isinstance(v, int) or isinstance(v, bool) or not -vocab <= v < vocab:
        given = "" if "pad_token_id" in raw else f" (transformers' {ARCHITECTURES[raw['model_type']]} default, config.json has none)"
        shown = v if isinstance(v, int) else str(v)[:40]
        raise ConfigError(f"{where}: pad_token_id: found {shown!r}{given}, expected null or an id below "
                          f"vocab_size={vocab} (transformers' nn.Embedding refuses a padding_idx outside the "
                          "vocabulary); set pad_token_id in config.json")
    return v % vocab


def _number(v: Any) -> bool:
    """A finite int or float (not a bool: ``true`` is not an epsilon)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def divisibility_problems(cfg, size: int) -> list[str]:
    """What of the config ``size`` TP ranks cannot split evenly, as "name N" strings (empty: it divides)."""
    dims = {"num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size}
    return [f"{k} {v}" for k, v in dims.items() if v % size]
