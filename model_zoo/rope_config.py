"""A config.json's RoPE keys, resolved as transformers resolves them, and the bounds port holds them to.

Resolution (transformers 5.x ``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`` and
``standardize_rope_params``, ``Phi3Config.convert_rope_params_to_dict``; 4.56 reads ``rope_scaling`` and the
top-level keys only):

* ``rope_scaling`` and ``rope_parameters``: 5.x takes ``rope_scaling`` when both are set (``rope_scaling or
  self.rope_parameters``) and 4.x knows only ``rope_scaling``; both set and saying different things is
  refused by name (a user who wrote ``rope_parameters`` meant it), both saying the same is read once.
* ``rope_theta``: the rope dict's own, else the top-level key, else the family's default.
* ``original_max_position_embeddings`` (llama3, yarn, longrope): a top-level key wins, else the rope dict's,
  else ``max_position_embeddings``. Phi-3: ``Phi3Config`` always has the attribute (default 4096), so the
  top-level value or 4096 is used; a rope dict's own different value is refused (transformers drops it).
* ``partial_rotary_factor`` (the rope dict's, else the top-level key, else 1; both set and different is
  refused): only Phi-3 rotates part of each head (``Phi3``'s ``apply_rotary_pos_emb`` rotates
  ``cos.shape[-1]`` dimensions and passes the rest). Llama, Mistral, Qwen2 and Qwen3 rotate the whole head
  (5.x's default RoPE ignores the key, its scaled types then fail on the shapes; 4.x fails): refused there.
* Phi-3's types: ``default`` and ``longrope``; ``su`` and ``yarn`` read as ``longrope`` (Phi3Config's
  backward compatibility); any other is refused, as ``Phi3Config.validate_rope`` refuses it.

Bounds: every number has a finite range a few times past the largest real value (docs/promises.md 3.2), and
the frequencies and attention factor are computed once at the longest length the config allows: a value
that passes the ranges but still breaks the arithmetic is refused here, never in a model's first step.
"""

from __future__ import annotations

import math
from typing import Any

from model_zoo import rope
from model_zoo.errors import ConfigError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# rope_type -> the keys transformers' initialiser reads (model_zoo/rope.py), required then optional
# (transformers 5.x _validate_<type>_rope_parameters: yarn requires factor, as 4.56's initialiser does).
ROPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "dynamic": (("factor",), ()),
    "longrope": (("short_factor", "long_factor", "original_max_position_embeddings"), ("factor", "attention_factor")),
}
PHI3_ROPE_TYPES = ("default", "longrope")          # Phi3Config.validate_rope
PHI3_ORIGINAL_DEFAULT = 4096                        # Phi3Config.original_max_position_embeddings

# name -> (low, high, why): inclusive bounds unless noted in the check
MAX_FACTOR = 1024.0          # scaling factors: Llama 3.2 32, Phi-3-128k 32, DeepSeek-V3 YaRN 40
MAX_ATTENTION_FACTOR = 8.0   # cos/sin multiplier: YaRN at factor 40 gives 1.37, longrope at 32 gives 1.19
MAX_MSCALE = 100.0           # DeepSeek-V3: 1.0 and 0.707
BETA_RANGE = (1e-3, 1e4)     # YaRN's rotations: 32 and 1 in every released config
LIST_RANGE = (1e-3, 1e4)     # longrope's per-dimension factors: 1 to ~64 in Phi-3 / Phi-4
PARTIAL_RANGE = (0.0, 1.0)   # partial_rotary_factor in (0, 1]: Phi-4-mini 0.75


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def normalise(rs: Any, model_type: str = "llama") -> dict[str, Any] | None:
    """A rope dict with ``rope_type`` (``type`` read as 4.x wrote it), without ``rope_theta`` and
    ``partial_rotary_factor`` (resolved apart); None for no scaling. A non-mapping is kept for validation."""
    if rs is None or rs == {}:
        return None
    if not isinstance(rs, dict):
        return {"rope_type": rs}  # refused by validation with the value shown
    rs = {k: v for k, v in rs.items() if k not in ("rope_theta", "partial_rotary_factor")}
    kind = rs.pop("rope_type", None) or rs.pop("type", None) or "default"
    rs.pop("type", None)
    if model_type == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"   # Phi3Config.convert_rope_params_to_dict: backward compatibility
    if kind == "default" and not rs:
        return None
    return {"rope_type": kind, **rs}


