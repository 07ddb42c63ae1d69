"""Non-finite steps under real msrun workers on the CPU (2 workers, data parallel): a NaN injected on one rank
(the PORT_TEST_NONFINITE test hook, porting/train/run/faults.py) reaches every rank through the gradient
all-reduce, so every rank skips the same step; within the cap the run finishes, past it an unsupervised run
stops with the reason in one line, and a supervised run rolls back once, skipping the window's data, then
stops with the diagnosis when it recurs. The model is one layer of stories260K (tests/conftest.py model_dir)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from porting.rundir import ranklog
from tests.helpers import port, port_process
from tests.train.conftest import TINY, error_line, free_port, metrics

pytestmark = [pytest.mark.msrun, pytest.mark.slow]

COMMON = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "batching.micro_batch_size=1",
          "checkpointing.export_hf=false", "cluster.devices_per_node=2", "optimizer.lr=1e-4"]


def _train(run, model_dir, extra: list[str], hook: str, *flags: str):
    sets = [a for s in [*COMMON, f"model.source={model_dir}", f"cluster.master_port={free_port()}", *extra]
            for a in ("--set", s)]
    return port_process("train", str(TINY), "--run-dir", str(run), *sets, *flags, env={"PORT_TEST_NONFINITE": hook}, timeout=900)


def test_a_nan_on_one_rank_is_skipped_by_every_rank_and_the_run_finishes(tmp_path, model_dir):
    from porting.train.run.checkpoint.save import TrainState
    from porting.train.run.checkpoint.read import full_state

    run = tmp_path / "once"
    r = _train(run, model_dir, ["schedule.max_steps=4", "checkpointing.every_steps=1", "checkpointing.keep_last=10"], "3@1")
    assert r.returncode == 0, r.stderr[-3000:]
    steps, summary = metrics(run)
    assert summary is not None and [s.get("skip_reason") for s in steps] == [None, None, "nonfinite", None]
    assert math.isnan(steps[2]["grad_norm"]) and not math.isnan(steps[2]["loss"])   # rank 1's gradients only
    for rank in (0, 1):   # rank 0 got the NaN through the all-reduce and skipped the same step
        lines = ranklog.read_steps((run / "logs" / f"rank_{rank}.log").read_text())
        assert [s.skipped for s in lines] == [False, False, True, False], lines
        assert len({s.graphs for s in lines}) == 1 and not any(s.compile for s in lines), lines   # the hook's step
        # ran the graph every other step ran: the NaN is a value fed in, not a change to the compiled step
    a, b, c = (full_state(run / "checkpoints" / f"step_{n}") for n in (2, 3, 4))
    assert any(k.startswith("adam_v.") for k in a)
    assert all(np.array_equal(a[k], b[k]) for k in a)      # weights and AdamW moments untouched by step 3
    assert not all(np.array_equal(b[k], c[k]) for k in b)
    assert TrainState.read(run / "checkpoints" / "step_3" / "state.json").adam_t == 2   # no AdamW step either


def test_nan_every_step_stops_an_unsupervised_run_past_the_cap_with_the_reason(tmp_path, model_dir):
    # PyNative: the cap and the stop are the subject, not the mode (the first test runs the compiled step); two
    # workers op by op cost about 3 CPU-s less than compiling (12.4 against 15.7 for 3 steps)
    r = _train(tmp_path / "every", model_dir, ["schedule.max_steps=6", "nonfinite.max_consecutive_skips=2",
                                               "execution=pynative"], "*")
    assert r.returncode != 0
    line = error_line(r)
    assert "msrun exited with" in line and "3 non-finite steps in a row (steps 1..3)" in line, line
    assert "nonfinite.max_consecutive_skips is 2" in line
    assert not (tmp_path / "every" / "incidents.jsonl").exists()


def test_nan_every_step_rolls_a_supervised_run_back_once_then_stops_with_the_diagnosis(tmp_path, model_dir):
    run = tmp_path / "sup"
    # PyNative, as above: the rollback, the relaunch and the diagnosis are the subject
    r = _train(run, model_dir, ["schedule.max_steps=10", "checkpointing.every_steps=2", "nonfinite.max_consecutive_skips=2",
                                "execution=pynative"],
               "3-", "--supervise", "--max-restarts", "5")
    assert r.returncode != 0
    line = error_line(r)
    assert "supervised run stopped after incident 2 (diverged at step 8)" in line, r.stderr[-3000:]
    assert "non-finite steps in a row (steps 6..8)" in line
    incidents = [json.loads(ln) for ln in (run / "incidents.jsonl").read_text().splitlines()]
    assert [i["kind"] for i in incidents] == ["diverged", "diverged"]
    first, second = incidents
    assert first["skip_window"] == [3, 5] and first["resumed_from"] == 4, first
    assert first["action"].startswith("rolled back to step 4") and "steps 3..5" in first["action"]
    assert second["skip_window"] == [6, 8] and second["action"].startswith("stopped: non-finite steps again")
    steps, _ = metrics(run)   # the relaunch skipped step 5's data (the window), then 6 and 7 went non-finite
    reasons = {s["step"]: s.get("skip_reason") for s in steps}
    assert reasons == {1: None, 2: None, 3: "nonfinite", 4: "nonfinite", 5: "data window", 6: "nonfinite",
                       7: "nonfinite"}, reasons
    manifest = json.loads((run / "manifest_resume_4.json").read_text())
    assert manifest["recipe"]["nonfinite"]["skip_steps"] == [[3, 5]]      # the window is in the run's records
    rep = port("report", str(run))
    assert rep.returncode == 0 and "incident 1: diverged" in rep.stdout and "incident 2: diverged" in rep.stdout
    md = (run / "report" / "report.md").read_text()   # the full rows (the terminal table cuts long values)
    assert "skipping the data of steps 3..5" in md and "non-finite steps again after the rollback (steps 6..8)" in md
    assert "5 skipped (1 data window, 4 nonfinite)" in md, md
