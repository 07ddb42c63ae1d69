"""Kernel dispatch, and the fused Ascend paths checked against NumPy models of the documented kernels."""

from __future__ import annotations

import numpy as np
import pytest

import mindspore as ms

from model_zoo import LlamaConfig, build, cpu_kernels, kernels
from model_zoo import llama as llama_mod
from model_zoo.decode import forward_cached
from model_zoo.errors import KernelError
from tests.npu_models import NUMPY_KERNELS, KernelContractError, np_flash_attention_score

# What float32 CPU models run: port's C++ kernels where a compiler built them (as on CI), else reference.
CPU = "cpu" if cpu_kernels.available() else "reference"

CFG = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def test_cpu_picks_reference_and_says_why():
    # In float32 every kernel gets port's C++ CPU kernel (tests/model_zoo/test_cpu_kernels.py); in half
    # precision, and on GPU, the reference path.
    plan = kernels.select_kernels(CFG, device="CPU")
    assert [c.impl for c in plan.choices()] == [CPU] * 3 + ["reference"]   # no CPU SwiGLU kernel
    assert all("registered only on Ascend" in c.reason for c in plan.choices())
    assert "no CPU kernel" in plan.swiglu.reason
    half = kernels.select_kernels(CFG, device="CPU", compute_dtype="bfloat16")
    assert [c.impl for c in half.choices()] == ["reference"] * 4
    gpu = kernels.select_kernels(CFG, device="GPU")
    assert [c.impl for c in gpu.choices()] == ["reference"] * 4


def test_ascend_picks_fused_within_documented_constraints():
    plan = kernels.select_kernels(CFG, device="Ascend", compute_dtype="bfloat16")
    assert plan.attention.fused and plan.rope.fused and plan.rmsnorm.fused and plan.swiglu.fused
    # fp32 compute: FlashAttentionScore takes fp16/bf16 only.
    plan32 = kernels.select_kernels(CFG, device="Ascend", compute_dtype="float32")
    assert not plan32.attention.fused and "float16/bfloat16" in plan32.attention.reason
    # head_dim 8 (stories260K): not a multiple of 16.
    small = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=1,
                        num_attention_heads=8, num_key_value_heads=4)
    p = kernels.select_kernels(small, device="Ascend", compute_dtype="bfloat16")
    assert not p.attention.fused and "head_dim 8" in p.attention.reason and p.rope.fused


def test_overrides():
    p = kernels.select_kernels(CFG, device="Ascend", compute_dtype="bfloat16", override={"attention": "reference"})
    assert not p.attention.fused and p.attention.reason == "forced by override" and p.rope.fused
    with pytest.raises(KernelError, match="registered only on Ascend"):
        kernels.select_kernels(CFG, device="CPU", override={"rope": "fused"})
    with pytest.raises(KernelError, match="unknown kernel"):
        kernels.select_kernels(CFG, device="CPU", override={"softmax": "fused"})
    with pytest.raises(KernelError, match="expected one of"):
        kernels.select_kernels(CFG, device="CPU", override={"rope": "fast"})
    with pytest.raises(KernelError, match="no CPU kernel for swiglu"):
        kernels.select_kernels(CFG, device="CPU", override={"swiglu": "cpu"})
    with pytest.raises(KernelError, match="head_dim"):
        kernels.select_kernels(LlamaConfig(vocab_size=8, hidden_size=64, intermediate_size=8, num_hidden_layers=1,
                                           num_attention_heads=8), device="Ascend", compute_dtype="bfloat16",
                               override={"attention": "fused"})


def test_flash_attention_kwargs_modes():
    kw = kernels.flash_attention_kwargs(num_heads=4, head_dim=32, q_len=16, kv_len=16)
    assert kw["sparse_mode"] == 2 and kw["input_layout"] == "BNSD" and kw["attn_mask"].shape == (2048, 2048)
    assert kw["scalar_value"] == pytest.approx(32 ** -0.5)
    assert kernels.flash_attention_kwargs(num_heads=4, head_dim=32, q_len=1, kv_len=9)["sparse_mode"] == 3
    with pytest.raises(KernelError):
        kernels.flash_attention_kwargs(num_heads=4, head_dim=32, q_len=9, kv_len=3)


