"""`port bisect --baseline BASELINE RUNDIR` on real runs of recipes/tiny-cpu.yaml (stories260K): a run
given another learning rate from step 3 on is named at step 3, phase update; a run that did not keep
the state the replay needs is refused with the recipe keys to set."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from porting.cli import main
from tests.conftest import ROOT
from tests.helpers import port

pytestmark = pytest.mark.slow   # two short trainings, a resume and a baseline (~3 min on 2 cores)

SETS = ["--set", "schedule.max_steps=5", "--set", "checkpointing.every_steps=1", "--set", "checkpointing.keep_last=10"]


def _port(work: Path, *args: str) -> None:
    # in this process (tests/helpers.py `port`): the subject is the bisection, not the process; a process of its own
    # for each of the three runs imported MindSpore, torch and transformers again (7.2 of the file's ~22 CPU-s)
    p = port(*args, cwd=work)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """base.json (torch, lr 1e-3 throughout), runs/same (port, the same recipe) and runs/lr3 (port, resumed
    after step 2 with lr 3e-3: step 3's update is the first to differ, step 4's loss the first to show it)."""
    work = tmp_path_factory.mktemp("step-bisect")
    (work / "recipes").symlink_to(ROOT / "recipes")
    _port(work, "baseline", "run", "--recipe", "recipes/tiny-cpu.yaml", "--device", "cpu", "--out", "base.json",
          "--steps", "5", *SETS)
    _port(work, "train", "recipes/tiny-cpu.yaml", "--run-dir", "runs/same", *SETS)
    shutil.copytree(work / "runs" / "same", work / "runs" / "lr3")
    for p in ["checkpoints/step_3", "checkpoints/step_4", "checkpoints/step_5", "hf"]:
        shutil.rmtree(work / "runs" / "lr3" / p)
    # `--resume` refuses a recipe that differs from the checkpoint's beyond the layout keys (it could not continue
    # exactly); the run "given a different learning rate from step 3 on" is made by recording 3e-3 as the
    # checkpoint's own learning rate, as a run launched with it would have
    record = work / "runs" / "lr3" / "checkpoints" / "step_2" / "layout.json"
    doc = json.loads(record.read_text())
    doc["identity"]["recipe"]["optimizer"]["lr"] = 3e-3
    record.write_text(json.dumps(doc))
    _port(work, "train", "recipes/tiny-cpu.yaml", "--run-dir", "runs/lr3", "--resume", *SETS,
          "--set", "optimizer.lr=3e-3")
    return work


def _compare(work: Path, run: str, *extra: str, old_spelling: bool = False):
    old = os.getcwd()
    os.chdir(work)
    argv = ["compare", "base.json", run, "--bisect"] if old_spelling else ["bisect", "--baseline", "base.json", run]
    try:
        return CliRunner().invoke(main, [*argv, *extra])
    finally:
        os.chdir(old)


def test_learning_rate_changed_from_step_3_is_named_as_step_3_update(runs):
    import json

    res = _compare(runs, "runs/lr3", "--json")
    assert res.exit_code == 1, res.output[-3000:]
    rep = json.loads(res.stdout)
    assert rep["failing_steps"][0] == 4 and rep["step"] == 3
    first = rep["first_divergent"]
    assert first["phase"] == "update" and first["step"] == 3, first
    assert rep["lr"]["run"] == pytest.approx(3 * rep["lr"]["baseline"])
    # the same weights and batch on both sides: every forward and backward row agrees
    assert all(r["passed"] for r in rep["rows"] if r["phase"] in ("forward", "backward"))
    assert sum(r["phase"] == "update" for r in rep["rows"]) == 47
    assert rep["state"].endswith("checkpoints/step_2")
    text = _compare(runs, "runs/lr3").output
    assert "step 3: first divergence" in text and ">> update" in text


def test_a_run_within_tolerance_has_nothing_to_bisect(runs):
    res = _compare(runs, "runs/same")
    assert res.exit_code == 0 and "nothing to bisect" in res.output


def test_the_old_spelling_still_works_with_one_deprecation_line(runs):
    res = _compare(runs, "runs/lr3", "--json", old_spelling=True)
    assert res.exit_code == 1 and json.loads(res.stdout)["first_divergent"]["phase"] == "update"
    notes = [ln for ln in res.stderr.splitlines() if "--bisect" in ln]
    assert notes == ["note: `port compare BASELINE RUNDIR --bisect` is now `port bisect --baseline BASELINE RUNDIR`; "
                     "the old spelling will be removed in a later release"], res.stderr[-2000:]


def test_missing_checkpoint_is_refused_with_the_recipe_keys(runs, tmp_path):
    run = tmp_path / "lr3"
    shutil.copytree(runs / "runs" / "lr3", run)
    shutil.rmtree(run / "checkpoints" / "step_2")
    res = _compare(runs, str(run))
    assert res.exit_code == 2
    line = res.stderr.strip().splitlines()[-1] if res.stderr else res.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and "step_2: not in the run" in line
    assert "checkpointing.every_steps: 1" in line and "checkpointing.keep_last >= 3" in line


def test_report_shows_the_bisection(runs, tmp_path):
    """`port report --bisect`: a failing acceptance row naming step 3's update, and the per-layer error plot
    with a forward and a backward series."""
    from porting.report import make_report

    res = _compare(runs, "runs/lr3", "--json")
    (tmp_path / "bisect.json").write_text(res.stdout)
    rep = make_report(runs / "runs" / "lr3", tmp_path / "report", bisect=tmp_path / "bisect.json")
    row = next(r for r in rep.rows if r.item.startswith("bisect"))
    assert row.status == "fail" and row.value.startswith("step 3: first divergence at") and "update" in row.value
    svg = (tmp_path / "report" / "bisect.svg").read_text()
    assert svg.count('class="series"') == 2 and 'data-label="forward"' in svg and 'data-label="backward"' in svg
    assert "bisect.svg" not in (tmp_path / "report" / "report.html").read_text() or "<svg" in svg
