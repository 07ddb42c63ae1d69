"""Communication wait (porting/train/run/step/commwait.py) under real msrun workers, and the report's row for it."""

from __future__ import annotations

import json

import pytest

from porting.report import make_report
from porting.report.rows import comm_wait_row
from porting.rundir import RunRecords, StepRecord, read_run
from porting.train.run.step.commwait import sampled
from tests.train.conftest import FAST, TINY, free_port, metrics
from tests.helpers import port_process

SLOW_S = 0.6


def _row(run_dir) -> dict:
    res = make_report(run_dir, run_dir.parent / f"{run_dir.name}_report")
    return next(r for r in res.to_dict()["rows"] if r["item"] == "communication wait")


@pytest.mark.msrun
@pytest.mark.slow
def test_a_slow_rank_shows_as_the_other_rank_waiting(tmp_path, monkeypatch, model_dir):
    """Rank 1 sleeps before the timed all-reduce on every sampled step (the test-only knob): rank 0 waits
    about that long, rank 1 hardly at all, and `port report` names rank 1 as the one others wait for."""
    monkeypatch.setenv("PORT_TEST_COMM_DELAY", f"1:{SLOW_S}")
    run = tmp_path / "slow"
    sets = ["cluster.devices_per_node=2", "schedule.max_steps=3", "logging.comm_sample_every=1",
            "checkpointing.every_steps=0", "batching.micro_batch_size=2", f"model.source={model_dir}",
            f"cluster.master_port={free_port()}"]
    port_process("train", str(TINY), "--run-dir", str(run), *FAST, *[a for s in sets for a in ("--set", s)],
                 check=True, timeout=400)
    steps, _ = metrics(run)
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        w0, w1 = s["comm_wait_ranks_s"]
        assert s["comm_wait_s"] == w0
        assert w0 > 0.5 * SLOW_S and w1 < w0 - 0.3 * SLOW_S, s
    # Each rank logged its own value.
    for r in (0, 1):
        lines = [ln for ln in (run / "logs" / f"rank_{r}.log").read_text().splitlines() if "comm wait step" in ln]
        assert len(lines) == 3, lines
    row = _row(run)
    assert row["status"] == "warn", row
    assert "the others wait for rank 1" in row["value"] and "last to arrive on 3 of 3" in row["value"], row
    assert "rank 0 median 0." in row["value"] and "rank 1 median" in row["value"]


def test_sampled_steps_first_every_nth_and_last():
    assert [s for s in range(1, 26) if sampled(s, 10, 25)] == [1, 10, 20, 25]
    assert [s for s in range(1, 4) if sampled(s, 0, 3)] == [1, 3]


def _records(tmp_path, waits: list[list[float]]) -> RunRecords:
    """A run dir of two ranks whose steps carry these per-rank waits, read by the product's reader."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"recipe": {"cluster": {"nodes": 1, "devices_per_node": 2}},
                                                    "world_size": 2}))
    lines = [json.dumps({"step": i + 1, "loss": 1.0, "step_time_s": 0.1, "comm_wait_s": w[0],
                         "comm_wait_ranks_s": w}) for i, w in enumerate(waits)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return read_run(run, strict=False)


def test_row_names_the_rank_last_to_arrive_and_stays_quiet_when_balanced(tmp_path):
    run = _records(tmp_path, [[0.001, 0.2], [0.002, 0.3], [0.001, 0.25]])
    row = comm_wait_row(run, 2)
    assert row.status == "warn" and "the others wait for rank 0" in row.value
    assert "rank 1 median 0.2500 s max 0.3000 s" in row.value and "rank 0 median 0.0010 s" in row.value
    (tmp_path / "run").rename(tmp_path / "old")
    balanced = comm_wait_row(_records(tmp_path, [[0.001, 0.002], [0.002, 0.001]]), 2)
    assert balanced.status == "info" and "balanced" in balanced.value and "wait for rank" not in balanced.value


def test_row_single_process_and_missing():
    one = RunRecords(path=None, manifest=None, steps=[StepRecord(step=1, loss=1.0)], summary=None, plan=None,
                     notes=[])
    assert comm_wait_row(one, 1).value == "single process: no collectives"
    assert comm_wait_row(one, 2).status == "missing"


def test_malformed_per_rank_waits_are_a_skipped_line(tmp_path):
    from porting.rundir import read_metrics

    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"step": 1, "loss": 1.0, "comm_wait_ranks_s": ["fast", 0.1]}) + "\n"
                 + json.dumps({"step": 2, "loss": 1.0, "comm_wait_ranks_s": [0.1, 0.2]}) + "\n")
    m = read_metrics(p)
    assert m.skipped == 1 and "comm_wait_ranks_s" in m.first_skipped
    assert m.steps[0].step == 2 and m.steps[0].comm_wait_ranks_s == (0.1, 0.2)
