"""The run-directory format (porting.rundir, docs/rundir.md): writer -> reader round trip, the reading
rules (last record per step, malformed lines skipped and counted, bounds), a real `port train` run
directory read back, its HF export's conversion manifest, and a damaged state.json on --resume."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from porting import rundir as rd
from porting.train.run.checkpoint.save import TrainState
from tests.train.conftest import FAST, TINY, error_line
from tests.helpers import port


def _manifest(**kw) -> rd.RunManifest:
    base = dict(recipe={"seed": 0, "model": {"source": "stories260k"}},
                model=rd.ModelInfo(source="stories260k", dir="/m", config={"hidden_size": 64}, parameters=260032),
                versions={"python": "3.11"}, doctor={"checks": []}, data={"sha256": "ab" * 32}, seed=0,
                world_size=1, command=("port", "train", "r.yaml"), started="2026-12-01T00:00:00+00:00",
                extra={"written_by_a_later_version": [1, 2]})
    return rd.RunManifest(**{**base, **kw})


def _steps(n: int, loss0: float = 3.0) -> list[rd.StepRecord]:
    return [rd.StepRecord(step=i, loss=loss0 / i, epoch=0, lr=1e-3, grad_norm=0.5, tokens=100, loss_tokens=96,
                          padded_tokens=128, tokens_per_s=1000.0, step_time_s=0.1, padding_fraction=0.2,
                          compile=i == 1, shapes=(64,), loss_scale=1.0, host_rss_gib=1.5,
                          extra={"hook_field": i}) for i in range(1, n + 1)]


def test_writer_then_reader_round_trips_every_record(tmp_path):
    m = _manifest()
    rd.write_manifest(tmp_path, m)
    w = rd.MetricsWriter(tmp_path)
    for s in _steps(3):
        w.step(s)
    summary = rd.SummaryRecord(steps=3, compile_steps=1, compile_time_s=0.5, steady_tokens_per_s=900.0,
                               final_loss=1.0, extra={"later": True})
    w.summary(summary)
    w.close()
    run = rd.read_run(tmp_path)
    assert run.manifest == m and run.steps == _steps(3) and run.summary == summary and run.notes == []
    assert json.loads((tmp_path / "manifest.json").read_text())["format_version"] == rd.FORMAT_VERSION
    last = (tmp_path / "metrics.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["event"] == "summary" and json.loads(last)["format_version"] == rd.FORMAT_VERSION
    assert run.last_step == 3


def test_duplicate_steps_keep_the_last_record_and_resume_keeps_steps_to_the_checkpoint(tmp_path):
    w = rd.MetricsWriter(tmp_path)
    for s in _steps(5):
        w.step(s)
    w.close()
    # a resume from step 3 rewrites 4 and 5; the writer keeps 1..3 and the reader sees each step once
    w = rd.MetricsWriter(tmp_path, keep_through_step=3)
    for s in _steps(5, loss0=7.0)[3:]:
        w.step(s)
    w.close()
    m = rd.read_metrics(tmp_path / "metrics.jsonl")
    assert [s.step for s in m.steps] == [1, 2, 3, 4, 5] and m.duplicates == 0
    assert m.steps[2].loss == 1.0 and m.steps[4].loss == 7.0 / 5
    # a duplicate left by a writer that appended: the last record of the step wins, counted
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "loss": 42.0}) + "\n")
    m = rd.read_metrics(tmp_path / "metrics.jsonl")
    assert [s.step for s in m.steps] == [1, 2, 3, 4, 5] and m.steps[1].loss == 42.0 and m.duplicates == 1
    # a fresh run (no resume) starts an empty file
    rd.MetricsWriter(tmp_path).close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_malformed_lines_are_skipped_and_counted_with_the_first_named(tmp_path):
    p = tmp_path / "metrics.jsonl"
    good = [json.dumps(s.to_dict()) for s in _steps(3)]
    text = "\n".join([good[0], '{"step": "2", "loss": 1.0}', good[1], "[1, 2]", good[2]]) + "\n"
    p.write_bytes(text.encode() + b"\xff\xfe\n" + b'{"step": 9, "x": "' + b"x" * (2 << 20) + b'"}\n'
                  + b'{"step": 4, "lo')
    m = rd.read_metrics(p)
    assert [s.step for s in m.steps] == [1, 2, 3]
    assert m.skipped == 5, m.first_skipped
    assert m.first_skipped.startswith("line 2: key 'step' is str \"2\", expected an integer")
    assert m.warning.startswith(f"{p}: 5 malformed line(s) skipped (first: line 2:")
    run_dir = tmp_path
    rd.write_manifest(run_dir, _manifest())
    assert any("5 malformed line(s)" in n for n in rd.read_run(run_dir).notes)


def test_manifest_defects_are_one_line_errors(tmp_path):
    p = tmp_path / "manifest.json"
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_steps(1)[0].to_dict()) + "\n")
    cases = [
        ("[" * 100_000 + "]" * 100_000, "nests deeper than 64 levels"),
        (json.dumps({**_manifest().to_dict(), "format_version": 99}), "format_version 99 is not one this port reads"),
        (json.dumps({**_manifest().to_dict(), "world_size": "2"}), "key 'world_size' is str \"2\", expected an integer"),
        (json.dumps({**_manifest().to_dict(), "model": {"config": [1]}}), "model: key 'config' is list"),
        (json.dumps({"versions": {}}), "expected a 'recipe' object"),
        ("{oops", "invalid JSON at line 1 column 2"),
    ]
    for text, needle in cases:
        p.write_text(text)
        with pytest.raises(rd.RunDirError) as e:
            rd.read_run(tmp_path)
        assert needle in str(e.value) and str(e.value).startswith(str(p)) and "\n" not in str(e.value), str(e.value)
        # the report's tolerant read turns the same defect into a note naming the file
        assert any(n.startswith("manifest.json: ") and needle in n for n in rd.read_run(tmp_path, strict=False).notes)
    p.write_text(json.dumps({"recipe": {}}))   # written before format_version existed: read as version 1
    assert rd.read_run(tmp_path).manifest.format_version == 1


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """A real `port train` run: the tiny recipe, 4 steps, a checkpoint every 2, with the HF export."""
    run = tmp_path_factory.mktemp("rundir") / "run"
    port("train", str(TINY), "--run-dir", str(run), *FAST, "--set", "schedule.max_steps=4",
         "--set", "checkpointing.every_steps=2", "--set", "checkpointing.export_hf=true", check=True)
    return run


@pytest.mark.slow
def test_a_real_port_train_run_directory_reads_back(real_run):
    run = rd.read_run(real_run)
    assert [s.step for s in run.steps] == [1, 2, 3, 4] and run.notes == []
    assert all(s.loss is not None and np.isfinite(s.loss) and s.tokens > 0 and s.shapes == (64,) for s in run.steps)
    assert not any(s.compile for s in run.steps) and run.summary.precompile_s > 0   # compiled before step 1
    assert run.summary is not None and run.summary.steps == 4 and run.summary.final_loss == run.steps[-1].loss
    m = run.manifest
    assert m.format_version == rd.FORMAT_VERSION and m.world_size == 1 and m.model.source == "stories260k"
    assert m.model.config["hidden_size"] == 64 and m.recipe["schedule"]["max_steps"] == 4 and m.resumed_from_step is None
    assert run.plan is not None and run.plan["global_batch"] == 4
    # written by the one writer: every line is a record the reader takes
    lines = (real_run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 5 and rd.read_metrics(real_run / "metrics.jsonl").skipped == 0


@pytest.mark.slow
def test_hf_export_is_a_conversion_with_the_converters_manifest(real_run):
    """The export went through converters.ms_to_hf: port_manifest.json with the name map and every
    tensor's sha256, which matches the bytes in model.safetensors."""
    from safetensors.numpy import load_file

    from converters import names

    hf = real_run / "hf"
    man = json.loads((hf / "port_manifest.json").read_text())
    assert man["tool"] == "port convert" and man["direction"] == "ms->hf" and man["model_type"] == "llama"
    assert man["name_map"] == {v: k for k, v in names.NAME_MAPS["llama"].items()}
    assert man["output"]["files"] == ["model.safetensors"]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(man["output"]["companion_files"])
    src = man["source"]["files"][0]
    # the source is the final per-rank checkpoint's weights, assembled offline (porting/train/run/checkpoint/merge.py)
    from porting.train.run.checkpoint.merge import write_weights

    staged = real_run.parent / "staged.safetensors"
    write_weights(real_run / "checkpoints" / "step_4", staged)
    assert src["sha256"] == hashlib.sha256(staged.read_bytes()).hexdigest()
    weights = load_file(str(hf / "model.safetensors"))
    assert {t["name"] for t in man["tensors"]} == set(weights)
    for t in man["tensors"]:
        assert hashlib.sha256(weights[t["name"]].tobytes()).hexdigest() == t["sha256"], t["name"]
    assert not [p for p in real_run.iterdir() if p.name.startswith(".")]            # no staging left


