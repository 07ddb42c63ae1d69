"""`port baseline --import` on real public logs, and `port compare`'s curve gate on a real `port train` run.

The end-to-end check needs a CUDA-side log of the same batches as `port train recipes/tiny-cpu.yaml`;
no public log is of stories260K on TinyStories, so the test makes one the cheapest faithful way: the
real PyTorch + HF ``LlamaForCausalLM`` training of `port baseline` on the identical batches (all 20
steps), written as ``trainer_state.json`` by transformers' own ``TrainerState.save_to_json`` with the
rows HF ``Trainer`` logs at ``logging_steps=1`` (loss rounded to 4 digits, the learning rate read
after ``scheduler.step()``, i.e. the next step's). ``Trainer`` itself needs ``accelerate``, which the
venv does not have; its state writer does not.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from porting.baseline import compare as compare_mod, document
from porting.baseline.render import render
from porting.baseline.curve import DEFAULTS, Gate, spikes
from porting.intake import IntakeError
from porting.intake.baseline_import import Stated, import_log
from porting.intake.logs import read_log
from tests.attacks.harness import ROOT, TINY_RECIPE

LOGS = ROOT / "tests" / "fixtures" / "cuda_jobs" / "logs"


# ------------------------------------------------------------------------------------- real public logs
def test_hf_trainer_states_from_public_fine_tunes():
    c = read_log(LOGS / "luojiu_trainer_state.json")
    assert (c.fmt, len(c.step), c.logging_interval) == ("hf-trainer-state", 1742, 5)
    assert (c.step[0], c.loss[0], c.lr[0]) == (5, 1.7484, 4.999995936372264e-05)
    assert c.recovered["max_steps"] == 8712 and c.recovered["logging_steps"] == 5
    assert c.skipped == {"not a training row": 1}   # the final train_loss summary row
    w = read_log(LOGS / "whisper_ja_trainer_state.json")
    assert (len(w.step), w.logging_interval, w.step[-1], w.loss[0]) == (200, 25, 5000, 0.3048)
    assert w.skipped == {"not a training row": 6}   # 5 eval rows (eval_loss, eval_wer) + the summary


def test_llamafactory_trainer_log():
    c = read_log(LOGS / "medical_trainer_log.jsonl")
    assert (c.fmt, len(c.step), c.logging_interval, c.step[-1]) == ("llamafactory-jsonl", 675, 10, 6750)
    assert (c.loss[0], c.lr[0]) == (2.219, 1.3333333333333334e-06)
    assert c.recovered["max_steps"] == 6750


def test_tensorboard_events_written_by_tensorboardx(tmp_path):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(logdir=str(tmp_path))
    for s in range(1, 7):
        w.add_scalar("train/loss", 3.0 / s, s)
        w.add_scalar("train/learning_rate", 1e-4, s)
        w.add_scalar("train/grad_norm", 0.5, s)
        w.add_scalar("eval/loss", 9.0, s)   # not the training loss
    w.close()
    c = read_log(next(tmp_path.iterdir()))
    assert c.step == [1, 2, 3, 4, 5, 6] and c.grad_norm == [0.5] * 6
    assert c.loss == pytest.approx([3.0 / s for s in range(1, 7)], rel=1e-6)


TB = LOGS / "tensorboard"


def _protobuf_scalars(path: Path, tag: str) -> dict[int, float]:
    """The independent reading: TFRecord framing by hand, each Event parsed by the protobuf classes
    tensorboardX ships (generated from TensorBoard's event.proto); the later value of a step wins."""
    import struct

    from tensorboardX.proto import event_pb2

    raw, pos, out = path.read_bytes(), 0, {}
    while pos < len(raw):
        (n,) = struct.unpack_from("<Q", raw, pos)
        ev = event_pb2.Event.FromString(raw[pos + 12:pos + 12 + n])
        pos += 12 + n + 4
        for v in ev.summary.value:
            if v.tag == tag:
                out[ev.step] = v.simple_value
    return out


def test_public_tensorboard_file_read_as_protobuf_reads_it():
    # a real public event file (torch SummaryWriter, tensorboard-reducer's test runs; README has the source)
    f = TB / "events.out.tfevents.strict.run_1"
    with pytest.raises(IntakeError, match="no training-loss scalar; tags found: strict/foo.*--loss-tag"):
        read_log(f)
    c = read_log(f, loss_tag="strict/foo")
    want = _protobuf_scalars(f, "strict/foo")
    assert len(want) == 100 and c.step == sorted(s for s in want if s >= 1) == list(range(5, 500, 5))
    assert c.loss == [want[s] for s in c.step]   # float32 values, exactly
    assert c.skipped == {"step 0": 1} and c.logging_interval == 5 and c.recovered["loss_tag"] == "strict/foo"


def test_public_tensorboard_file_with_repeated_steps_keeps_the_later_value():
    f = TB / "events.out.tfevents.duplicate_steps.run_1"
    want = _protobuf_scalars(f, "dup_steps/foo")
    c = read_log(f, loss_tag="dup_steps/foo")
    assert c.step == list(range(1, 200)) and c.loss == [want[s] for s in c.step]
    assert c.skipped == {"repeated step (later value kept)": 10, "step 0": 1}   # steps 90..99 logged twice
    with pytest.raises(IntakeError, match="no scalar tagged 'dup_steps/baz' \\(--loss-tag\\); tags found: dup_steps/bar, dup_steps/foo"):
        read_log(f, loss_tag="dup_steps/baz")
    with pytest.raises(IntakeError, match="--loss-tag names a TensorBoard scalar"):
        read_log(LOGS / "medical_trainer_log.jsonl", loss_tag="loss")


def test_public_tensorboard_file_imports_through_the_cli(tmp_path):
    from tests.helpers import port

    out = tmp_path / "cuda.json"
    r = port("baseline", "import", str(TB / "events.out.tfevents.strict.run_1"), "--loss-tag", "strict/foo",
             "--global-batch", "8", "--out", str(out), check=True)
    doc = json.loads(out.read_text())
    assert not document.problems(doc) and doc["steps"]["step"][:2] == [5, 10] and len(doc["steps"]["loss"]) == 99
    assert doc["imported"]["format"] == "tensorboard" and doc["imported"]["recovered_settings"] == {"loss_tag": "strict/foo"}
    # the run verb has no --loss-tag (it belongs to import): click refuses it before anything runs
    r = port("baseline", "run", "--recipe", TINY_RECIPE, "--loss-tag", "x", "--out", str(tmp_path / "b.json"))
    assert r.returncode == 2 and "No such option '--loss-tag'" in r.stderr and not (tmp_path / "b.json").exists()
    # the one-verb spelling still works, with a note naming the new one
    old = tmp_path / "old.json"
    r = port("baseline", "--import", str(TB / "events.out.tfevents.strict.run_1"), "--loss-tag", "strict/foo",
             "--global-batch", "8", "--out", str(old), check=True)
    assert "note: `port baseline --import LOG` is now `port baseline import LOG`" in r.stderr
    assert json.loads(old.read_text())["steps"] == doc["steps"]


def test_imported_file_is_a_baseline_saying_what_it_lacks(tmp_path):
    out, doc = import_log(LOGS / "luojiu_trainer_state.json", tmp_path / "b.json", Stated(global_batch=32),
                          ["port", "baseline"])
    loaded = document.load(out)
    assert loaded == doc and out.read_text() == document.dumps(doc)
    imp = loaded.imported
    assert imp.format == "hf-trainer-state" and imp.logging_interval == 5
    assert "probe logits" in imp.lacks and "grad_norm" in imp.lacks and imp.contains == ("loss", "lr")
    assert loaded.settings.global_batch == 32 and loaded.settings.steps == 8710
    assert imp.recovered_settings["max_steps"] == 8712


# ------------------------------------------------------------------------------------- the gate
@pytest.fixture(scope="module")
def hf_trainer_state(tmp_path_factory) -> Path:
    """trainer_state.json of the HF/PyTorch run of tiny-cpu's 20 steps on port's batches (module docstring)."""
    from transformers.trainer_callback import TrainerState

    from porting.baseline.runner import BaselineRequest, run

    d = tmp_path_factory.mktemp("hf")
    res = run(BaselineRequest(recipe_path=str(TINY_RECIPE), out=str(d / "measured.json"), device="cpu"))
    st = res.document.steps
    state = TrainerState(global_step=len(st.step), max_steps=len(st.step), logging_steps=1, train_batch_size=4)
    lr_next = st.lr[1:] + (None,)
    for s, loss, gn, lr in zip(st.step, st.loss, st.grad_norm, lr_next):
        row = {"epoch": s / 4, "grad_norm": gn, "loss": round(loss, 4), "step": s}
        if lr is not None:
            row["learning_rate"] = lr
        state.log_history.append(row)
    state.save_to_json(str(d / "trainer_state.json"))
    return d / "trainer_state.json"


def _imported(trainer_state: Path, d: Path, global_batch: int = 4) -> Path:
    return import_log(trainer_state, d / "cuda_base.json", Stated(global_batch=global_batch, model="stories260k"),
                      ["port"])[0]


def _edit_run(run: Path, d: Path, edit) -> Path:
    """A copy of the run with its metrics.jsonl losses changed by ``edit(step, loss)``."""
    out = d / "run"
    shutil.copytree(run, out)
    m = out / "metrics.jsonl"
    lines = []
    for ln in m.read_text().splitlines():
        rec = json.loads(ln)
        if rec.get("step") is not None and rec.get("loss") is not None and rec.get("kind", "step") == "step":
            rec["loss"] = edit(rec["step"], rec["loss"])
        lines.append(json.dumps(rec))
    m.write_text("\n".join(lines) + "\n")
    return out


def test_imported_hf_log_passes_against_the_same_recipe(hf_trainer_state, tiny_cpu_run, tmp_path):
    base = _imported(hf_trainer_state, tmp_path)
    rep = compare_mod.run_compare(str(base), str(tiny_cpu_run), gate=DEFAULTS)
    assert rep.ok, rep.failures
    c = rep.curve
    assert c.points == 20 and c.run_mean_rel_diff < 1e-3
    assert "PASS" in render(rep)
    from porting.report import make_report

    make_report(tiny_cpu_run, tmp_path / "report", baseline=base)   # both curves on one plot
    svg = (tmp_path / "report" / "loss.svg").read_text()
    assert "imported hf-trainer-state" in svg and svg.count("<polyline") >= 2


def test_drift_of_one_and_a_half_percent_fails_naming_the_steps(hf_trainer_state, tiny_cpu_run, tmp_path):
    base = _imported(hf_trainer_state, tmp_path)
    run = _edit_run(tiny_cpu_run, tmp_path, lambda s, x: x * 1.015 if s >= 11 else x)
    rep = compare_mod.run_compare(str(base), str(run), gate=DEFAULTS)
    assert not rep.ok
    assert any("steps 11-20" in f for f in rep.failures), rep.failures
    assert [w.ok for w in rep.curve.windows] == [True, False]
    rows = {c.name: c for c in rep.checks}   # the gate's verdict as the one result row
    assert rows["loss windows"].value == 1 and not rows["loss windows"].passed
    assert rows["like for like"].passed and all(r.passed for n, r in rows.items() if n != "loss windows")


def test_doubled_spikes_fail_naming_the_step(hf_trainer_state, tiny_cpu_run, tmp_path):
    doc = json.loads(hf_trainer_state.read_text())
    for row in doc["log_history"]:
        if row["step"] == 8:
            row["loss"] *= 3   # one spike the CUDA run had
    spiky = tmp_path / "trainer_state.json"
    spiky.write_text(json.dumps(doc))
    base = _imported(spiky, tmp_path)
    same = _edit_run(tiny_cpu_run, tmp_path / "a", lambda s, x: x * 3 if s == 8 else x)
    rep = compare_mod.run_compare(str(base), str(same), gate=DEFAULTS)
    assert rep.ok, rep.failures   # the same spike on both sides passes
    assert rep.curve.spikes["loss"].baseline_steps == (8,)
    doubled = _edit_run(tiny_cpu_run, tmp_path / "b", lambda s, x: x * 3 if s in (8, 15) else x)
    rep = compare_mod.run_compare(str(base), str(doubled), gate=DEFAULTS)
    assert not rep.ok
    assert any("loss spikes: run 2 vs baseline 1" in f and "extra at steps 15" in f for f in rep.failures), rep.failures


def test_other_global_batch_or_schedule_is_refused(hf_trainer_state, tiny_cpu_run, tmp_path):
    from model_zoo.errors import ConfigError

    with pytest.raises(ConfigError, match="global batch differs: baseline 8 vs run 4"):
        compare_mod.run_compare(str(_imported(hf_trainer_state, tmp_path, 8)), str(tiny_cpu_run), gate=DEFAULTS)
    doc = json.loads(hf_trainer_state.read_text())
    for row in doc["log_history"]:
        row["learning_rate"] = row.get("learning_rate", 1e-3) * 2
    other = tmp_path / "o" / "trainer_state.json"
    other.parent.mkdir()
    other.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="learning-rate schedule differs at step 1"):
        compare_mod.run_compare(str(_imported(other, tmp_path / "o")), str(tiny_cpu_run), gate=DEFAULTS)


def test_spike_rule():
    flat = [1.0] * 11
    assert spikes(flat, 5) == []
    flat[5] = 1.2
    assert spikes(flat, 5) == [5]
    assert spikes([1.0, 1.01, 0.99, 1.0, 1.02, 1.03, 1.0, 0.98], Gate().spike_k) == []   # noise under 5%


def test_shipped_public_event_files_are_the_upstream_bytes():
    import hashlib
    import re

    readme = (LOGS.parent / "README.md").read_text()
    for f in ("events.out.tfevents.strict.run_1", "events.out.tfevents.duplicate_steps.run_1"):
        digest = re.search(rf"`logs/tensorboard/{re.escape(f)}`.*\| ([0-9a-f]{{64}}) \|", readme).group(1)
        assert hashlib.sha256((TB / f).read_bytes()).hexdigest() == digest, f
    assert "MIT License" in (TB / "LICENSE.tensorboard-reducer").read_text()
