"""RoPE frequencies and cos/sin tables as transformers computes them, for every RoPE type the zoo takes.

Each type follows its initialiser in transformers' ``modeling_rope_utils.py`` (``ROPE_INIT_FUNCTIONS``),
operation by operation in float32 where it computes in float32 and in Python floats (double) where it
computes with Python scalars, so the inverse frequencies equal the reference's (tests/model_zoo/test_rope.py
holds them against the installed transformers at lengths below and above the original context):

* ``default``: ``1 / theta ** (arange(0, d, 2) / d)``;
* ``linear`` (``_compute_linear_scaling_rope_parameters``): the default divided by ``factor``;
* ``llama3`` (``_compute_llama3_parameters``): wavelength bands against ``original_max_position_embeddings``;
* ``yarn`` (``_compute_yarn_parameters``): a linear ramp between interpolation (``/ factor``) and
  extrapolation over the dimensions whose rotations at ``original_max_position_embeddings`` lie between
  ``beta_slow`` and ``beta_fast`` (``truncate``, default true, floors/ceils the range), and an attention
  factor that scales cos and sin: ``attention_factor``, else ``0.1 mscale ln(factor) + 1`` (YaRN eq. 21,
  the ratio of two such terms when ``mscale`` and ``mscale_all_dim`` are given); ``factor`` defaults to
  ``max_position_embeddings / original_max_position_embeddings``;
* ``dynamic`` (``_compute_dynamic_ntk_parameters``): NTK-aware: for a call over ``seq_len`` positions
  beyond ``max_position_embeddings`` the base grows to ``theta ((factor seq_len / max_pos) - (factor -
  1)) ** (d / (d - 2))``; at or below it, the default;
* ``longrope`` (``_compute_longrope_parameters``, Phi-3): per-dimension ``short_factor`` within the
  original context, ``long_factor`` beyond it, and the attention factor ``sqrt(1 + ln(factor) /
  ln(original_max_position_embeddings))``.

Partial rotation (``partial_rotary_factor``, Phi-3's family only; model_zoo/rope_config.py): every type
computes over the rotated dimensions ``int(head_dim * partial_rotary_factor)``, as transformers does, and the
attention rotates those first dimensions of each head and passes the rest (llama.Attention._rope).

Length dependence (transformers' ``dynamic_rope_update``): ``dynamic`` and ``longrope`` take the
frequencies of the call's length, ``max(position_ids) + 1`` over the whole batch: the row length for
unpacked rows, the longest document of the batch for packed rows (their position ids restart at 0 for each
document, and padding sits at position 0: porting/train/data/packing.py). State: port's tables are a
function of the call alone (the same frequencies whatever came before). HF's longrope is too; HF's dynamic
type also keeps the largest length seen until a call shorter than the original context resets it, so a
bucketed run whose shorter bucket follows a longer one differs from a raw HF run; the torch baseline
(porting/baseline/torch_loop.py) resets that state before every forward so it computes port's function
(docs/baseline.md). A KV-cache generation's step over positions 0..p equals a fresh call of p + 1.
"""

from __future__ import annotations

import math
import types

import numpy as np

# Types whose frequencies depend on the length of the call (transformers' dynamic_rope_update).
LENGTH_DEPENDENT = ("dynamic", "longrope")


def rotary_dim(cfg) -> int:
    """The rotated dimensions of each head (transformers: ``int(head_dim * partial_rotary_factor)``)."""
    return int(getattr(cfg, "rotary_dim", None) or cfg.head_dim)


def _pow32(base: float, exponents: np.ndarray) -> np.ndarray:
    """``base ** exponents`` (float32 exponents) as torch's ``float ** float32 tensor`` computes it: the
    Python base cast to float32, then a float32 power that torch rounds correctly in practice. NumPy's
    float32 pow does not (1 ulp off on ~10% of the entries); the float64 power rounded once does."""
    return (np.float64(np.float32(base)) ** exponents.astype(np.float64)).astype(np.float32)


def _exponents(dim: int) -> np.ndarray:
    return (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)).astype(np.float32)


def _default_inv_freq(base: float, dim: int) -> np.ndarray:
    return (np.float32(1) / _pow32(base, _exponents(dim))).astype(np.float32)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(rs: dict, base: float, dim: int, max_pos: int) -> tuple[np.ndarray, float]:
    original = rs["original_max_position_embeddings"]
    factor = rs.get("factor") or max_pos / original
    attention = rs.get("attention_factor")
    if attention is None:
        mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
        attention = (float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)) if mscale and mscale_all
                     else _yarn_mscale(factor))
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:   # the dimension that turns ``rotations`` times in the context
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001   # transformers' guard against a zero-width ramp
    pos_freqs = _pow32(base, _exponents(dim))
    extrapolation = (np.float32(1) / pos_freqs).astype(np.float32)
    interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (np.float32(1) - ramp.astype(np.float32)).astype(np.float32)   # extrapolation's share per dimension
    inv = interpolation * (np.float32(1) - keep) + extrapolation * keep
    return inv.astype(np.float32), float(attention)


