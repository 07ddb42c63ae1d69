"""The Ascend kernel plan (every kernel fused) compiled in GRAPH_MODE on the CPU and trained through
`port train`'s real step graphs (porting/train/run/step/cells.py), with contract-enforcing stand-ins for the
fused ops (tests/npu_models.py GRAPH_KERNELS: flash attention, RoPE, RMSNorm, SwiGLU) put in place by the documented hook
``model_zoo.llama.fused_ops_replaced``. Loss, gradients and updated weights are compared with the
reference kernel plan.

What runs where: float16 compute runs end to end on the CPU. The CPU backend has no bfloat16 kernels
for Reshape, Gather or Assign, so the bfloat16-compute graph is compiled through MindSpore's front end
(parse, type and shape inference, where the stand-ins' contract checks and any unsupported Python
raise fail) and then stops at CPU kernel selection; its numerics are the float16 run's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mindspore as ms

from model_zoo import LlamaConfig, build
from model_zoo import llama as llama_mod
from porting.train.run.step import cells as train_step
from tests.npu_models import GRAPH_KERNELS

# head_dim 32 (a multiple of 16), GQA 4/2: every kernel's fused path is allowed.
CFG = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
SEQ, MICRO = 24, 2
# float16 has a 2^-11 relative step: losses agree to ~1e-3, gradient directions to a few 1e-3.
FP16_LOSS_RTOL, FP16_GRAD_RTOL = 5e-3, 3e-2
HYPER = (1e-3, 0.1, 1 - 0.95)   # lr, 1 - beta1^1, 1 - beta2^1 for the first AdamW step


# Test bodies and the module-scoped fixtures that train both run in GRAPH_MODE (tests/conftest.py).
pytestmark = [pytest.mark.graph_mode, pytest.mark.usefixtures("graph_mode_module"), pytest.mark.compat]


def test_the_tier_runs_in_graph_mode():
    """The per-test PyNative reset in tests/conftest.py once overrode this module's graph mode."""
    assert ms.get_context("mode") == ms.GRAPH_MODE


def _f32(x: float) -> ms.Tensor:
    return ms.Tensor(np.float32(x))


def _batches(n: int) -> list[ms.Tensor]:
    rng = np.random.default_rng(11)
    return [ms.Tensor(rng.integers(0, CFG.vocab_size, (MICRO, SEQ)).astype(np.int32)) for _ in range(n)]


def _model(fused: bool, compute: str, param: str = "float32", cfg: LlamaConfig = CFG):
    if not fused:
        m = build(cfg, param_dtype=param, compute_dtype=compute, device="CPU", seed=5,
                  kernels_override={"attention": "reference", "rope": "reference", "rmsnorm": "reference"})
        assert not any(c.fused for c in m.plan.choices())
        return m
    with llama_mod.fused_ops_replaced(GRAPH_KERNELS):
        m = build(cfg, param_dtype=param, compute_dtype=compute, device="Ascend", seed=5)
    assert all(c.fused for c in m.plan.choices()), m.kernel_report()
    return m


def _weights(model) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().astype(np.float32) for p in model.trainable_params()}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _fused_step(fused: bool, batch: ms.Tensor, cfg: LlamaConfig = CFG):
    model = _model(fused, "float16", cfg=cfg)
    before = _weights(model)
    opt = train_step.AdamW(list(model.trainable_params()), (0.9, 0.95), 1e-8, 0.1)
    step = train_step.FusedTrainStep(model, opt, 1, 1.0)
    total, count, norm, finite = step(batch, batch, _f32(1.0 / (MICRO * (SEQ - 1))), _f32(1.0),
                                      *(_f32(h) for h in HYPER))
    after = _weights(model)
    delta = {k: after[k] - before[k] for k in after}
    return float(total.asnumpy()) / float(count.asnumpy()), float(norm.asnumpy()), bool(finite.asnumpy()), delta


@pytest.fixture(scope="module")
def no_accum_steps():
    batch = _batches(1)[0]
    return _fused_step(True, batch), _fused_step(False, batch)


