"""The baseline file and `port compare`'s result as typed records (porting/baseline/document.py, comparison.py).

Round trips: every baseline file the repository ships and every kind the tests write (a `port baseline run`, the
public logs `port baseline import` reads, the report tests' fixture) is read through the record and written out
again byte for byte, so a file written before still loads and means the same; a comparison written as JSON reads
back into the record that prints the same table. The reader names every bad key in one line, keeps unknown keys,
and `port report` shows a comparison's verdict (and an invalid one as failed, never as a pass).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model_zoo.errors import ConfigError, PortingError
from porting.baseline import comparison, compare, curve, document
from porting.baseline.render import render
from porting.intake.baseline_import import Stated, import_log
from porting.rundir import RunRecords, StepRecord
from porting.verify.stats import curve_tolerances
from tests.train.conftest import tiny_plan

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "baselines"
LOGS = ROOT / "tests" / "fixtures" / "cuda_jobs" / "logs"
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__"}


def _round_trip(path: Path) -> document.Baseline:
    rec = document.load(path)
    assert document.dumps(rec) == path.read_text(), f"{path}: not written back byte for byte"
    return rec


def test_files_an_earlier_port_wrote_load_and_write_back_byte_for_byte():
    measured = _round_trip(FIX / "measured_tiny_cpu.json")
    assert isinstance(measured, document.MeasuredBaseline)
    assert measured.steps.step == (1, 2, 3) and measured.settings.dtype == "float32" and measured.probe.after_step == 3
    assert measured.probe.final_logits().shape == (1, 2, 512) and measured.recipe["model"]["source"] == "stories260k"
    imported = _round_trip(FIX / "imported_tensorboard.json")
    assert isinstance(imported, document.ImportedBaseline)
    assert imported.imported.format == "tensorboard" and imported.settings.global_batch == 8
    assert imported.imported.logging_interval == 5 and imported.probe.input_ids is None


def _shipped_baselines() -> list[Path]:
    out = []
    for p in ROOT.rglob("*.json"):
        if SKIP_DIRS.isdisjoint(p.relative_to(ROOT).parts) and b'"port-baseline"' in p.read_bytes()[:200]:
            out.append(p)
    return sorted(out)


def test_every_baseline_file_the_repository_ships_round_trips():
    shipped = _shipped_baselines()
    assert {FIX / "measured_tiny_cpu.json", FIX / "imported_tensorboard.json"} <= set(shipped)
    for p in shipped:
        _round_trip(p)
    # The H200 measurements in porting/baseline/data are another format (the memory estimator's reference tables,
    # with their own README): `port compare` refuses them in one line instead of reading them as a baseline.
    h200 = sorted((ROOT / "porting" / "baseline" / "data").glob("*.json"))
    assert len(h200) == 2
    for p in h200:
        with pytest.raises(ConfigError, match="not a port-baseline v1 file: format is None") as e:
            document.load(p)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("log, stated, tag", [
    ("luojiu_trainer_state.json", Stated(global_batch=32), None),
    ("whisper_ja_trainer_state.json", Stated(global_batch=8, seq_length=128, dtype="bf16-mixed", model="stories260k"),
     None),
    ("medical_trainer_log.jsonl", Stated(), None),
    ("tensorboard/events.out.tfevents.duplicate_steps.run_1", Stated(global_batch=4), "dup_steps/foo"),
])
def test_imported_public_logs_are_written_as_the_reader_reads_them(tmp_path, log, stated, tag):
    path, rec = import_log(LOGS / log, tmp_path / "b.json", stated, ["port", "baseline", "import"], tag)
    assert _round_trip(path) == rec


def test_the_report_tests_baseline_round_trips(tmp_path):
    from tests.report.test_report import write_baseline

    rec = _round_trip(write_baseline(tmp_path / "b.json", [3.0, 2.5, 2.0]))
    assert rec.steps.loss == (3.0, 2.5, 2.0)


def test_unknown_keys_are_kept_and_written_back_where_they_were():
    doc = json.loads((FIX / "measured_tiny_cpu.json").read_text())
    doc["steps"]["phase_time_s"] = {"forward": [0.1, 0.1, 0.1]}   # a key a later port adds (a per-phase breakdown)
    doc["probe"]["later_key"] = 1
    doc["later"] = {"x": [1, 2]}
    text = json.dumps(doc, indent=1) + "\n"
    rec = document.from_json(json.loads(text), "b.json")
    assert rec.steps.extra == {"phase_time_s": {"forward": [0.1, 0.1, 0.1]}} and rec.probe.extra == {"later_key": 1}
    assert rec.extra == {"later": {"x": [1, 2]}}
    assert document.dumps(rec) == text


def test_every_bad_key_is_named_in_one_line():
    doc = json.loads((FIX / "measured_tiny_cpu.json").read_text())
    doc["settings"]["dtype"] = 1
    doc["settings"]["betas"] = [0.9, "b"]
    doc["timing"]["steady_tokens_per_s"] = "fast"
    doc["memory"]["peak_gib"] = [1.0]
    doc["steps"]["lr"][2] = "x"
    doc["steps"]["tokens"][0] = -1
    del doc["settings"]["seed"]
    with pytest.raises(ConfigError) as e:
        document.from_json(doc, "b.json")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("b.json: not a port-baseline v1 file: ")
    for want in ("settings.dtype is '1', expected a string or null", "settings.betas[1] is 'b', expected a number",
                 "timing.steady_tokens_per_s is 'fast', expected a number >= 0 or null",
                 "memory.peak_gib is '[1.0]', expected an object or null",
                 "steps.lr[2] is 'x', expected a number or null",
                 "steps.tokens[0] is '-1', expected a whole number >= 0 or null", "missing settings.seed",
                 "re-create it with `port baseline`"):
        assert want in msg, (want, msg)


def test_the_writer_refuses_a_record_its_reader_would_not_read(tmp_path):
    rec = document.load(FIX / "measured_tiny_cpu.json")
    import dataclasses

    bad = dataclasses.replace(rec, steps=dataclasses.replace(rec.steps, loss=(1.0,)))   # 1 loss for 3 steps
    with pytest.raises(RuntimeError, match="steps.loss must be a list of 3 values"):
        document.save(tmp_path / "b.json", bad)
    assert not (tmp_path / "b.json").exists()


# ----------------------------------------------------------------------------------- the comparison
def _run(tmp_path: Path, losses: list[float | None]) -> RunRecords:
    return RunRecords(tmp_path, None, [StepRecord(s, loss, grad_norm=1.0, tokens=100, step_time_s=0.1,
                                                  host_rss_peak_gib=0.5) for s, loss in enumerate(losses, 1)],
                      plan=tiny_plan().to_dict())


def _measured(tmp_path: Path, nudge: float) -> comparison.Comparison:
    base = document.load(FIX / "measured_tiny_cpu.json")
    losses = [x + (nudge if s == 3 else 0.0) for s, x in enumerate(base.steps.loss, 1)]
    logits = base.probe.final_logits() + np.float32(1e-3)
    tol = curve_tolerances("float32", max_memory_ratio=2.0)
    return compare.compare(base, "base.json", _run(tmp_path, losses + [None]), base.settings, tol,
                           lambda: (logits, "checkpoints/step_3"))


def _json_round_trip(rep: comparison.AnyComparison) -> comparison.AnyComparison:
    text = json.dumps(rep.to_dict(), indent=1)
    back = comparison.from_json(json.loads(text), "cmp.json")
    assert json.dumps(back.to_dict(), indent=1) == text and render(back) == render(rep)
    assert type(back) is type(rep) and back.checks == rep.checks
    return back


def test_a_comparison_reads_back_from_its_json(tmp_path):
    ok = _json_round_trip(_measured(tmp_path, 0.0))
    assert ok.ok and ok.probe.available and ok.probe.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert [c.name for c in ok.checks] == ["settings like for like", "loss per step", "probe logits", "memory"]
    assert ok.estimator["measured_kind"] == "host_rss_hwm" and ok.loss.steps_compared == 3
    # the field's gates (issue 49): no evaluation loss, and no manifest to count the run's devices: N/A
    assert [r.status for r in ok.field.rows] == ["PASS", "PASS", "N/A", "N/A"]
    bad = _json_round_trip(_measured(tmp_path, 0.1))
    assert not bad.ok and bad.loss.failing_steps == (3,) and bad.failures[0] == "loss outside tolerance at steps [3]"
    # 0.1 on one of three losses: 2.2% of the summed loss fails the 2% loss-weighted gate; the 5% mean gate passes
    assert bad.failures[1].startswith("loss-weighted per-step relative error 2.2") and len(bad.failures) == 2


def test_a_curve_comparison_reads_back_from_its_json(tmp_path):
    log = tmp_path / "log.csv"
    losses = [2.0 / (1 + 0.05 * s) for s in range(1, 31)]
    log.write_text("step,loss\n" + "".join(f"{s},{x}\n" for s, x in enumerate(losses, 1)))
    _, base = import_log(log, tmp_path / "cuda.json", Stated(global_batch=4), ["port"])
    run_losses = [x * (1.03 if s > 20 else 1.0) for s, x in enumerate(losses, 1)]
    rep = curve.compare_imported(base, "cuda.json", _run(tmp_path, run_losses),
                                 document.Settings(global_batch=4), curve.DEFAULTS)
    back = _json_round_trip(rep)
    assert not back.ok and [w.ok for w in back.curve.windows] == [True, True, False]
    assert back.per_point[-1].rel_diff == pytest.approx(0.03) and back.tokens is None


def test_port_report_shows_the_verdict_and_an_invalid_comparison_as_failed(tmp_path):
    from porting.report import make_report
    from tests.report.test_report import write_run

    run = write_run(tmp_path / "run")
    failing = _measured(tmp_path, 0.1).to_dict()
    (run / "compare.json").write_text(json.dumps(failing))
    res = make_report(run)
    (row,) = [r for r in res.rows if r.item == "baseline comparison (port compare)"]
    assert row.status == "fail" and "loss per step steps failing 1 (tolerance 0) FAIL" in row.value
    assert row.evidence == str(run / "compare.json")
    failing["checks"][1]["passed"] = "true"   # a string is not a verdict: invalid, never a pass
    (run / "compare.json").write_text(json.dumps(failing))
    (row,) = [r for r in make_report(run, force=True).rows if r.item == "baseline comparison (port compare)"]
    assert row.status == "fail" and row.value.startswith("invalid compare.json: ")
    assert "check row field 'passed' is 'true', expected bool" in row.value
    with pytest.raises(PortingError, match="cmp.json: not a port-compare v1 file: missing key 'estimator'.*--out") as e:
        (tmp_path / "cmp.json").write_text(json.dumps({"format": "port-compare", "format_version": 1}))
        make_report(run, tmp_path / "rep", compare=tmp_path / "cmp.json")
    assert "\n" not in str(e.value) and not (tmp_path / "rep").exists()
