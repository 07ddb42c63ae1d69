"""NumPy models of the documented semantics of MindSpore's fused Ascend kernels.

No NPU is reachable here, so the fused code paths are exercised on CPU by putting these models in
place of ``ops.flash_attention_score``, ``ops.rotary_position_embedding`` and ``ops.rms_norm``.
Each model checks the documented argument contract (layouts, dtypes, mask shapes, sparse modes)
and raises where a real kernel would reject the call, so a wrong argument fails the test.
Sources: the MindSpore API docs (2.10; https://www.mindspore.cn/docs/en/master/api_python/mindspore.ops.html) of the three ops.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import ops


class KernelContractError(AssertionError):
    pass


def _np(x):
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


def _to_ms(arr: np.ndarray, like):
    import mindspore as ms

    return ms.Tensor(arr).astype(like.dtype)


def _half(dtype) -> bool:
    import mindspore as ms

    return dtype in (ms.float16, ms.bfloat16)


def np_flash_attention_score(query, key, value, head_num, real_shift=None, drop_mask=None, padding_mask=None,
                             attn_mask=None, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                             keep_prob=1.0, scalar_value=1.0, pre_tokens=2147483647, next_tokens=2147483647,
                             inner_precise=0, input_layout="BSH", sparse_mode=0):
    """softmax(mask(scale * Q K^T)) V for layouts BNSD / BSND / BSH, sparse modes 0, 2, 3."""
    if not (_half(query.dtype) and key.dtype == query.dtype and value.dtype == query.dtype):
        raise KernelContractError(f"FlashAttentionScore takes float16/bfloat16 q/k/v, got {query.dtype}")
    if keep_prob != 1.0 or real_shift is not None or drop_mask is not None or padding_mask is not None:
        raise KernelContractError("model supports no dropout / pse / padding_mask")
    if input_layout == "TND":
        return _np_tnd(query, key, value, head_num, attn_mask, prefix, actual_seq_qlen, actual_seq_kvlen,
                       scalar_value, pre_tokens, next_tokens, sparse_mode)
    q, k, v = (_np(t).astype(np.float32) for t in (query, key, value))
    if input_layout == "BNSD":
        pass
    elif input_layout == "BSND":
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    elif input_layout == "BSH":
        b, s1, h1 = q.shape
        d = h1 // head_num
        q = q.reshape(b, s1, head_num, d).transpose(0, 2, 1, 3)
        n2 = k.shape[-1] // d
        k = k.reshape(b, -1, n2, d).transpose(0, 2, 1, 3)
        v = v.reshape(b, -1, n2, d).transpose(0, 2, 1, 3)
    else:
        raise KernelContractError(f"layout {input_layout} not modelled")
    b, n1, s1, d = q.shape
    n2, s2 = k.shape[1], k.shape[2]
    if n1 != head_num:
        raise KernelContractError(f"head_num {head_num} != query heads {n1}")
    if d % 16 or d > 512:
        raise KernelContractError(f"head_dim {d}: must be a multiple of 16 and <= 512")
    if n1 % n2:
        raise KernelContractError(f"N2={n2} must be a factor of N1={n1}")
    k = np.repeat(k, n1 // n2, axis=1)
    v = np.repeat(v, n1 // n2, axis=1)
    scores = np.einsum("bnsd,bntd->bnst", q, k) * scalar_value
    i = np.arange(s1)[:, None]
    j = np.arange(s2)[None, :]
    if sparse_mode in (2, 3):
        m = _np(attn_mask)
        if m.shape != (2048, 2048) or not np.array_equal(m.astype(bool), np.triu(np.ones((2048, 2048), bool), 1)):
            raise KernelContractError("sparse_mode 2/3 need the optimized 2048x2048 upper-triangular mask")
        masked = j > i if sparse_mode == 2 else j > i + (s2 - s1)
        if sparse_mode == 3 and s1 > s2:
            raise KernelContractError("sparse_mode 3 needs S1 <= S2")
    elif sparse_mode == 0:
        masked = np.zeros((s1, s2), bool) if attn_mask is None else _np(attn_mask).astype(bool)
    else:
        raise KernelContractError(f"sparse_mode {sparse_mode} not modelled")
    scores = np.where(masked, -np.inf, scores)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bnst,bntd->bnsd", p, v)
    if input_layout == "BSND":
        out = out.transpose(0, 2, 1, 3)
    elif input_layout == "BSH":
        out = out.transpose(0, 2, 1, 3).reshape(b, s1, n1 * d)
    return _to_ms(out.astype(np.float32), query)


def _cumulative_ends(ends, total: int, what: str) -> np.ndarray:
    e = np.asarray(_np(ends)).reshape(-1)
    if hasattr(ends, "dtype") and not isinstance(ends, (tuple, list)) and str(ends.dtype) not in ("Int64", "int64"):
        raise KernelContractError(f"{what} must be int64 (the IR's DT_INT64), got {ends.dtype}")
    if e.size == 0 or e.size > 1024:
        raise KernelContractError(f"{what}: 1..1024 sequences, got {e.size}")
    if np.any(np.diff(e) < 0) or e[0] < 0 or int(e[-1]) != total:
        raise KernelContractError(f"{what} must be non-decreasing cumulative ends with the last equal to T={total}, "
                                  f"got {e.tolist()}")
    return e.astype(np.int64)


def _np_tnd(query, key, value, head_num, attn_mask, prefix, qlen, kvlen, scale, pre_tokens, next_tokens, sparse_mode):
    """TND: (T, N, D) tokens of several sequences one after another, with their cumulative ends."""
    q, k, v = (_np(t).astype(np.float32) for t in (query, key, value))
    if q.ndim != 3 or k.ndim != 3 or v.shape != k.shape:
        raise KernelContractError("TND query/key/value must be (T, N, D)")
    if qlen is None or kvlen is None:
        raise KernelContractError("TND needs actual_seq_qlen and actual_seq_kvlen")
    eq = _cumulative_ends(qlen, q.shape[0], "actual_seq_qlen")
    ek = _cumulative_ends(kvlen, k.shape[0], "actual_seq_kvlen")
    if eq.size != ek.size:
        raise KernelContractError("actual_seq_qlen and actual_seq_kvlen must have the same length (the batch)")
    lq, lk = np.diff(eq, prepend=0), np.diff(ek, prepend=0)
    if np.any(lk == 0):
        raise KernelContractError("TND: 0 must not exist in the key lengths")
    if sparse_mode not in (2, 3) or prefix is not None or next_tokens != 0 or pre_tokens < lq.max():
        raise KernelContractError("TND: sparse_mode 2 or 3, no prefix, next_tokens 0, pre_tokens >= max query length")
    m = _np(attn_mask)
    if m.shape != (2048, 2048) or not np.array_equal(m.astype(bool), np.triu(np.ones((2048, 2048), bool), 1)):
        raise KernelContractError("TND: attn_mask must be the optimized 2048x2048 lower-triangular mask")
    n1, d = q.shape[1], q.shape[2]
    if n1 != head_num or d % 16 or d > 512 or n1 % k.shape[1]:
        raise KernelContractError(f"TND: head_num {head_num}, N1 {n1}, N2 {k.shape[1]}, D {d}")
    rep = n1 // k.shape[1]
    out = np.zeros_like(q)
    for b in range(eq.size):
        qs, ks = eq[b] - lq[b], ek[b] - lk[b]
        if sparse_mode == 3 and lq[b] > lk[b]:
            raise KernelContractError("TND sparse_mode 3: each query length <= its key length")
        qb, kb, vb = q[qs:eq[b]], np.repeat(k[ks:ek[b]], rep, 1), np.repeat(v[ks:ek[b]], rep, 1)
        sc = np.einsum("snd,tnd->nst", qb, kb) * scale
        i, j = np.arange(lq[b])[:, None], np.arange(lk[b])[None, :]
        sc = np.where(j > i + (lk[b] - lq[b] if sparse_mode == 3 else 0), -np.inf, sc)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        out[qs:eq[b]] = np.einsum("nst,tnd->snd", p / p.sum(-1, keepdims=True), vb)
    return _to_ms(out, query)


def np_rotary_position_embedding(x, cos, sin, mode=0):
    """Mode 0 rotate-half: x*cos + cat(-x2, x1)*sin; BNSD x with 11SD/B1SD/BNSD cos and sin."""
    xa, c, s = _np(x).astype(np.float32), _np(cos).astype(np.float32), _np(sin).astype(np.float32)
    if xa.ndim != 4 or c.ndim != 4 or s.shape != c.shape:
        raise KernelContractError("x, cos, sin must be 4-D with cos.shape == sin.shape")
    b, n, sq, d = xa.shape
    if d % 2 or d >= 896 or b >= 1000 or n >= 1000:
        raise KernelContractError(f"x shape {xa.shape} outside D even < 896, B, N < 1000")
    if c.shape[2:] != (sq, d) or c.shape[0] not in (1, b) or c.shape[1] not in (1, n):
        raise KernelContractError(f"cos shape {c.shape} does not fit BNSD x {xa.shape}")
    if cos.dtype != x.dtype:
        raise KernelContractError("cos/sin must have x's dtype")
    if mode == 0:
        rot = np.concatenate([-xa[..., d // 2:], xa[..., : d // 2]], -1)
    elif mode == 1:
        rot = np.stack([-xa[..., 1::2], xa[..., ::2]], -1).reshape(xa.shape)
    else:
        raise KernelContractError(f"mode {mode}")
    return _to_ms(xa * c + rot * s, x)


def np_rms_norm(x, gamma, epsilon=1e-6):
    """(y, rstd float32) with y = x / sqrt(mean(x^2) + eps) * gamma over the last axis."""
    xa, g = _np(x).astype(np.float32), _np(gamma).astype(np.float32)
    if g.shape != xa.shape[-g.ndim:]:
        raise KernelContractError(f"gamma shape {g.shape} must match the trailing dims of x {xa.shape}")
    rstd = 1.0 / np.sqrt(np.mean(xa * xa, -1, keepdims=True) + epsilon)
    return _to_ms(xa * rstd * g, x), ms.Tensor(rstd.astype(np.float32))   # rstd is float32 (documented)


def np_swiglu(input, dim=-1):  # noqa: A002 - the documented argument name
    """silu(a) * b with a, b the two halves of ``input`` along ``dim``."""
    xa = _np(input).astype(np.float32)
    if not isinstance(dim, int) or xa.shape[dim] % 2:
        raise KernelContractError(f"swiglu: dim {dim!r} must be an int and shape[dim] even, got {xa.shape}")
    a, b = np.split(xa, 2, axis=dim)
    return _to_ms(a / (1.0 + np.exp(-a)) * b, input)


NUMPY_KERNELS = {
    "flash_attention_score": np_flash_attention_score,
    "rotary_position_embedding": np_rotary_position_embedding,
    "rms_norm": np_rms_norm,
    "swiglu": np_swiglu,
}


# ---------------------------------------------------------------------------------------------
# Graph-safe stand-ins: the same contracts, written in MindSpore ops so they compile in GRAPH_MODE
# on the CPU and are differentiable (forward, backward and optimizer steps of the real step graphs).
# Every check is on static facts (dtype, shape, constant arguments), so a violation raises while
# the graph is compiled, as the real kernel's infer step would. The math is the real one, computed
# in float32 and returned in the input dtype, as the Ascend kernels do internally.

def _graph_half(dtype) -> bool:
    return dtype == ms.float16 or dtype == ms.bfloat16


def _graph_float(dtype) -> bool:
    return dtype == ms.float16 or dtype == ms.bfloat16 or dtype == ms.float32


def graph_flash_attention_score(query, key, value, head_num, real_shift=None, drop_mask=None, padding_mask=None,
                                attn_mask=None, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                                keep_prob=1.0, scalar_value=1.0, pre_tokens=2147483647, next_tokens=2147483647,
                                inner_precise=0, input_layout="BSH", sparse_mode=0):
    """ops.flash_attention_score for BNSD with sparse_mode 2/3 and the compressed (2048, 2048) mask."""
    if not _graph_half(query.dtype):
        raise TypeError("flash_attention_score: query must be float16 or bfloat16")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError("flash_attention_score: key and value must have query's dtype")
    if input_layout == "TND":
        return _graph_tnd(query, key, value, head_num, real_shift, drop_mask, padding_mask, attn_mask, prefix,
                          actual_seq_qlen, actual_seq_kvlen, keep_prob, scalar_value, pre_tokens, next_tokens,
                          sparse_mode)
    if input_layout != "BNSD":
        raise ValueError("flash_attention_score stand-in: only input_layouts BNSD and TND are modelled")
    if keep_prob != 1.0 or real_shift is not None or drop_mask is not None or padding_mask is not None:
        raise ValueError("flash_attention_score stand-in: no dropout, pse or padding_mask is modelled")
    if prefix is not None or actual_seq_qlen is not None or actual_seq_kvlen is not None:
        raise ValueError("flash_attention_score stand-in: prefix / actual_seq_* are not modelled")
    if len(query.shape) != 4 or len(key.shape) != 4 or len(value.shape) != 4:
        raise ValueError("flash_attention_score: BNSD query, key and value must be 4-D")
    b, n1, s1, d = query.shape
    n2, s2 = key.shape[1], key.shape[2]
    if key.shape[0] != b or value.shape != key.shape or key.shape[3] != d:
        raise ValueError("flash_attention_score: key/value must be (B, N2, S2, D) with query's B and D")
    if n1 != head_num:
        raise ValueError("flash_attention_score: head_num must equal the query's N1")
    if d % 16 != 0 or d > 512:
        raise ValueError("flash_attention_score: head_dim must be a multiple of 16 and at most 512")
    if n1 > 256 or n1 % n2 != 0:
        raise ValueError("flash_attention_score: N1 <= 256 and N2 a factor of N1")
    if sparse_mode != 2 and sparse_mode != 3:
        raise ValueError("flash_attention_score stand-in: only sparse_mode 2 and 3 are modelled")
    if attn_mask is None:
        raise ValueError("flash_attention_score: sparse_mode 2/3 need attn_mask")
    if attn_mask.shape != (2048, 2048):
        raise ValueError("flash_attention_score: sparse_mode 2/3 need the compressed (2048, 2048) attn_mask")
    if attn_mask.dtype != ms.bool_ and attn_mask.dtype != ms.uint8:
        raise TypeError("flash_attention_score: attn_mask must be bool or uint8")
    if sparse_mode == 3 and s1 > s2:
        raise ValueError("flash_attention_score: sparse_mode 3 needs S1 <= S2")
    if s2 > 2048:
        raise ValueError("flash_attention_score stand-in: models S2 <= 2048 (the compressed mask's extent)")
    # The mask actually passed decides what is discarded (1 = discard): a wrong mask gives wrong numbers.
    if sparse_mode == 2:
        m = attn_mask[:s1, :s2]
    else:   # right-down causal: query i sits at key position i + S2 - S1
        m = attn_mask[s2 - s1:s2, :s2]
    discard = ops.cast(m, ms.bool_)
    rep = n1 // n2
    q = ops.cast(query, ms.float32)
    k = ops.cast(key, ms.float32)
    v = ops.cast(value, ms.float32)
    if rep > 1:   # query head h reads key/value head h // rep
        k = ops.reshape(ops.broadcast_to(ops.expand_dims(k, 2), (b, n2, rep, s2, d)), (b, n1, s2, d))
        v = ops.reshape(ops.broadcast_to(ops.expand_dims(v, 2), (b, n2, rep, s2, d)), (b, n1, s2, d))
    scores = ops.BatchMatMul(transpose_b=True)(q, k) * scalar_value
    scores = ops.select(ops.broadcast_to(discard, scores.shape), ops.full_like(scores, -1e30), scores)
    probs = ops.softmax(scores, -1)
    return ops.cast(ops.BatchMatMul()(probs, v), query.dtype)


def _graph_tnd(query, key, value, head_num, real_shift, drop_mask, padding_mask, attn_mask, prefix, qlen, kvlen,
               keep_prob, scalar_value, pre_tokens, next_tokens, sparse_mode):
    """TND (packed sequences): q (T1, N1, D), k/v (T2, N2, D), cumulative ends as int64 tensors. The static
    contract raises at compile time; the ends' values decide the mask (wrong ends give wrong numbers, and
    :func:`np_flash_attention_score` checks the values themselves)."""
    if len(query.shape) != 3 or len(key.shape) != 3 or value.shape != key.shape:
        raise ValueError("flash_attention_score: TND query, key and value must be 3-D (T, N, D)")
    t1, n1, d = query.shape
    t2, n2 = key.shape[0], key.shape[1]
    if key.shape[2] != d or n1 != head_num or d % 16 != 0 or d > 512 or n1 > 256 or n1 % n2 != 0:
        raise ValueError("flash_attention_score: TND needs head_num == N1 <= 256, N2 a factor of N1, D % 16 == 0")
    if qlen is None or kvlen is None:
        raise ValueError("flash_attention_score: TND needs actual_seq_qlen and actual_seq_kvlen")
    if qlen.dtype != ms.int64 or kvlen.dtype != ms.int64 or len(qlen.shape) != 1 or qlen.shape != kvlen.shape:
        raise TypeError("flash_attention_score: actual_seq_qlen/kvlen must be 1-D int64 tensors of one length")
    if qlen.shape[0] > 1024:
        raise ValueError("flash_attention_score: TND takes at most 1024 sequences")
    if sparse_mode != 2 and sparse_mode != 3:
        raise ValueError("flash_attention_score: TND needs sparse_mode 2 or 3 (a lower-triangular attn_mask)")
    if attn_mask is None or attn_mask.shape != (2048, 2048):
        raise ValueError("flash_attention_score: TND needs the compressed (2048, 2048) attn_mask")
    if attn_mask.dtype != ms.bool_ and attn_mask.dtype != ms.uint8:
        raise TypeError("flash_attention_score: attn_mask must be bool or uint8")
    if next_tokens != 0 or prefix is not None:
        raise ValueError("flash_attention_score: TND needs next_tokens 0 and no prefix")
    if keep_prob != 1.0 or real_shift is not None or drop_mask is not None or padding_mask is not None:
        raise ValueError("flash_attention_score stand-in: no dropout, pse or padding_mask is modelled")
    # Sequence of each token (how many ends lie at or before it) and its offset in that sequence.
    tq = ops.arange(0, t1, 1, dtype=ms.int64)
    tk = ops.arange(0, t2, 1, dtype=ms.int64)
    sq = ops.cast(ops.expand_dims(tq, 1) >= ops.expand_dims(qlen, 0), ms.int32).sum(1)
    sk = ops.cast(ops.expand_dims(tk, 1) >= ops.expand_dims(kvlen, 0), ms.int32).sum(1)
    zero = ops.zeros((1,), ms.int64)
    q_start = ops.gather(ops.cat((zero, qlen)), sq, 0)
    k_start = ops.gather(ops.cat((zero, kvlen)), sk, 0)
    i = ops.expand_dims(tq - q_start, 1)
    j = ops.expand_dims(tk - k_start, 0)
    if sparse_mode == 3:   # right-down: query i of a sequence sits at key i + (len_k - len_q)
        len_q = ops.gather(ops.cat((zero, qlen)), sq + 1, 0) - q_start
        len_k = ops.gather(ops.cat((zero, kvlen)), sk + 1, 0) - k_start
        i = i + ops.expand_dims(len_k, 0) - ops.expand_dims(len_q, 1)
    discard = ops.logical_or(ops.expand_dims(sq, 1) != ops.expand_dims(sk, 0), j > i)   # (T1, T2)
    rep = n1 // n2
    q = ops.transpose(ops.cast(query, ms.float32), (1, 0, 2))            # (N1, T1, D)
    k = ops.transpose(ops.cast(key, ms.float32), (1, 0, 2))
    v = ops.transpose(ops.cast(value, ms.float32), (1, 0, 2))
    if rep > 1:
        k = ops.reshape(ops.broadcast_to(ops.expand_dims(k, 1), (n2, rep, t2, d)), (n1, t2, d))
        v = ops.reshape(ops.broadcast_to(ops.expand_dims(v, 1), (n2, rep, t2, d)), (n1, t2, d))
    scores = ops.BatchMatMul(transpose_b=True)(q, k) * scalar_value
    scores = ops.select(ops.broadcast_to(discard, scores.shape), ops.full_like(scores, -1e30), scores)
    out = ops.BatchMatMul()(ops.softmax(scores, -1), v)                  # (N1, T1, D)
    return ops.cast(ops.transpose(out, (1, 0, 2)), query.dtype)


def graph_rotary_position_embedding(x, cos, sin, mode=0):
    """ops.rotary_position_embedding, BNSD x with 11SD/B1SD/BNSD cos/sin, modes 0 and 1."""
    if not _graph_float(x.dtype):
        raise TypeError("rotary_position_embedding: x must be float16, bfloat16 or float32")
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise TypeError("rotary_position_embedding: cos and sin must have x's dtype")
    if len(x.shape) != 4 or len(cos.shape) != 4 or sin.shape != cos.shape:
        raise ValueError("rotary_position_embedding: x, cos, sin must be 4-D with cos.shape == sin.shape")
    b, n, s, d = x.shape
    if d % 2 != 0 or d >= 896 or b >= 1000 or n >= 1000:
        raise ValueError("rotary_position_embedding: D even and < 896, B and N < 1000")
    if cos.shape[2] != s or cos.shape[3] != d or (cos.shape[0] != 1 and cos.shape[0] != b) \
            or (cos.shape[1] != 1 and cos.shape[1] != n):
        raise ValueError("rotary_position_embedding: cos/sin must be 11SD, B1SD or BNSD for a BNSD x")
    itemsize = 4 if x.dtype == ms.float32 else 2
    if b * n > 8 * s and (d * itemsize) % 32 == 0:
        raise ValueError("rotary_position_embedding: BNSD with B*N > 8S and a 32-byte-aligned D cannot be called")
    if mode != 0 and mode != 1:
        raise ValueError("rotary_position_embedding: mode must be 0 or 1")
    if mode == 1 and cos.shape[0] * cos.shape[1] != 1:
        raise ValueError("rotary_position_embedding: mode 1 takes 11SD cos/sin for a BNSD x")
    xf = ops.cast(x, ms.float32)
    half = d // 2
    if mode == 0:
        rot = ops.cat((-xf[..., half:], xf[..., :half]), -1)
    else:
        pairs = ops.reshape(xf, (b, n, s, half, 2))
        rot = ops.reshape(ops.stack((-pairs[..., 1], pairs[..., 0]), -1), (b, n, s, d))
    out = xf * ops.cast(cos, ms.float32) + rot * ops.cast(sin, ms.float32)
    return ops.cast(out, x.dtype)


def graph_rms_norm(x, gamma, epsilon=1e-6):
    """ops.rms_norm (MindSpore <= 2.10 signature): (y in x's dtype, rstd in float32)."""
    if not _graph_float(x.dtype) or not _graph_float(gamma.dtype):
        raise TypeError("rms_norm: x and gamma must be float16, float32 or bfloat16")
    if x.dtype != gamma.dtype:
        raise TypeError("rms_norm: x and gamma must have the same dtype")
    if not isinstance(epsilon, float) or epsilon <= 0.0 or epsilon > 1.0:
        raise ValueError("rms_norm: epsilon must be a float in (0, 1]")
    g = len(gamma.shape)
    if g > len(x.shape) or x.shape[len(x.shape) - g:] != gamma.shape:
        raise ValueError("rms_norm: gamma's shape must equal the trailing dims of x")
    axes = tuple(range(len(x.shape) - g, len(x.shape)))
    xf = ops.cast(x, ms.float32)
    rstd = ops.rsqrt(ops.mean(ops.square(xf), axes, keep_dims=True) + epsilon)
    y = ops.cast(xf * rstd * ops.cast(gamma, ms.float32), x.dtype)
    return y, rstd


def graph_swiglu(input, dim=-1):  # noqa: A002 - the documented argument name
    """ops.swiglu: silu(first half) * second half along ``dim``, in the input's dtype."""
    if not _graph_float(input.dtype):
        raise TypeError("swiglu: input must be float16, float32 or bfloat16")
    if not isinstance(dim, int):
        raise TypeError("swiglu: dim must be an int")
    if input.shape[dim] % 2 != 0:
        raise RuntimeError("swiglu: the dimension `dim` must be divisible by 2")
    a, b = ops.chunk(ops.cast(input, ms.float32), 2, dim)
    return ops.cast(ops.silu(a) * b, input.dtype)


GRAPH_KERNELS = {
    "flash_attention_score": graph_flash_attention_score,
    "rotary_position_embedding": graph_rotary_position_embedding,
    "rms_norm": graph_rms_norm,
    "swiglu": graph_swiglu,
}