def _llama3(rs: dict, inv_freq: np.ndarray) -> np.ndarray:
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_len = float(rs["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    # torch computes a Python scalar over a tensor as the scalar times the tensor's reciprocal
    wavelen = (np.float32(2 * math.pi) * (np.float32(1) / inv_freq)).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def _longrope(rs: dict, base: float, dim: int, max_pos: int, seq_len: int | None) -> tuple[np.ndarray, float]:
    original = rs["original_max_position_embeddings"]
    factor = rs.get("factor") or max_pos / original
    attention = rs.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.asarray(rs["long_factor"] if seq_len and seq_len > original else rs["short_factor"], np.float32)
    return (np.float32(1) / (ext * _pow32(base, _exponents(dim)))).astype(np.float32), float(attention)


def inv_freq(cfg, seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """(inverse frequencies (rotary_dim / 2,) float32, attention factor) of ``cfg``'s RoPE for a call over
    ``seq_len`` positions (None: the model's initial frequencies, as transformers builds them)."""
    d, base = rotary_dim(cfg), float(cfg.rope_theta)
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", "default")
    if kind == "yarn":
        return _yarn(rs, base, d, cfg.max_position_embeddings)
    if kind == "longrope":
        return _longrope(rs, base, d, cfg.max_position_embeddings, seq_len)
    if kind == "dynamic":
        max_pos = cfg.max_position_embeddings
        length = max(seq_len or max_pos, max_pos)
        factor = rs["factor"]
        base = base * ((factor * length / max_pos) - (factor - 1)) ** (d / (d - 2))
    inv = _default_inv_freq(base, d)
    if kind == "linear":
        inv = (inv / np.float32(rs["factor"])).astype(np.float32)
    elif kind == "llama3":
        inv = _llama3(rs, inv)
    return inv, 1.0


def threshold(cfg) -> int | None:
    """For a length-dependent type, the longest call that keeps the initial frequencies (None otherwise)."""
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type")
    if kind == "dynamic":
        return cfg.max_position_embeddings
    if kind == "longrope":
        return rs["original_max_position_embeddings"]
    return None


def tables_from(inv: np.ndarray, attention: float, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (len(positions), rotary_dim) float32 in rotate-half layout, times the attention factor
    (transformers: ``emb.cos() * attention_scaling``)."""
    freqs = np.outer(positions.astype(np.float32), inv.astype(np.float32))
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
    if attention != 1.0:
        cos, sin = (cos * np.float32(attention)).astype(np.float32), (sin * np.float32(attention)).astype(np.float32)
    return cos, sin


def rope_tables(cfg, length: int, seq_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of positions 0..length-1, shape (length, rotary_dim) float32, rotate-half layout (halves
    repeated), for a call over ``seq_len`` positions (None: the initial frequencies; they matter only for
    the length-dependent types)."""
    inv, attention = inv_freq(cfg, seq_len)
    return tables_from(inv, attention, np.arange(length))


def incremental_tables(cfg, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Row p rotated as a token-by-token KV-cache decode rotates position p: with the frequencies of a
    call over p + 1 positions (the length-dependent types; the others equal :func:`rope_tables`)."""
    limit = threshold(cfg)
    if limit is None or length <= limit:
        return rope_tables(cfg, length)
    cos, sin = rope_tables(cfg, length)
    for p in range(limit, length):
        c, s = tables_from(*inv_freq(cfg, p + 1), np.arange(p, p + 1))
        cos[p], sin[p] = c[0], s[0]
    return cos, sin


def call_args(cfg) -> tuple:
    """What :func:`call_tables` needs of ``cfg``, as a tuple of plain values: a graph can hold it as a
    constant (MindSpore does not resolve a config dataclass attribute inside ``construct``)."""
    rs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (cfg.rope_scaling or {}).items()))
    return rotary_dim(cfg), float(cfg.rope_theta), cfg.max_position_embeddings, rs


def call_tables(args: tuple, s: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rope_tables` for a call over ``s`` positions, from :func:`call_args`."""
    dim, theta, max_pos, rs = args
    cfg = types.SimpleNamespace(head_dim=dim, rope_theta=theta, max_position_embeddings=max_pos,
                                rope_scaling={k: list(v) if isinstance(v, tuple) else v for k, v in rs})
    return rope_tables(cfg, s, s)