def resolve(raw: dict[str, Any], model_type: str, where: str, defaults: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(rope_theta, rope_scaling, partial_rotary_factor) of config.json ``raw`` as transformers reads them."""
    rs_raw, rp_raw = raw.get("rope_scaling"), raw.get("rope_parameters")
    if rp_raw is not None and not isinstance(rp_raw, dict):
        raise ConfigError(f"{where}: rope_parameters: found {str(rp_raw)[:80]!r}, expected a mapping with rope_type "
                          "(or null)")
    rp = rp_raw or {}
    top_theta = raw.get("rope_theta", defaults.get("rope_theta", 10000.0))
    theta = rp.get("rope_theta", top_theta)
    if rs_raw not in (None, {}) and rp:
        same = normalise(rs_raw, model_type) == normalise(rp, model_type) and rp.get("rope_theta", top_theta) == top_theta
        if not same:
            raise ConfigError(f"{where}: both rope_scaling ({str(rs_raw)[:120]}) and rope_parameters "
                              f"({str(rp_raw)[:120]}) are set and differ; transformers 5.x takes rope_scaling "
                              "(4.x knows only rope_scaling) while the key a 5.x save writes is rope_parameters: "
                              "remove the one you did not mean")
        theta = top_theta
    source = rs_raw if rs_raw not in (None, {}) else rp
    partial = _partial(source if isinstance(source, dict) else {}, raw, where)
    scaling = normalise(source, model_type)
    if scaling and scaling.get("rope_type") in ("llama3", "yarn", "longrope"):
        scaling["original_max_position_embeddings"] = _original(raw, scaling, model_type, where, defaults)
    return theta, scaling, partial


def _partial(rope_dict: dict[str, Any], raw: dict[str, Any], where: str) -> Any:
    inner, top = rope_dict.get("partial_rotary_factor"), raw.get("partial_rotary_factor")
    if inner is not None and top is not None and inner != top:
        raise ConfigError(f"{where}: partial_rotary_factor is {top!r} at the top level and {inner!r} in the rope "
                          "dict; transformers 5.x takes the rope dict's, 4.x the top-level one: make them equal")
    return inner if inner is not None else (top if top is not None else 1.0)


def _original(raw: dict[str, Any], scaling: dict[str, Any], model_type: str, where: str,
              defaults: dict[str, Any]) -> Any:
    """The original context of a llama3 / yarn / longrope dict (transformers' standardize_rope_params)."""
    if model_type == "phi3":
        top = raw.get("original_max_position_embeddings", PHI3_ORIGINAL_DEFAULT)
        inner = scaling.get("original_max_position_embeddings")
        if inner is not None and inner != top:
            raise ConfigError(f"{where}: rope_scaling.original_max_position_embeddings={inner!r} differs from the "
                              f"top-level original_max_position_embeddings={top!r} (Phi3Config's default 4096 when "
                              "absent), which transformers uses for Phi-3; set the top-level key to the value you mean")
        return top
    if "original_max_position_embeddings" in raw:
        return raw["original_max_position_embeddings"]
    return scaling.get("original_max_position_embeddings",
                       raw.get("max_position_embeddings", defaults.get("max_position_embeddings", 2048)))


# ---------------------------------------------------------------------------------------------- checks
def problems(cfg) -> list[str]:
    """Every problem of ``cfg``'s RoPE keys, as 'key: found X, expected Y' strings (config.py checks
    rope_theta and head_dim first; without them nothing here can be computed)."""
    rs = cfg.rope_scaling
    out = _partial_problems(cfg)
    rotary = 0 if out else int(cfg.head_dim * cfg.partial_rotary_factor)   # 0: lengths are not checked
    if rs is None:
        return out
    if not isinstance(rs, dict):
        return [f"rope_scaling: found {rs!r}, expected a mapping with rope_type"]
    kind = rs.get("rope_type")
    if kind not in SUPPORTED_ROPE_TYPES:
        return [f"rope_scaling: rope_type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"]
    if cfg.model_type == "phi3" and kind not in PHI3_ROPE_TYPES:
        return [f"rope_scaling: rope_type {kind!r} is not one transformers' Phi3Config accepts; expected one of "
                f"{', '.join(PHI3_ROPE_TYPES)} (su and yarn read as longrope)"]
    need, may = ROPE_KEYS[kind]
    out += [f"rope_scaling.{k}: missing, required for rope_type {kind!r}" for k in need if k not in rs]
    unknown = sorted(set(rs) - set(need) - set(may) - {"rope_type"})
    if unknown:
        out.append(f"rope_scaling: {', '.join(unknown)} not supported for rope_type {kind!r}; "
                   f"expected {', '.join(need + may) or 'no other keys'}")
    out += _value_problems(rs, kind, rotary)
    if not out:
        out += _computed_problems(cfg)
    return out


def _partial_problems(cfg) -> list[str]:
    p = cfg.partial_rotary_factor
    if not (_number(p) and PARTIAL_RANGE[0] < p <= PARTIAL_RANGE[1]):
        return [f"partial_rotary_factor: found {p!r}, expected a number in (0, 1] (the share of head_dim rotated)"]
    if p != 1 and cfg.model_type != "phi3":
        return [f"partial_rotary_factor: found {p!r}; transformers' {cfg.model_type} attention rotates the whole "
                "head (only phi3 rotates part of it): remove the key, or use the phi3 family's checkpoint"]
    d = int(cfg.head_dim * p)   # transformers: dim = int(head_dim * partial_rotary_factor)
    if d < 2 or d % 2:
        return [f"partial_rotary_factor: {p!r} of head_dim {cfg.head_dim} rotates {d} dimensions, expected an "
                "even number of at least 2 (RoPE rotates pairs)"]
    return []


def _in(v: Any, lo: float, hi: float) -> bool:
    return _number(v) and lo <= v <= hi


def _value_problems(rs: dict[str, Any], kind: str, rotary_dim: int) -> list[str]:
    out = []
    factor = rs.get("factor")
    if factor is not None and not _in(factor, 1, MAX_FACTOR):
        out.append(f"rope_scaling.factor: found {factor!r}, expected a number in [1, {MAX_FACTOR:g}]")
    orig = rs.get("original_max_position_embeddings")
    if orig is not None and not (isinstance(orig, int) and not isinstance(orig, bool) and 0 < orig <= 1 << 24):
        out.append(f"rope_scaling.original_max_position_embeddings: found {orig!r}, expected a positive integer "
                   f"up to {1 << 24:,}")
    bounds = {"attention_factor": (1e-6, MAX_ATTENTION_FACTOR), "beta_fast": BETA_RANGE, "beta_slow": BETA_RANGE,
              "mscale": (1e-6, MAX_MSCALE), "mscale_all_dim": (1e-6, MAX_MSCALE)}
    for k, (lo, hi) in bounds.items():
        if rs.get(k) is not None and not _in(rs[k], lo, hi):
            out.append(f"rope_scaling.{k}: found {rs[k]!r}, expected a number in (0, {hi:g}]"
                       if lo < 1e-3 else f"rope_scaling.{k}: found {rs[k]!r}, expected a number in [{lo:g}, {hi:g}]")
    if "truncate" in rs and not isinstance(rs["truncate"], bool):
        out.append(f"rope_scaling.truncate: found {rs['truncate']!r}, expected true or false")
    if kind == "llama3":
        low, high = rs.get("low_freq_factor"), rs.get("high_freq_factor")
        for k, v in (("low_freq_factor", low), ("high_freq_factor", high)):
            if v is not None and not (_number(v) and 0 < v <= MAX_FACTOR):
                out.append(f"rope_scaling.{k}: found {v!r}, expected a number in (0, {MAX_FACTOR:g}]")
        if _number(low) and _number(high) and not low < high:
            out.append(f"rope_scaling.high_freq_factor: found {high!r}, expected more than low_freq_factor={low!r} "
                       "(transformers' llama3 RoPE interpolates between them)")
    if kind == "dynamic" and rotary_dim and rotary_dim <= 2:
        out.append(f"rope_scaling: dynamic NTK scaling needs more than 2 rotated dimensions (its base grows by a power "
                   f"d / (d - 2)), found {rotary_dim}")
    for k in ("short_factor", "long_factor"):
        if k in rs:
            out += _list_problems(k, rs[k], rotary_dim)
    return out


def _list_problems(key: str, v: Any, rotary_dim: int) -> list[str]:
    want = rotary_dim // 2
    if not isinstance(v, list):
        return [f"rope_scaling.{key}: found {type(v).__name__}, expected a list of {want} numbers (the rotated "
                "dimensions / 2)"]
    for i, x in enumerate(v[:4096]):
        if not _in(x, *LIST_RANGE):
            return [f"rope_scaling.{key}[{i}]: found {str(x)[:40]!r}, expected a number in "
                    f"[{LIST_RANGE[0]:g}, {LIST_RANGE[1]:g}]"]
    if rotary_dim and len(v) != want:
        return [f"rope_scaling.{key}: found {len(v)} numbers, expected {want} (the rotated dimensions / 2: head_dim "
                "times partial_rotary_factor, halved)"]
    return []


def _computed_problems(cfg) -> list[str]:
    """The frequencies at the initial length and the longest the config allows: finite, positive, and an
    attention factor in range (values that pass each bound but break the arithmetic together)."""
    longest = max(cfg.longest_sequence, cfg.rope_scaling.get("original_max_position_embeddings", 0) + 1)
    kind = cfg.rope_scaling.get("rope_type")
    try:
        for length in (None, longest):
            inv, attention = rope.inv_freq(cfg, length)
            at = f"at {length:,} positions" if length else "at the initial length"
            if not all(math.isfinite(x) and x > 0 for x in inv.tolist()):
                return [f"rope_scaling: these {kind} values give non-finite or zero frequencies {at}; expected finite "
                        "ones: check factor and rope_theta"]
            if not (math.isfinite(attention) and 0 < attention <= MAX_ATTENTION_FACTOR):
                return [f"rope_scaling: these {kind} values give an attention factor of {attention:g} {at}; expected "
                        f"(0, {MAX_ATTENTION_FACTOR:g}]: check factor, mscale and mscale_all_dim"]
    except (ArithmeticError, ValueError) as e:
        return [f"rope_scaling: transformers' {kind} RoPE cannot be computed from these values "
                f"({type(e).__name__}: {e}); check rope_theta, factor and the betas"]
    return []