@pytest.mark.slow
def test_fused_plan_trains_in_graph_mode_like_the_reference_without_accumulation(no_accum_steps):
    """Forward, backward, clip and AdamW in FusedTrainStep's one graph, fp16 compute."""
    (loss_f, norm_f, fin_f, delta_f), (loss_r, norm_r, fin_r, delta_r) = no_accum_steps
    assert fin_f and fin_r
    assert loss_f == pytest.approx(loss_r, rel=FP16_LOSS_RTOL)
    assert loss_f == pytest.approx(np.log(CFG.vocab_size), rel=0.05)   # a random model's loss
    assert norm_f == pytest.approx(norm_r, rel=FP16_GRAD_RTOL)
    # The first AdamW step moves every weight by about lr * sign(grad): the signs must agree.
    for k in delta_r:
        moved = np.abs(delta_r[k]) > 5e-4
        agree = np.mean(np.sign(delta_f[k][moved]) == np.sign(delta_r[k][moved]))
        assert agree > 0.97, (k, agree)


def _accum_run(fused: bool, batches: list[ms.Tensor]):
    from mindspore import ParameterTuple

    model = _model(fused, "float16")
    params = list(model.trainable_params())
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.1)
    buffers = train_step.accumulation_buffers(ParameterTuple(params))
    grad_step = train_step.AccumGradStep(model, opt.params, buffers)
    apply = train_step.ApplyStep(opt, buffers, 1, 1.0)
    scale = _f32(1.0 / (len(batches) * MICRO * (SEQ - 1)))
    total = count = 0.0
    for b in batches:
        t, c = grad_step(b, b, scale)
        total, count = total + float(t.asnumpy()), count + float(c.asnumpy())
    grads = {p.name: b.asnumpy().copy() for p, b in zip(params, buffers)}
    _, _, norm, finite = apply(_f32(total), _f32(count), _f32(1.0), *(_f32(h) for h in HYPER))
    zeroed = all(not b.asnumpy().any() for b in buffers)
    return total / count, grads, float(norm.asnumpy()), bool(finite.asnumpy()), zeroed, _weights(model)


@pytest.mark.slow
def test_fused_plan_accumulates_gradients_in_graph_mode_like_the_reference():
    """AccumGradStep (two micro-batches) then ApplyStep: per-parameter gradients within fp16 tolerance."""
    batches = _batches(2)
    loss_f, grads_f, norm_f, fin_f, zero_f, w_f = _accum_run(True, batches)
    loss_r, grads_r, norm_r, fin_r, zero_r, w_r = _accum_run(False, batches)
    assert fin_f and fin_r and zero_f and zero_r
    assert loss_f == pytest.approx(loss_r, rel=FP16_LOSS_RTOL)
    assert norm_f == pytest.approx(norm_r, rel=FP16_GRAD_RTOL)
    for k in grads_r:
        assert _rel(grads_f[k], grads_r[k]) < FP16_GRAD_RTOL, k
    assert max(_rel(w_f[k], w_r[k]) for k in w_r) < 1e-2


@pytest.mark.slow
def test_bfloat16_compute_graph_passes_the_front_end():
    """The bf16 Ascend graph parses, infers and passes every stand-in contract; only the CPU backend's
    kernel selection (no bfloat16 Reshape/Gather/Assign) stops it. Were the graph not graph-safe (a
    KernelError raised from construct) or a contract broken, the error would come before that."""
    model = _model(True, "bfloat16", "bfloat16")
    opt = train_step.AdamW(list(model.trainable_params()), (0.9, 0.95), 1e-8, 0.1)
    step = train_step.FusedTrainStep(model, opt, 1, 1.0)
    batch = _batches(1)[0]
    try:
        total, count, _, finite = step(batch, batch, _f32(1.0 / (MICRO * (SEQ - 1))), _f32(1.0),
                                       *(_f32(h) for h in HYPER))
    except (TypeError, RuntimeError) as exc:
        msg = str(exc)
        assert "Select CPU operator" in msg and "BFloat16" in msg, msg[:3000]
        return
    # A CPU backend with bfloat16 kernels runs it: then the numbers must be right too.
    assert bool(finite.asnumpy())
    assert float(total.asnumpy()) / float(count.asnumpy()) == pytest.approx(np.log(CFG.vocab_size), rel=0.05)


