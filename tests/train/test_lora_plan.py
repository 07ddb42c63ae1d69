"""The plan of a LoRA recipe (porting/train/plan/lora.py, memory.py, roofline.py), recomputed from first principles
on Llama-3-8B's real config (meta-llama/Meta-Llama-3-8B config.json: hidden 4096, intermediate 14336, 32 layers,
8 KV heads of 128, vocabulary 128256): the adapters are what trains, the frozen base is weights only."""

from __future__ import annotations

import pytest

from model_zoo import presets
from porting.train.plan.comm import layout_shapes, parameter_numels
from porting.train.plan.memory import estimate_memory
from porting.train.plan.roofline import step_time
from porting.train.recipe.schema import validate_recipe

CFG = presets.config("llama3-8b")
GIB = float(1 << 30)


def _recipe(lora: bool, tp: int = 1, **extra):
    raw = {"model": {"source": "llama3-8b"}, "data": {"path": "x.jsonl", "max_seq_length": 4096},
           "precision": {"param_dtype": "bfloat16", "compute_dtype": "bfloat16"},
           "cluster": {"device": "ascend", "devices_per_node": 16}, "parallel": {"tensor_parallel": tp}, **extra}
    if lora:
        raw["lora"] = {"r": 16, "alpha": 32, "target_modules": "all-linear"}
    return validate_recipe(raw, check_files=False)


def test_lora_trains_the_adapters_and_the_base_is_weights_only():
    per_layer = 16 * sum(i + o for i, o in ((4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096),
                                            (4096, 14336), (4096, 14336), (14336, 4096)))
    lay = layout_shapes(_recipe(True), CFG)
    assert lay.parameters == 32 * per_layer == 41_943_040   # PEFT's count for r 16 on all-linear
    assert lay.frozen == sum(parameter_numels(CFG)) and lay.lora == (16, 7)
    lo, full = estimate_memory(CFG, _recipe(True)), estimate_memory(CFG, _recipe(False))
    assert lo.weights == pytest.approx(round((lay.frozen + lay.parameters) * 2 / GIB, 3), abs=1e-3)
    for term, per in (("gradients", 2), ("optimizer_states", 8), ("master_weights", 4), ("clip_gradients", 4)):
        assert getattr(lo, term) == pytest.approx(round(lay.parameters * per / GIB, 3), abs=1e-3), term
        assert getattr(full, term) > 100 * getattr(lo, term)
    assert lo.activations >= full.activations   # the full run's, plus each adapter's x A^T
    assert full.total - lo.total > 100   # GiB: the base's gradients, masters and AdamW states


def test_lora_tensor_parallel_split_and_step_estimate():
    one, two = layout_shapes(_recipe(True), CFG), layout_shapes(_recipe(True, tp=2), CFG)
    # column layers keep A whole and split B; row layers split A and keep B: per rank
    col = 16 * (4096 + 4096 // 2 + 4096 + 1024 // 2 + 4096 + 1024 // 2 + 4096 + 14336 // 2 + 4096 + 14336 // 2)
    row = 16 * (4096 // 2 + 4096 + 14336 // 2 + 4096)
    assert two.parameters == 32 * (col + row) and two.parameters > one.parameters / 2
    lo, full = step_time(_recipe(True), CFG), step_time(_recipe(False), CFG)
    assert lo.compute_s < 0.75 * full.compute_s and lo.step_s < full.step_s
