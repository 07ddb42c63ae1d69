"""NumPy models of the documented semantics of MindSpore's fused Ascend kernels.

No NPU is reachable here, so the fused code paths are exercised on CPU by putting these models in
place of ``ops.flash_attention_score``, ``ops.rotary_position_embedding`` and ``ops.rms_norm``.
Each model checks the documented argument contract (layouts, dtypes, mask shapes, sparse modes)
and raises where a real kernel would reject the call, so a wrong argument fails the test.
Sources: MindSpore API docs (2.10) for the three ops, see ASCEND_FACTS.md.
"""

from __future__ import annotations

import numpy as np


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
    """(y, rstd) with y = x / sqrt(mean(x^2) + eps) * gamma over the last axis."""
    xa, g = _np(x).astype(np.float32), _np(gamma).astype(np.float32)
    if g.shape != xa.shape[-g.ndim:]:
        raise KernelContractError(f"gamma shape {g.shape} must match the trailing dims of x {xa.shape}")
    rstd = 1.0 / np.sqrt(np.mean(xa * xa, -1, keepdims=True) + epsilon)
    return _to_ms(xa * rstd * g, x), _to_ms(rstd, x)


NUMPY_KERNELS = {
    "flash_attention_score": np_flash_attention_score,
    "rotary_position_embedding": np_rotary_position_embedding,
    "rms_norm": np_rms_norm,
}
