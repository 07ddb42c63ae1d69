"""Device checks for a real Ascend NPU (910B/910C), skipped elsewhere (tests/conftest.py).

Run on the device, in a process of their own (MindSpore picks its device target once per process):
    pytest -q -p no:cacheprovider -m npu tests/npu
See docs/ascend.md. They are the CPU tier's twins (tests/model_zoo/test_ascend_graph.py) with the real
CANN kernels in place of the stand-ins.
"""

from __future__ import annotations

import numpy as np
import pytest

import mindspore as ms

pytestmark = [pytest.mark.npu, pytest.mark.graph_mode]

CFG_KW = dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
BF16_LOSS_RTOL = 2e-2   # bf16 has a 2^-8 relative step; fused and reference round differently


@pytest.fixture(scope="module", autouse=True)
def ascend_graph_mode():  # test bodies get GRAPH_MODE from the graph_mode marker (tests/conftest.py)
    ms.set_context(mode=ms.GRAPH_MODE)
    if ms.get_context("device_target") != "Ascend":
        ms.set_device("Ascend")
    yield


def _f32(x: float) -> ms.Tensor:
    return ms.Tensor(np.float32(x))


def _step(fused: bool, ids: ms.Tensor) -> tuple[float, float, dict]:
    from model_zoo import LlamaConfig, build, kernels
    from porting.train.run.step import cells as train_step

    cfg = LlamaConfig(**CFG_KW)
    override = None if fused else {k: "reference" for k in kernels.KERNELS}
    model = build(cfg, param_dtype="bfloat16", compute_dtype="bfloat16", kernels_override=override, seed=3)
    assert all(c.fused == fused for c in model.plan.choices()), model.kernel_report()
    opt = train_step.AdamW(list(model.trainable_params()), (0.9, 0.95), 1e-8, 0.0)
    before = {m.name: m.asnumpy().copy() for m in opt.masters}
    step = train_step.FusedTrainStep(model, opt, 1, 1.0)
    b, s = ids.shape
    total, count, norm, finite = step(ids, ids, _f32(1.0 / (b * (s - 1))), _f32(1.0), _f32(1e-4), _f32(0.1),
                                      _f32(0.05))
    assert bool(finite.asnumpy())
    moved = {m.name: m.asnumpy() - before[m.name] for m in opt.masters}   # the fp32 masters' update
    return float(total.asnumpy()) / float(count.asnumpy()), float(norm.asnumpy()), moved


def test_graph_mode_training_step_fused_matches_reference():
    ids = ms.Tensor(np.random.default_rng(0).integers(0, CFG_KW["vocab_size"], (2, 256)).astype(np.int32))
    loss_f, norm_f, m_f = _step(True, ids)
    loss_r, norm_r, m_r = _step(False, ids)
    assert loss_f == pytest.approx(loss_r, rel=BF16_LOSS_RTOL)
    assert norm_f == pytest.approx(norm_r, rel=5e-2)
    assert m_r and m_f
    for k in m_r:   # the fp32 masters moved the same way
        moved = np.abs(m_r[k]) > 5e-5
        assert np.mean(np.sign(m_f[k][moved]) == np.sign(m_r[k][moved])) > 0.99, k


def _qkv(s_q: int, s_kv: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    mk = lambda n, s: ms.Tensor(rng.standard_normal((1, n, s, 128)).astype(np.float32)).astype(ms.bfloat16)  # noqa: E731
    return mk(8, s_q), mk(2, s_kv), mk(2, s_kv)


@pytest.mark.parametrize("seq", [128, 1024, 4096])
def test_flash_attention_sparse_mode_2_matches_reference(seq):
    from model_zoo import llama

    q, k, v = _qkv(seq, seq)
    fused = llama.fused_attention(q, k, v, num_heads=8).astype(ms.float32).asnumpy()
    ref = llama.reference_attention(q, k, v, 128 ** -0.5, 4, 0).astype(ms.float32).asnumpy()
    np.testing.assert_allclose(fused, ref, atol=2e-2, rtol=2e-2)


def test_flash_attention_decode_step_sparse_mode_3_matches_reference():
    from model_zoo import kernels, llama

    q, k, v = _qkv(1, 1024, seed=1)
    assert kernels.flash_attention_kwargs(num_heads=8, head_dim=128, q_len=1, kv_len=1024)["sparse_mode"] == 3
    fused = llama.fused_attention(q, k, v, num_heads=8).astype(ms.float32).asnumpy()
    ref = llama.reference_attention(q, k, v, 128 ** -0.5, 4, 1023).astype(ms.float32).asnumpy()
    np.testing.assert_allclose(fused, ref, atol=2e-2, rtol=2e-2)


def test_peak_memory_is_within_the_plan():
    """One training step's measured device peak against porting/train/plan/make.py's estimate for it."""
    from model_zoo import LlamaConfig
    from porting.train.plan.memory import estimate_memory, GIB
    from porting.train.recipe.schema import validate_recipe

    ms.runtime.reset_peak_memory_stats()
    ids = ms.Tensor(np.random.default_rng(0).integers(0, CFG_KW["vocab_size"], (1, 2048)).astype(np.int32))
    _step(True, ids)
    peak = ms.runtime.max_memory_allocated() / GIB
    recipe = validate_recipe({"model": {"source": "llama-7b"}, "data": {"path": "x.jsonl", "max_seq_length": 2048},
                              "batching": {"micro_batch_size": 1}, "cluster": {"device": "ascend"},
                              "precision": {"param_dtype": "bfloat16", "compute_dtype": "bfloat16"}},
                             check_files=False)
    est = estimate_memory(LlamaConfig(**CFG_KW), recipe)
    planned = est["total"] - est["workspace"]   # the runtime workspace is not in the allocator's peak
    print(f"peak {peak:.3f} GiB, planned {planned:.3f} GiB (without the {est['workspace']} GiB workspace)")
    assert peak <= planned * 1.25, (peak, est)