# Qwen3: per-head q/k RMSNorm (the fused rms_norm on (B, S, N, D) views), head_dim 32 with q_size 128 > hidden 64.
QWEN3 = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=64, model_type="qwen3", qk_norm=True)


# The same Qwen3 with a length-dependent RoPE (dynamic NTK) whose 16-position context the 24-position rows pass: the
# graph takes the tables of its static length. One fused and one reference step of it serve the Qwen3 test and the
# length-dependent RoPE test below (a pair of step graphs for each was 5-6 CPU-s of compiles per tier, the same twice).
QWEN3_DYNAMIC = dataclasses.replace(QWEN3, max_position_embeddings=16, rope_scaling={"rope_type": "dynamic", "factor": 4.0})


@pytest.fixture(scope="module")
def qwen3_dynamic_steps():
    """(fused, reference) ``_fused_step`` results of QWEN3_DYNAMIC on the first batch."""
    ids = _batches(1)[0]
    return _fused_step(True, ids, QWEN3_DYNAMIC), _fused_step(False, ids, QWEN3_DYNAMIC)


def test_qwen3_fused_plan_trains_in_graph_mode_like_the_reference(qwen3_dynamic_steps):
    """One FusedTrainStep (forward, backward, clip, AdamW in one graph, fp16) of Qwen3 with every kernel
    fused, the q/k norms included, against the reference plan (QWEN3_DYNAMIC: Qwen3's q/k norms and head_dim 32
    with q_size 128 > hidden 64, its RoPE tables those of a dynamic NTK past the context, folded at compile time)."""
    (loss_f, norm_f, fin_f, delta_f), (loss_r, norm_r, fin_r, delta_r) = qwen3_dynamic_steps
    assert fin_f and fin_r
    assert loss_f == pytest.approx(loss_r, rel=FP16_LOSS_RTOL)
    assert norm_f == pytest.approx(norm_r, rel=FP16_GRAD_RTOL)
    for k in ("model.layers.0.attention.q_layernorm.weight", "model.layers.1.attention.k_layernorm.weight"):
        moved = np.abs(delta_r[k]) > 5e-4
        assert moved.any() and np.mean(np.sign(delta_f[k][moved]) == np.sign(delta_r[k][moved])) > 0.97, k
    with llama_mod.fused_ops_replaced(GRAPH_KERNELS):
        m = build(QWEN3, compute_dtype="float16", device="Ascend")
    assert m.model.layers[0].attention.q_layernorm.rms_norm_op is GRAPH_KERNELS["rms_norm"]
    assert [r for r in m.kernel_report() if r.get("site")][0]["impl"] == "fused"


def _lora_step(fused: bool, batch: ms.Tensor):
    """One FusedTrainStep (fp16) with LoRA r 4 on every linear layer (model_zoo/lora.py), lora_B non-zero so the
    adapters are in the forward; the base frozen."""
    from converters import lora_names
    from model_zoo import lora
    from model_zoo.lora_spec import LoraSpec

    model = _model(fused, "float16")
    t = lora_names.resolve(CFG, "all-linear")
    lora.apply_lora(model, LoraSpec(4, 8.0), t.adapted.values())
    rng = np.random.default_rng(3)
    lora.set_values(model, {n: rng.normal(0, 0.05, s).astype(np.float32) for n, s in lora.adapter_shapes(model).items()})
    opt = train_step.AdamW(list(model.trainable_params()), (0.9, 0.95), 1e-8, 0.0)
    before = _weights(model)
    total, count, norm, finite = train_step.FusedTrainStep(model, opt, 1, 1.0)(
        batch, batch, _f32(1.0 / (MICRO * (SEQ - 1))), _f32(1.0), *(_f32(h) for h in HYPER))
    after = _weights(model)
    return float(total.asnumpy()) / float(count.asnumpy()), bool(finite.asnumpy()), {k: after[k] - before[k] for k in after}


