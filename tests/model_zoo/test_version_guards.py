"""Version guards: the installed MindSpore's fused-op signatures are checked at plan time; a mismatch
falls back to the reference kernel with the reason (never a call with the wrong arguments or index)."""

from __future__ import annotations

import types

import pytest
from mindspore import ops

from model_zoo import LlamaConfig, build, kernels
from model_zoo.errors import KernelError

pytestmark = pytest.mark.compat   # the guards matter most on the oldest supported MindSpore

CFG = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _namespace(**changed):
    """mindspore.ops as installed, with some ops replaced or removed (None) as a later MindSpore has them."""
    ns = types.SimpleNamespace(**{name: getattr(ops, name) for name, _ in kernels.EXPECTED_SIGNATURES.values()})
    for name, fn in changed.items():
        if fn is None:
            delattr(ns, name)
        else:
            setattr(ns, name, fn)
    return ns


def rms_norm_after_2_9(input, normalized_shape, weight=None, eps=1e-6):  # noqa: A002 - the announced signature
    """The signature MindSpore 2.10's docstring announces: returns y only."""
    raise AssertionError("the guard must not call the op")


def test_installed_mindspore_passes_every_guard():
    for kernel in kernels.KERNELS:
        assert kernels.signature_problem(kernel) is None, kernel
    plan = kernels.select_kernels(CFG, device="Ascend", compute_dtype="bfloat16")
    assert all(c.fused for c in plan.choices())


def test_new_rms_norm_signature_falls_back_with_the_reason():
    ns = _namespace(rms_norm=rms_norm_after_2_9)
    plan = kernels.select_kernels(CFG, device="Ascend", compute_dtype="bfloat16", namespace=ns)
    assert plan.rmsnorm.impl == "reference"
    assert plan.rmsnorm.reason.startswith("version guard: ops.rms_norm('input', 'normalized_shape'")
    assert "(y, rstd)" in plan.rmsnorm.reason
    assert plan.attention.fused and plan.rope.fused and plan.swiglu.fused
    with pytest.raises(KernelError, match="version guard"):
        kernels.select_kernels(CFG, device="Ascend", compute_dtype="bfloat16", namespace=ns,
                               override={"rmsnorm": "fused"})


def test_removed_rotary_falls_back_and_the_model_builds_on_reference_rope():
    ns = _namespace(rotary_position_embedding=None)
    plan = kernels.select_kernels(CFG, device="Ascend", compute_dtype="bfloat16", namespace=ns)
    assert plan.rope.impl == "reference" and "no ops.rotary_position_embedding" in plan.rope.reason
    model = build(CFG, param_dtype="float16", device="Ascend", kernels_override={"rope": "reference"})
    assert model.model.layers[0].attention.rope_op is None   # the reference RoPE is what runs


def test_flash_attention_without_sparse_mode_falls_back():
    def fas(query, key, value, head_num, attn_mask=None, scalar_value=1.0, input_layout="BSH"):
        raise AssertionError("not called")

    plan = kernels.select_kernels(CFG, device="Ascend", compute_dtype="bfloat16",
                                  namespace=_namespace(flash_attention_score=fas))
    assert plan.attention.impl == "reference"
    assert "lacks ['sparse_mode', 'actual_seq_qlen', 'actual_seq_kvlen', 'next_tokens']" in plan.attention.reason


def test_guards_are_not_consulted_off_ascend():
    plan = kernels.select_kernels(CFG, device="CPU", compute_dtype="float16",
                                  namespace=_namespace(rms_norm=None, swiglu=None))
    assert all("version guard" not in c.reason for c in plan.choices())