@pytest.mark.parametrize("state,needle", [
    ({"adam_t": "x"}, "key 'adam_t' is str x, expected an integer in [0, 1000000000]"),
    ("[1, 2]", "expected a JSON object at the top level"),
])
@pytest.mark.slow
def test_damaged_state_json_on_resume_is_one_line_naming_file_and_key(real_run, tmp_path, state, needle):
    run = tmp_path / "run"
    shutil.copytree(real_run, run)
    sj = run / "checkpoints" / "step_4" / "state.json"
    doc = json.loads(sj.read_text())
    sj.write_text(json.dumps({**doc, **state}) if isinstance(state, dict) else state)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "logs" not in p.parts and p.name != "plan.json"}
    r = port("train", str(TINY), "--run-dir", str(run), *FAST, "--set", "schedule.max_steps=6",
             "--set", "checkpointing.every_steps=2", "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = error_line(r)
    assert line.startswith("error: ") and f"{sj}: " in line and needle in line and "delete" in line, line
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "logs" not in p.parts and p.name != "plan.json"}
    assert set(after) >= set(before) and all(after[p] == before[p] for p in before if p.name != "manifest_resume_4.json")


def test_train_state_checks_every_key(tmp_path):
    good = TrainState(adam_t=3, loss_scale=4.0, good_steps=1, next_step=3, world_size=1, seed=0, step=3).to_dict()
    p = tmp_path / "state.json"
    p.write_text(json.dumps(good))
    assert TrainState.read(p).next_step == 3
    from model_zoo.errors import CheckpointError

    for bad, needle in [({"next_step": -1}, "'next_step' is int -1"), ({"loss_scale": 5}, "'loss_scale' is int"),
                        ({"loss_scale": {"scale": float("inf"), "good": 0}}, "'loss_scale.scale' is inf"),
                        ({"loss_scale": {"scale": 1.0, "good": "0"}}, "'loss_scale.good' is str"),
                        ({"shards": 0}, "'shards' is int 0"), ({"world_size": None}, "'world_size' is NoneType")]:
        p.write_text(json.dumps({**good, **bad}))
        with pytest.raises(CheckpointError) as e:
            TrainState.read(p)
        assert str(e.value).startswith(f"{p}: key ") and needle in str(e.value), str(e.value)
    p.write_text(json.dumps({k: v for k, v in good.items() if k != "adam_t"}))
    with pytest.raises(CheckpointError, match="key 'adam_t' is missing"):
        TrainState.read(p)
