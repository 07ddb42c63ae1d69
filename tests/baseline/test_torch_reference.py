"""The PyTorch reference loop on the real stories260K: its loss is HF's own loss, and gradient
accumulation is exact (micro 2 x accum 2 == micro 4 x accum 1 on the same data), because every
micro-batch is normalised by the step's total token count as `port train` does."""

from __future__ import annotations

import numpy as np
import pytest

from porting.baseline import arrays, document, runner

ROOT_RECIPE = "recipes/tiny-cpu.yaml"


def _run(tmp_path, name: str, *overrides: str, steps: int = 3) -> document.MeasuredBaseline:
    req = runner.BaselineRequest(recipe_path=ROOT_RECIPE, out=str(tmp_path / f"{name}.json"), steps=steps, threads=2,
                                 overrides=("schedule.max_steps=4",) + overrides, probe_tokens=16)
    res = runner.run(req)
    assert res.path == tmp_path / f"{name}.json"
    assert document.load(res.path) == res.document and res.losses == res.document.steps.loss
    assert res.path.read_text() == document.dumps(res.document)   # the file is the record, byte for byte
    return res.document


@pytest.fixture(scope="module")
def micro4(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("m4"), "m4")


@pytest.mark.compat   # `port baseline`'s torch loop on the oldest torch/transformers in range (scripts/compat312.sh)
def test_step_one_loss_is_hf_transformers_loss(micro4):
    import torch
    from transformers import AutoModelForCausalLM

    from porting.train.data.batching import build_plan
    from porting.train.recipe.schema import load_recipe
    from porting.tokenizer import load_tokenizer
    from porting.model_paths import resolve_hf

    recipe = load_recipe(ROOT_RECIPE, ["schedule.max_steps=4"])
    hf = resolve_hf(recipe.model.source)
    plan = build_plan(recipe, load_tokenizer(hf))
    (mb,) = plan.step(0, 0).micro_batches
    model = AutoModelForCausalLM.from_pretrained(str(hf), local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        ref = model(input_ids=torch.as_tensor(mb.input_ids).long(), labels=torch.as_tensor(mb.labels).long()).loss
    assert micro4.steps.loss[0] == pytest.approx(float(ref), rel=1e-6)
    assert micro4.steps.tokens[0] == mb.tokens


def test_accumulation_equals_bigger_micro_batch(micro4, tmp_path):
    acc = _run(tmp_path, "m2a2", "batching.micro_batch_size=2", "batching.grad_accum_steps=2")
    assert acc.settings.grad_accum_steps == 2 and acc.settings.global_batch == 4
    np.testing.assert_allclose(acc.steps.loss, micro4.steps.loss, rtol=1e-6)
    np.testing.assert_allclose(acc.steps.grad_norm, micro4.steps.grad_norm, rtol=1e-5)
    a = acc.probe.final_logits()
    b = micro4.probe.final_logits()
    assert np.abs(a - b).max() < 1e-4


def test_baseline_file_is_self_describing(micro4):
    d = micro4
    assert d.format == "port-baseline" and d.format_version == 1
    assert d.device_kind == "cpu" and d.memory.kind.startswith("host_rss")
    assert d.versions["packages"]["torch"] and d.model["weights"]["bytes"] > 0
    assert len(d.steps.loss) == 3 and all(np.isfinite(d.steps.loss))
    assert d.settings.dtype == "float32" and d.settings.data_sha256 == d.data["sha256"]
    assert d.steps.lr[0] == pytest.approx(0.5e-3)  # warm-up step 1 of 2 (porting.train.recipe.schedule)
    peaks = d.memory.peak_gib
    assert all(peaks[p] > 0.1 for p in ("forward", "backward", "optimizer"))
    assert d.timing.warmup_steps[0] == 1  # the first step is timed apart
    assert len(d.probe.input_ids[0]) == 16


@pytest.mark.slow
def test_probe_logits_at_init_match_the_port_model(micro4):
    """The probe's initial logits from torch equal the zoo's MindSpore cell on the same weights."""
    from porting.baseline.probe_logits import logits_from_hf

    ids = np.asarray(micro4.probe.input_ids)
    ms_logits = logits_from_hf(micro4.model["hf_dir"], ids)
    ref = arrays.decode(micro4.probe.logits_initial, "logits_initial")
    assert np.abs(ms_logits - ref).max() < 1e-4


@pytest.mark.compat
def test_bf16_mixed_path_runs_and_stays_near_fp32(micro4, tmp_path):
    """The autocast path a CUDA baseline uses (fp32 master, bf16 compute), exercised on the CPU."""
    doc = _run(tmp_path, "bf16", "cluster.device=ascend", "precision.compute_dtype=bfloat16", steps=1)
    assert doc.settings.dtype == "bf16-mixed" and doc.loop["dtype"] == "bf16-mixed"
    assert doc.steps.loss[0] == pytest.approx(micro4.steps.loss[0], rel=2e-2)
    assert doc.steps.loss[0] != micro4.steps.loss[0]  # it really computed in bf16


def test_profiled_steps_break_down_by_phase_and_layer_and_leave_the_steady_timing(tmp_path):
    """--breakdown-every 2 on 4 steps (warm-up 1): steps 2 and 4 run under torch.profiler; their parts add
    up, the three phases and the 5 decoder layers' forwards are there, and those steps are timed apart."""
    req = runner.BaselineRequest(recipe_path=ROOT_RECIPE, out=str(tmp_path / "bd.json"), steps=4, threads=2,
                                 overrides=("schedule.max_steps=4",), probe_tokens=16, breakdown_every=2)
    doc = runner.run(req).document
    recs = doc.breakdown
    assert [r["step"] for r in recs] == [2, 4]
    for r in recs:
        assert r["source"] == "torch-profiler" and r["comm_s"] == 0
        assert r["compute_s"] + r["host_s"] + r["idle_s"] == pytest.approx(r["wall_s"], abs=5e-6)
        assert all(r["phases"][p] > 0 for p in ("forward", "backward", "optimizer"))
        assert sorted(r["layers"], key=int) == ["0", "1", "2", "3", "4"]
        assert sum(v["forward"] for v in r["layers"].values()) <= r["phases"]["forward"] + 1e-6
    assert doc.steps.warmup == (True, True, False, True)
    assert document.problems(doc.to_dict()) == []
