"""The memory plan counts what the step holds: the fused SwiGLU's [w1; w3], HCCL's
2 x HCCL_BUFFSIZE per communicator, ApplyStep's identity copy, the clip's unscaled gradients and the
ZeRO bucket buffers, each with its formula and source in the dry run."""

from __future__ import annotations

import pytest

from model_zoo import presets
from porting.train.plan import sharding
from porting.train.plan.memory import GIB, estimate_memory
from porting.train.plan.memory_terms import HCCL_DOC, TERMS, communicators
from porting.train.recipe.schema import validate_recipe
from tests.helpers import port

BF16 = {"param_dtype": "bfloat16", "compute_dtype": "bfloat16"}


def _recipe(**sections):
    raw = {"model": {"source": "llama2-13b"}, "data": {"path": "x.jsonl", "max_seq_length": 4096},
           "cluster": {"device": "ascend", "devices_per_node": 8}, "precision": dict(BF16)}
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    return validate_recipe(raw, check_files=False)


def test_swiglu_concat_is_every_layers_w1_w3_copy_in_the_compute_dtype():
    cfg = presets.config("llama2-13b")
    r = _recipe(cluster={"nodes": 8}, parallel={"tensor_parallel": 8})
    mem = estimate_memory(cfg, r)
    want = 40 * 2 * 13824 / 8 * 5120 * 2 / GIB            # the "about 1.4 GB at 13B TP 8"
    assert mem.swiglu_concat == pytest.approx(want, abs=1e-3) and 1.3e9 < want * GIB < 1.5e9
    seven = estimate_memory(presets.config("llama2-7b"), _recipe(model={"source": "llama2-7b"}))
    assert seven.swiglu_concat * GIB == pytest.approx(32 * 2 * 11008 * 4096 * 2, rel=1e-3)   # ~5.8 GB
    rc = estimate_memory(cfg, _recipe(cluster={"nodes": 8}, parallel={"tensor_parallel": 8}, memory={"recompute": True}))
    assert rc.swiglu_concat == pytest.approx(want / 40, abs=1e-3)   # only the recomputed layer's
    cpu = estimate_memory(cfg, _recipe(cluster={"device": "cpu", "nodes": 8}, parallel={"tensor_parallel": 8},
                                       precision={"param_dtype": "float32", "compute_dtype": "float32"}))
    assert cpu.swiglu_concat == 0.0                                 # the CPU runs the unfused SwiGLU


def test_hccl_buffers_count_every_communicator_the_layout_creates():
    assert communicators(1, 1) == [] and communicators(16, 1) == ["world"]
    assert communicators(8, 8) == ["world", "tensor parallel"]
    assert communicators(64, 8) == ["world", "tensor parallel", "data parallel"]
    cfg = presets.config("llama2-13b")
    mem = estimate_memory(cfg, _recipe(cluster={"nodes": 8}, parallel={"tensor_parallel": 8}))
    assert mem.hccl_buffers == pytest.approx(3 * 2 * 200 / 1024, abs=1e-3)   # 3 x 400 MB, about 1.2 GB


def test_apply_copy_clip_and_zero_buckets_follow_the_layout():
    cfg = presets.config("llama2-13b")
    r = _recipe(cluster={"nodes": 8}, parallel={"tensor_parallel": 8, "optimizer_sharding": True, "zero_stage": 1},
                batching={"micro_batch_size": 1, "grad_accum_steps": 4})
    layout = sharding.layout_for(r, cfg)
    mem = estimate_memory(cfg, r, layout=layout)
    p = layout.parameters
    assert mem.apply_copy == mem.accumulation_buffers == pytest.approx(p * 4 / GIB, abs=1e-3)
    assert mem.clip_gradients == pytest.approx(p * 4 / 8 / GIB, abs=1e-3)
    big = max(b.padded for b in layout.buckets)
    shards = sum(b.shard(8) for b in layout.buckets)
    assert mem.zero_bucket_concat == pytest.approx((big + shards) * 4 / GIB, abs=1e-3)
    assert mem.zero_allgather == pytest.approx((big * 2 + big / 8 * 4) / GIB, abs=1e-3)
    # the update's peak holds them, the forward/backward's does not (ZeRO-1 reduces in the update)
    assert mem.total == max(mem.peak_forward_backward, mem.peak_apply)
    one = estimate_memory(cfg, r.with_overrides({"batching.grad_accum_steps": 1}), layout=layout)
    assert one.apply_copy == 0.0


def test_dry_run_lists_every_term_with_formula_and_source():
    r = port("train", "recipes/13b-32card.yaml", "--dry-run")
    assert r.returncode == 0, r.stderr
    for name, (formula, source) in TERMS.items():
        line = next(x for x in r.stdout.splitlines() if x.strip().startswith(name + " "))
        assert formula in line and source in line
    assert HCCL_DOC in r.stdout and "peak forward/backward" in r.stdout and "peak update" in r.stdout


def test_qwen3_keeps_its_per_head_norm_outputs():
    """Qwen3's q/k RMSNorm outputs (RoPE's inputs) are kept for backward: (q_size + kv_size) / tp a token a
    layer more than the same shapes without the norms."""
    import dataclasses

    from model_zoo import presets
    from porting.train.plan.memory import layer_activation_bytes

    q3 = presets.config("qwen3-8b")
    plain = dataclasses.replace(q3, model_type="llama", qk_norm=False)
    extra = layer_activation_bytes(q3, 1, 4096, 2, True, tp=4) - layer_activation_bytes(plain, 1, 4096, 2, True, tp=4)
    assert extra == 4096 * (32 * 128 + 8 * 128) / 4 * 2
