"""port's C++ CPU kernels (model_zoo/cpu_kernels.py): causal attention checked against torch's
scaled_dot_product_attention, RMSNorm against transformers' LlamaRMSNorm and RoPE against its
apply_rotary_pos_emb, forward and backward; all three inside a whole model against the reference
path; every code path this CPU can run (avx512, avx2, generic); the fallbacks when no compiler is
there."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import mindspore as ms
from mindspore import Tensor, nn

from model_zoo import LlamaConfig, build, cpu_kernels, kernels
from model_zoo.cpu_cells import CpuCausalAttention, CpuRmsNorm, CpuRope
from model_zoo.errors import KernelError
from model_zoo.llama import apply_rope, reference_attention

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason=f"{cpu_kernels.status()[1]}")
# Every code path this CPU can run; the mode (PyNative / graph) does not change the kernel, so the
# other paths are checked in PyNative only.
ISAS = cpu_kernels.supported_isas()
DEFAULT = cpu_kernels.selected_isa()
PATHS = [(DEFAULT, "graph")] + [(isa, "pynative") for isa in ISAS]

# (batch, heads, kv heads, seq, head_dim): GQA, MHA, MQA; head_dim 8 (stories260K), 24 (not a multiple
# of 16: the 8-wide tile), 20 (scalar tail), 128; seq not a multiple of the 8-row block or 16-key tile; seq 1.
SHAPES = [(2, 8, 4, 64, 32), (1, 4, 4, 37, 24), (2, 6, 1, 19, 20), (1, 2, 2, 33, 128), (3, 8, 4, 50, 8),
          (1, 2, 1, 1, 16)]


class _Loss(nn.Cell):
    """sum(attention(q, k, v) * w): any upstream gradient w, so the backward pass is fully exercised."""

    def __init__(self, isa=None):
        super().__init__()
        self.attn = CpuCausalAttention(isa)

    def construct(self, q, k, v, w):
        return (self.attn(q, k, v) * w).sum()


def _inputs(b, n, g, s, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32)
            for shape in ((b, n, s, d), (b, g, s, d), (b, g, s, d), (b, n, s, d))]


def _torch_reference(q, k, v, w):
    t = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*t, is_causal=True, enable_gqa=True)
    (out * torch.tensor(w)).sum().backward()
    return out.detach().numpy(), [x.grad.numpy() for x in t]


@pytest.mark.parametrize("isa,mode", PATHS, ids="-".join)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_torch_sdpa(shape, isa, mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    q, k, v, w = _inputs(*shape)
    want_out, want_grads = _torch_reference(q, k, v, w)
    net = _Loss(isa)
    got_out = net.attn(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=2e-5)
    _, grads = ms.value_and_grad(net, grad_position=(0, 1, 2))(*map(Tensor, (q, k, v, w)))
    for name, got, want in zip("qkv", grads, want_grads):
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=5e-5, err_msg=f"d{name}")


def test_matches_the_reference_attention_cell():
    b, n, g, s, d = 2, 8, 4, 40, 16
    q, k, v, _ = _inputs(b, n, g, s, d, seed=3)
    want = reference_attention(Tensor(q), Tensor(k), Tensor(v), d ** -0.5, n // g, 0).asnumpy()
    got = CpuCausalAttention()(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("isa,mode", PATHS, ids="-".join)
@pytest.mark.parametrize("shape", [(2, 7, 64), (3, 5, 24), (1, 1, 8), (4, 300)], ids=lambda s: "x".join(map(str, s)))
def test_rms_norm_matches_transformers(shape, isa, mode):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    ref = LlamaRMSNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(w))
    tx = torch.tensor(x, requires_grad=True)
    ty = ref(tx)
    (ty * torch.tensor(dy)).sum().backward()

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = CpuRmsNorm(1e-5, isa)

        def construct(self, x, w, dy):
            return (self.norm(x, w) * dy).sum()

    net = Loss()
    np.testing.assert_allclose(net.norm(Tensor(x), Tensor(w)).asnumpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    _, (dx, dw) = ms.value_and_grad(net, grad_position=(0, 1))(Tensor(x), Tensor(w), Tensor(dy))
    np.testing.assert_allclose(dx.asnumpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dw.asnumpy(), ref.weight.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa,mode", PATHS, ids="-".join)
def test_rope_matches_transformers(isa, mode):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    cfg = LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0)
    cos, sin = kernels.rope_tables(cfg, 13)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 13, cfg.head_dim)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    ty, _ = apply_rotary_pos_emb(tx, tx.detach(), torch.tensor(cos)[None], torch.tensor(sin)[None])
    (ty * torch.tensor(dy)).sum().backward()

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.rope = CpuRope(isa)

        def construct(self, x, cos, sin, dy):
            return (self.rope(x, cos, sin) * dy).sum()

    net = Loss()
    args = [Tensor(a) for a in (x, cos, sin)]
    np.testing.assert_allclose(net.rope(*args).asnumpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(net.rope(*args).asnumpy(), apply_rope(*args, False).asnumpy(), rtol=1e-5, atol=1e-5)
    _, dx = ms.value_and_grad(net, grad_position=0)(*args, Tensor(dy))
    np.testing.assert_allclose(dx.asnumpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_gradients_of_a_whole_model_match_the_reference_path():
    """One loss, two models with the same weights: port's three C++ kernels against the plain-op
    reference."""
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ids = Tensor(np.random.default_rng(0).integers(0, 128, (2, 24)).astype(np.int32))
    results = {}
    for impl in ("cpu", "reference"):
        model = build(cfg, kernels_override={k: impl for k in cpu_kernels.OPS}, seed=7)
        assert {c.impl for c in model.plan.choices() if c.kernel in cpu_kernels.OPS} == {impl}

        def loss(x, m=model):
            return (m(x) ** 2).mean()
        value, grads = ms.value_and_grad(loss, None, model.trainable_params())(ids)
        results[impl] = (float(value.asnumpy()), [g.asnumpy() for g in grads])
    assert results["cpu"][0] == pytest.approx(results["reference"][0], rel=1e-5)
    for got, want in zip(results["cpu"][1], results["reference"][1]):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
def test_nan_and_inf_propagate(isa):
    """The kernels are built with -ffast-math (vectorised exp); a NaN must still reach the loss, or the
    training loop's NaN stop would not fire."""
    rng = np.random.default_rng(4)
    q, k, v, _ = _inputs(1, 2, 1, 8, 16)
    q[0, 0, 3, 5] = np.nan
    out = CpuCausalAttention(isa)(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    assert np.isnan(out[0, 0, 3]).all() and np.isfinite(np.delete(out[0, 0], 3, axis=0)).all()
    k[0, 0, 2, 1] = np.inf  # key 2 is seen by queries 2..7 only
    q[0, 0, 3, 5] = 0.0
    out = CpuCausalAttention(isa)(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    assert np.isfinite(out[0, :, :2]).all() and not np.isfinite(out[0, :, 2:]).all()
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    x[0, 1, 4] = np.nan
    y = CpuRmsNorm(1e-5, isa)(Tensor(x), Tensor(np.ones(16, np.float32))).asnumpy()
    assert np.isnan(y[0, 1]).all() and np.isfinite(np.delete(y.reshape(6, 16), 1, axis=0)).all()
    maps = Path("/proc/self/maps")
    if maps.is_file():  # MindSpore really loaded this path's library (each path is its own file)
        assert cpu_kernels.status(isa)[0] in maps.read_text()


def test_kernel_refuses_what_it_was_not_built_for():
    """The library checks dtype and shapes itself (a bad call must fail, not read out of bounds)."""
    q, k, v, _ = _inputs(1, 4, 3, 8, 16)  # 4 heads over 3 kv heads: not grouped-query attention
    with pytest.raises(RuntimeError):
        CpuCausalAttention()(Tensor(q), Tensor(k), Tensor(v)).asnumpy()
    q, k, v, _ = _inputs(1, 4, 2, 8, 16)
    with pytest.raises((RuntimeError, TypeError)):
        CpuCausalAttention()(*(Tensor(a).astype(ms.float16) for a in (q, k, v))).asnumpy()


@pytest.fixture
def fresh_status(monkeypatch, tmp_path):
    """cpu_kernels.status() with an empty kernel cache, restored afterwards."""
    monkeypatch.setenv(cpu_kernels.CACHE_ENV, str(tmp_path / "kernels"))
    cpu_kernels._build.cache_clear()
    yield tmp_path / "kernels"
    monkeypatch.undo()
    cpu_kernels._build.cache_clear()


@pytest.mark.slow
def test_compiles_once_into_the_cache(fresh_status):
    lib, why = cpu_kernels.status()
    assert lib is not None and lib.startswith(str(fresh_status)) and lib in why
    assert [p.name for p in fresh_status.iterdir()] == [lib.rsplit("/", 1)[1]]  # no temporary left behind
    cpu_kernels._build.cache_clear()
    assert cpu_kernels.status()[0] == lib  # found again, not rebuilt under another name


def test_without_a_compiler_the_reference_runs_and_the_reason_is_given(fresh_status, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-port-test")
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    plan = kernels.select_kernels(cfg, device="CPU")
    assert {c.impl for c in plan.choices()} == {"reference"}
    assert "no C++ compiler found (no-such-compiler-port-test)" in plan.attention.reason
    with pytest.raises(KernelError, match="no C.. compiler found .no-such-compiler-port-test.*attention=reference"):
        kernels.select_kernels(cfg, device="CPU", override={"attention": "cpu"})


def test_a_failing_compiler_is_reported(fresh_status, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    lib, why = cpu_kernels.status()
    assert lib is None and "failed" in why and "causal_attention.cc rms_norm.cc rope.cc" in why
    assert not list(fresh_status.iterdir())  # nothing half-written left in the cache


def test_override_refuses_other_devices_dtypes_and_kernels():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(KernelError, match="this device is Ascend"):
        kernels.select_kernels(cfg, device="Ascend", compute_dtype="bfloat16", override={"attention": "cpu"})
    with pytest.raises(KernelError, match="takes float32, the compute dtype is bfloat16"):
        kernels.select_kernels(cfg, device="CPU", compute_dtype="bfloat16", override={"attention": "cpu"})
    with pytest.raises(KernelError, match="this device is GPU"):
        kernels.select_kernels(cfg, device="GPU", override={"rope": "cpu"})


def test_each_code_path_is_built_for_its_isa_only():
    """The avx2 library holds no AVX-512 instruction (it must run on an AVX2-only CPU) and the generic
    one no AVX; the avx512 one does use 512-bit registers."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump to disassemble the libraries")
    text = {isa: subprocess.run([objdump, "-d", cpu_kernels.status(isa)[0]], capture_output=True, text=True,
                                timeout=60, check=True).stdout for isa in ISAS}
    if "avx2" in text:
        assert "zmm" not in text["avx2"] and "ymm" in text["avx2"]
    if "avx512" in text:
        assert "zmm" in text["avx512"]
    assert "zmm" not in text["generic"] and "ymm" not in text["generic"]


def test_the_code_path_is_chosen_forced_and_reported(monkeypatch):
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    monkeypatch.delenv(cpu_kernels.ISA_ENV, raising=False)
    assert cpu_kernels.selected_isa() == ISAS[0]  # the best this CPU has
    for isa in ISAS:
        monkeypatch.setenv(cpu_kernels.ISA_ENV, isa)
        plan = kernels.select_kernels(cfg, device="CPU")
        assert plan.attention.impl == "cpu" and plan.attention.op.endswith(f"[{isa} code path]")
        assert f"-{isa}-" in cpu_kernels.status()[0]
    monkeypatch.setenv(cpu_kernels.ISA_ENV, "avx9000")
    with pytest.raises(KernelError, match="PORT_CPU_ISA='avx9000': expected one of avx512, avx2, generic or auto"):
        kernels.select_kernels(cfg, device="CPU")
    # The flags of an AVX2-only CPU (the AMD EPYC): avx2 by default, avx512 refused by name.
    if platform.machine().lower() in cpu_kernels.X86:
        monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: frozenset({"sse2", "avx", "avx2", "fma"}))
        monkeypatch.setenv(cpu_kernels.ISA_ENV, "auto")
        assert cpu_kernels.selected_isa() == "avx2" and cpu_kernels.supported_isas() == ["avx2", "generic"]
        monkeypatch.setenv(cpu_kernels.ISA_ENV, "avx512")
        with pytest.raises(KernelError, match="PORT_CPU_ISA=avx512: this CPU lacks avx512bw, avx512dq, avx512f, "
                                              "avx512vl; use one of avx2, generic or unset it"):
            kernels.select_kernels(cfg, device="CPU")