@pytest.mark.slow   # two graph compiles: 12 CPU-s, 87 s wall on the shared 2 cores
def test_lora_on_the_fused_plan_trains_in_graph_mode_like_the_reference():
    """The fused SwiGLU path runs gate and up as LoRA layers (model_zoo/llama.py FeedForward), fused attention
    and RoPE around the adapted q/k/v/o: one LoRA step equals the reference plan's; only adapters move."""
    batch = _batches(1)[0]
    (loss_f, fin_f, delta_f), (loss_r, fin_r, delta_r) = _lora_step(True, batch), _lora_step(False, batch)
    assert fin_f and fin_r and loss_f == pytest.approx(loss_r, rel=FP16_LOSS_RTOL)
    assert set(delta_f) == set(delta_r) and all(".lora_" in k for k in delta_f) and len(delta_f) == 2 * 7 * 2
    for k in ("model.layers.0.feed_forward.w1.lora_B.weight", "model.layers.1.feed_forward.w3.lora_A.weight",
              "model.layers.1.attention.wq.lora_B.weight"):
        moved = np.abs(delta_r[k]) > 5e-4
        assert moved.any() and np.mean(np.sign(delta_f[k][moved]) == np.sign(delta_r[k][moved])) > 0.97, k


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_length_dependent_rope_past_its_context_compiles_to_the_pynative_tables(qwen3_dynamic_steps):
    """Dynamic NTK RoPE at 24 positions, past max_position_embeddings 16: the graph takes the tables of its
    static length (NumPy folded at compile time) and gives PyNative's logits; the fused plan trains like
    the reference there (the steps of ``qwen3_dynamic_steps``, which the Qwen3 test above also reads)."""
    cfg = QWEN3_DYNAMIC
    ids = _batches(1)[0]
    model = build(cfg, device="CPU", seed=5)
    graph = model(ids).asnumpy()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        eager = model(ids).asnumpy()
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
    np.testing.assert_allclose(graph, eager, rtol=0, atol=1e-5)
    (loss_f, norm_f, fin_f, _), (loss_r, norm_r, fin_r, _) = qwen3_dynamic_steps
    assert fin_f and fin_r and loss_f == pytest.approx(loss_r, rel=FP16_LOSS_RTOL)
    assert norm_f == pytest.approx(norm_r, rel=FP16_GRAD_RTOL)


PHI3_PACKED = dataclasses.replace(CFG, model_type="phi3", max_position_embeddings=64, partial_rotary_factor=0.75,
                                  rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 8,
                                                "short_factor": [1.0 + 0.05 * i for i in range(12)],
                                                "long_factor": [1.0 + 0.5 * i for i in range(12)]})


@pytest.mark.slow   # two step graphs: ~15 s on an idle 2-core machine
def test_packed_longrope_with_a_partial_rotation_trains_in_graph_mode_like_the_reference():
    """Phi-4-mini's RoPE (longrope, 24 of 32 dimensions rotated) on packed rows whose longest document (11)
    passes the original context (8): the frequencies picked in the graph from the positions (model_zoo/rope_packed.py),
    the fused RoPE on the rotated slice and TND flash attention compile and train as the reference kernels do."""
    from porting.train.data import packing
    from porting.train.data.examples import DataReport, Example, TokenizedData

    rng = np.random.default_rng(4)
    ex = [Example(rng.integers(3, CFG.vocab_size, n).astype(np.int32), rng.integers(3, CFG.vocab_size, n)
                  .astype(np.int32), i) for i, n in enumerate([7, 11, 5, 6, 4, 9])]
    mb = packing.pack_micro_batch(TokenizedData(ex, DataReport("x", "0", "text"), 0), [[0, 1, 2], [3, 4, 5]],
                                  packing.row_length(24, 3), 3)
    assert int(mb.packed[0].max()) + 1 == 11 > 8

    def one_step(fused: bool):
        model = _model(fused, "float16", cfg=PHI3_PACKED)
        opt = train_step.AdamW(list(model.trainable_params()), (0.9, 0.95), 1e-8, 0.1)
        step = train_step.FusedTrainStep(model, opt, 1, 1.0)
        total, count, norm, finite = step(ms.Tensor(mb.input_ids), ms.Tensor(mb.labels), _f32(1.0 / mb.tokens),
                                          _f32(1.0), *(_f32(h) for h in HYPER), *train_step.packed_inputs(mb))
        return float(total.asnumpy()) / float(count.asnumpy()), float(norm.asnumpy()), bool(finite.asnumpy())

    (loss_f, norm_f, fin_f), (loss_r, norm_r, fin_r) = one_step(True), one_step(False)
    assert fin_f and fin_r and loss_f == pytest.approx(loss_r, rel=FP16_LOSS_RTOL)
    assert norm_f == pytest.approx(norm_r, rel=FP16_GRAD_RTOL)