@pytest.mark.parametrize("q_len,kv_len", [(12, 12), (3, 12), (1, 7)])
def test_fused_attention_matches_reference_attention(q_len, kv_len):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, q_len, 32)).astype(np.float16)
    k = rng.standard_normal((2, 2, kv_len, 32)).astype(np.float16)
    v = rng.standard_normal((2, 2, kv_len, 32)).astype(np.float16)
    Q, K, V = (ms.Tensor(a) for a in (q, k, v))
    saved = dict(llama_mod.FUSED_OPS)
    llama_mod.FUSED_OPS.update(NUMPY_KERNELS)
    try:
        fused = llama_mod.fused_attention(Q, K, V, num_heads=4).asnumpy().astype(np.float32)
    finally:
        llama_mod.FUSED_OPS.update(saved)
    ref = llama_mod.reference_attention(Q.astype(ms.float32), K.astype(ms.float32), V.astype(ms.float32),
                                        32 ** -0.5, 2, kv_len - q_len).asnumpy()
    np.testing.assert_allclose(fused, ref, atol=3e-3)


def test_numpy_model_rejects_wrong_arguments():
    """The models are strict: the same call with a wrong mask or dtype fails (so the tests above can fail)."""
    q = ms.Tensor(np.zeros((1, 2, 4, 16), np.float16))
    kw = kernels.flash_attention_kwargs(num_heads=2, head_dim=16, q_len=4, kv_len=4)
    with pytest.raises(KernelContractError, match="2048x2048"):
        np_flash_attention_score(q, q, q, **{**kw, "attn_mask": np.tril(np.ones((2048, 2048), np.uint8))})
    with pytest.raises(KernelContractError, match="float16/bfloat16"):
        np_flash_attention_score(q.astype(ms.float32), q.astype(ms.float32), q.astype(ms.float32), **kw)


def test_rope_fused_allowed_follows_documented_limits():
    assert kernels.rope_fused_allowed(1, 32, 4096, 128, 2)
    assert not kernels.rope_fused_allowed(1000, 1, 16, 128, 2)  # B >= 1000
    assert not kernels.rope_fused_allowed(64, 32, 16, 128, 2)  # BNSD, B*N > 8S, 32-byte aligned D
    assert kernels.rope_fused_allowed(64, 32, 16, 72, 2)  # 144 bytes: not 32-byte aligned


@pytest.mark.slow
def test_whole_model_on_fused_paths_matches_reference(monkeypatch):
    """The model built for Ascend (all three fused kernels) gives the reference model's logits when the
    fused ops are the NumPy models of their documented semantics."""
    for name, fn in NUMPY_KERNELS.items():
        monkeypatch.setitem(llama_mod.FUSED_OPS, name, fn)
    ref = build(CFG, param_dtype="float32", device="CPU", seed=3)
    fused = build(CFG, param_dtype="float32", compute_dtype="float16", device="Ascend", seed=3)
    assert all(c.fused for c in fused.plan.choices())
    ids = ms.Tensor(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 24)).astype(np.int32))
    want = ref(ids).asnumpy()
    got = fused(ids).asnumpy()
    np.testing.assert_allclose(got, want, atol=2e-2)
    # KV-cache path: prefill 16, then 8 one at a time (sparse_mode 3 for the decode calls).
    logits, cache = forward_cached(fused, ids[:, :16], None)
    steps = [logits.asnumpy()]
    for t in range(16, 24):
        lg, cache = forward_cached(fused, ids[:, t:t + 1], cache)
        steps.append(lg.asnumpy())
    np.testing.assert_allclose(np.concatenate(steps, 1), want, atol=2e-2)


def test_kernel_report_names_every_layer():
    m = build(CFG, device="CPU")
    rows = m.kernel_report()
    assert len(rows) == CFG.num_hidden_layers * 4 + 1
    assert {r["kernel"] for r in rows} == {"attention", "rope", "rmsnorm", "swiglu"}
    assert all(r["impl"] == (CPU if r["kernel"] != "swiglu" else "reference") and r["reason"] for r in rows)
    flags = {r["kernel"]: r["mindspeed_flag"] for r in rows}
    assert flags == {"attention": "--use-flash-attn", "rope": "--use-fused-rotary-pos-emb",
                     "rmsnorm": "--use-fused-rmsnorm", "swiglu": "--use-fused-swiglu"}
    assert {r["cann_op"] for r in rows} == {"FlashAttentionScore", "RotaryPositionEmbedding", "RmsNorm", "SwiGlu"}
    note = m.plan.as_dict()["mindspeed"]
    assert "does not use it" in note or "does not need it" in note   # never claims MindSpeed is used


@pytest.mark.npu
def test_real_npu_fused_matches_reference():
    ms.set_context(device_target="Ascend")
    ref = build(CFG, param_dtype="bfloat16", kernels_override={k: "reference" for k in kernels.KERNELS}, seed=5)
    fused = build(CFG, param_dtype="bfloat16", seed=5)
    assert fused.plan.attention.fused
    ids = ms.Tensor(np.random.default_rng(2).integers(0, CFG.vocab_size, (2, 64)).astype(np.int32))
    np.testing.assert_allclose(fused(ids).asnumpy(), ref(ids).asnumpy(), atol=5e-2)
