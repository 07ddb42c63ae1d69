"""Fast checks of the baseline building blocks: exact arrays, the phase memory meter, the file schema."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

from model_zoo.errors import ConfigError
from porting.baseline import arrays, compare, document
from porting.baseline.memory import HostRssMeter


def test_arrays_round_trip_bit_exact():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 5, 7)).astype(np.float32)
    enc = json.loads(json.dumps(arrays.encode(a)))
    b = arrays.decode(enc, "x")
    assert b.dtype == np.float32 and b.shape == a.shape
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_arrays_decode_names_the_bad_field():
    with pytest.raises(ValueError, match="probe.logits_final"):
        arrays.decode({"dtype": "float32", "shape": [3], "b64": "AAAA"}, "probe.logits_final")
    with pytest.raises(ValueError, match="dtype 'object'"):
        arrays.decode({"dtype": "object", "shape": [1], "b64": ""}, "p")


def test_host_meter_sees_a_phase_peak_and_resets():
    m = HostRssMeter()
    if not m.per_phase:
        pytest.skip("this kernel does not allow resetting VmHWM")
    # A reset sets the peak to the RSS of that moment. The garbage collector of a long-lived test worker can
    # return memory between the reset and the allocation (CI once saw the peak rise by 0.165 GiB for a
    # 0.1875 GiB array), so it is stopped, and the peak is compared with the RSS just before the allocation.
    gc.collect()
    gc.disable()
    try:
        m.reset()
        before = m.current_gib()
        big = np.ones(48 * 2**20, dtype=np.float32)  # 192 MiB, touched
        big[::1024] = 2.0
        during = m.peak_gib()
        held = m.current_gib()
        del big
        m.reset()
        after = m.peak_gib()
    finally:
        gc.enable()
    assert during >= held and during - before > 0.17, (before, during, held)
    assert after < during - 0.15, (during, after)


def test_reader_lists_every_problem_at_once():
    bad = {"format": "other", "format_version": 9, "steps": {}}
    with pytest.raises(ConfigError) as e:
        document.from_json(bad, "b.json")
    text = str(e.value)
    assert text.startswith("b.json: not a port-baseline v1 file: ") and "\n" not in text
    assert "format is 'other'" in text and "format_version is 9" in text and "missing key 'probe'" in text


def test_settings_diff_puts_key_settings_first():
    base = document.Settings(lr=1e-3, seq_length=128, seed=0, global_batch=4, betas=(0.9, 0.95))
    run = document.Settings(lr=2e-3, seq_length=256, seed=1, global_batch=4, betas=(0.9, 0.999))
    diff = compare.settings_diff(base, run)
    assert [d.key for d in diff] == ["seq_length", "seed", "lr", "betas"]
    assert [d.key_setting for d in diff] == [True, True, False, False]
    assert diff[-1].baseline == [0.9, 0.95]   # as the file has it (a list), for the JSON and the message


def test_tolerances_are_known_per_precision():
    from porting.verify.stats import curve_tolerances

    assert curve_tolerances("float32").loss_rtol == 1e-3
    assert curve_tolerances("float32", loss_rtol=0.5).loss_rtol == 0.5
    with pytest.raises(ConfigError, match="no tolerances"):
        curve_tolerances("int8")


def test_loss_curve_fails_non_finite_steps_and_applies_the_bound(tmp_path):
    from porting.rundir import RunRecords, StepRecord

    steps = document.Steps(step=(1, 2, 3, 4), loss=(2.0, None, 1.5, 1.0), grad_norm=(1.0, 1.0, 1.0, 1.0))
    run = RunRecords(tmp_path, None, [StepRecord(1, 2.0 + 2.0e-3), StepRecord(2, 1.8),
                                      StepRecord(3, float("nan")), StepRecord(4, 1.0 + 1.2e-3)])
    tol = compare.CurveTolerances(loss_rtol=1e-3, loss_atol=1e-4, logits_atol=1.0)
    rep = compare.loss_curve(steps, run, tol)
    # step 1: 2e-3 <= 1e-4 + 2e-3 passes; step 4: 1.2e-3 > 1.1e-3 fails; null / NaN fail
    assert rep.failing_steps == (2, 3, 4) and rep.per_step[0].ok
    assert not rep.ok and rep.max_abs_diff == pytest.approx(2.0e-3)


def test_weights_fingerprint_hashes_every_file_or_takes_the_recorded_digest(tmp_path):
    import hashlib

    from porting.baseline.runner import weights_fingerprint
    from tests.conftest import EMBEDDED

    real = (EMBEDDED / "model.safetensors").read_bytes()
    digest = hashlib.sha256(real).hexdigest()
    fp = weights_fingerprint(EMBEDDED)
    assert fp["files"] == [{"name": "model.safetensors", "bytes": len(real), "sha256": digest,
                            "sha256_from": "computed"}]
    # The HF hub cache layout: the snapshot file links to blobs/<sha256>; that name is the digest.
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / digest).write_bytes(real)
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "model.safetensors").symlink_to(tmp_path / "blobs" / digest)
    cached = weights_fingerprint(tmp_path / "snap")
    assert cached["files"][0]["sha256_from"] == "hf-cache-blob" and cached["sha256"] == fp["sha256"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(real[:-1] + b"x")   # one byte changed
    assert weights_fingerprint(other)["sha256"] != fp["sha256"]


def test_run_settings_read_the_manifest_recipe_with_the_strict_schema(tmp_path):
    """The run side's settings come from its manifest's recipe, validated as `port train` validates
    recipes: the same settings as the baseline side's for the same recipe, and a bad key is one line."""
    from model_zoo.errors import RecipeError
    from porting.baseline import settings
    from porting.rundir import ModelInfo, RunManifest, RunRecords, StepRecord
    from porting.train.recipe.schema import recipe_dict, validate_recipe
    from tests.conftest import EMBEDDED

    recipe = validate_recipe({"model": {"source": "stories260k"}, "data": {"path": "d.jsonl"},
                              "batching": {"micro_batch_size": 2, "grad_accum_steps": 3},
                              "cluster": {"devices_per_node": 4}, "parallel": {"tensor_parallel": 2}},
                             check_files=False)
    cfg = json.loads((EMBEDDED / "config.json").read_text())
    model = settings.model_info(cfg)
    steps = [StepRecord(1, 2.0)]
    run = RunRecords(tmp_path, RunManifest(recipe_dict(recipe), ModelInfo(config=cfg), data={"sha256": "ab"}), steps)
    got = compare.run_settings(run)
    assert got == settings.from_recipe(recipe, "ab", model, 1)
    # 4 devices, 2 tensor-parallel: 2 data-parallel ranks hold different micro-batches
    assert got.global_batch == 2 * 3 * 2 and got.world_size == 4 and got.dtype == "float32"
    bad = recipe_dict(recipe)
    bad["optimizer"]["lr_typo"] = 1.0
    run = RunRecords(tmp_path, RunManifest(bad, ModelInfo(config=cfg)), steps)
    with pytest.raises(RecipeError, match=r"manifest.json: recipe.*optimizer.lr_typo") as e:
        compare.run_settings(run)
    assert "\n" not in str(e.value)