def test_the_stand_ins_are_what_the_model_calls():
    """The hook put the stand-ins into the cells (so the graphs above ran them), and restored the table."""
    model = _model(True, "float16")
    layer = model.model.layers[0]
    assert layer.attention.flash_attention is GRAPH_KERNELS["flash_attention_score"]
    assert layer.attention.rope_op is GRAPH_KERNELS["rotary_position_embedding"]
    assert layer.attention_norm.rms_norm_op is GRAPH_KERNELS["rms_norm"]
    assert layer.feed_forward.swiglu_op is GRAPH_KERNELS["swiglu"]
    assert llama_mod.FUSED_OPS["rms_norm"] is ms.ops.rms_norm


# ------------------------------------------------------------------ the stand-ins enforce the contracts
def _t(shape, dtype=ms.float16, seed=0):
    return ms.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(dtype)


def _fa_ok():
    from model_zoo import kernels

    q, k = _t((1, 4, 8, 32)), _t((1, 2, 8, 32), seed=1)
    mask = ms.Tensor(kernels.compressed_causal_mask())
    return q, k, dict(head_num=4, attn_mask=mask, scalar_value=32 ** -0.5, input_layout="BNSD", sparse_mode=2)


@pytest.mark.parametrize("change,match", [
    (lambda q, k, kw: (q.astype(ms.float32), k.astype(ms.float32), kw), "float16 or bfloat16"),
    (lambda q, k, kw: (q, k, {**kw, "attn_mask": kw["attn_mask"][:1024, :1024]}), r"\(2048, 2048\)"),
    (lambda q, k, kw: (q, k, {**kw, "attn_mask": kw["attn_mask"].astype(ms.float16)}), "bool or uint8"),
    (lambda q, k, kw: (q, k, {**kw, "attn_mask": None}), "need attn_mask"),
    (lambda q, k, kw: (q, k, {**kw, "input_layout": "BSH"}), "BNSD"),
    (lambda q, k, kw: (q, k, {**kw, "head_num": 2}), "head_num"),
    (lambda q, k, kw: (_t((1, 4, 8, 8)), _t((1, 2, 8, 8)), kw), "multiple of 16"),
    (lambda q, k, kw: (q, _t((1, 3, 8, 32)), kw), "factor of N1"),
    (lambda q, k, kw: (q, _t((1, 2, 4, 32)), {**kw, "sparse_mode": 3}), "S1 <= S2"),
    (lambda q, k, kw: (q, k, {**kw, "keep_prob": 0.9}), "dropout"),
])
def test_flash_attention_stand_in_rejects(change, match):
    q, k, kw = change(*_fa_ok())
    with pytest.raises((TypeError, ValueError), match=match):
        GRAPH_KERNELS["flash_attention_score"](q, k, k, **kw)


def test_rms_norm_stand_in_contract():
    x, g = _t((2, 3, 16)), _t((16,))
    y, rstd = GRAPH_KERNELS["rms_norm"](x, g, 1e-5)
    assert y.dtype == ms.float16 and rstd.dtype == ms.float32 and rstd.shape == (2, 3, 1)
    with pytest.raises(TypeError, match="same dtype"):
        GRAPH_KERNELS["rms_norm"](x, g.astype(ms.float32), 1e-5)
    for eps in (0.0, 1.5, 1):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            GRAPH_KERNELS["rms_norm"](x, g, eps)
    with pytest.raises(ValueError, match="trailing dims"):
        GRAPH_KERNELS["rms_norm"](x, _t((8,)), 1e-5)


def test_rope_stand_in_contract():
    x, cos = _t((1, 4, 8, 32)), _t((1, 1, 8, 32), seed=2)
    assert GRAPH_KERNELS["rotary_position_embedding"](x, cos, cos, 0).shape == x.shape
    with pytest.raises(TypeError, match="x's dtype"):
        GRAPH_KERNELS["rotary_position_embedding"](x, cos.astype(ms.float32), cos.astype(ms.float32), 0)
    with pytest.raises(ValueError, match="cannot be called"):   # B*N = 64 > 8*S = 16, D*2 bytes = 64
        GRAPH_KERNELS["rotary_position_embedding"](_t((4, 16, 2, 32)), _t((1, 1, 2, 32)), _t((1, 1, 2, 32)), 0)
    with pytest.raises(ValueError, match="11SD, B1SD or BNSD"):
        GRAPH_KERNELS["rotary_position_embedding"](x, _t((1, 1, 4, 32)), _t((1, 1, 4, 32)), 0)
    with pytest.raises(ValueError, match="D even"):
        GRAPH_KERNELS["rotary_position_embedding"](_t((1, 4, 8, 7)), _t((1, 1, 8, 7)), _t((1, 1, 8, 7)), 0)


def test_swiglu_stand_in_contract():
    x = _t((2, 5, 12))
    out = GRAPH_KERNELS["swiglu"](x, -1).asnumpy().astype(np.float32)
    xa = x.asnumpy().astype(np.float32)
    a, b = xa[..., :6], xa[..., 6:]
    np.testing.assert_allclose(out, a / (1 + np.exp(-a)) * b, rtol=2e-3, atol=2e-3)
    with pytest.raises(RuntimeError, match="divisible by 2"):
        GRAPH_KERNELS["swiglu"](_t((2, 5, 7)), -1)


@pytest.mark.parametrize("q_len,kv_len", [(12, 12), (3, 12), (1, 7)])
def test_graph_stand_ins_compute_what_the_numpy_models_compute(q_len, kv_len):
    """The graph stand-ins and the NumPy models of the documented kernels (tests/npu_models.py) agree."""
    from model_zoo import kernels
    from tests.npu_models import NUMPY_KERNELS

    q, k, v = _t((2, 4, q_len, 32)), _t((2, 2, kv_len, 32), seed=1), _t((2, 2, kv_len, 32), seed=2)
    kw = kernels.flash_attention_kwargs(num_heads=4, head_dim=32, q_len=q_len, kv_len=kv_len)
    want = NUMPY_KERNELS["flash_attention_score"](q, k, v, **kw).asnumpy().astype(np.float32)
    got = GRAPH_KERNELS["flash_attention_score"](q, k, v, **{**kw, "attn_mask": ms.Tensor(kw["attn_mask"])})
    np.testing.assert_allclose(got.asnumpy().astype(np.float32), want, atol=2e-3)
    x, g = _t((2, 3, 16)), _t((16,))
    np.testing.assert_allclose(GRAPH_KERNELS["rms_norm"](x, g, 1e-5)[0].asnumpy().astype(np.float32),
                               NUMPY_KERNELS["rms_norm"](x, g, 1e-5)[0].asnumpy().astype(np.float32), atol=3e-3)
    cos = _t((1, 1, q_len, 32), seed=3)
    np.testing.assert_allclose(
        GRAPH_KERNELS["rotary_position_embedding"](q, cos, cos, 0).asnumpy().astype(np.float32),
        NUMPY_KERNELS["rotary_position_embedding"](q, cos, cos, 0).asnumpy().astype(np.float32), atol=3e-3)
