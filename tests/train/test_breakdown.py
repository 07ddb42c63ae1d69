"""Where a step's time goes (porting/rundir/breakdown.py, porting/train/run/step/breakdown.py): the four parts from
a kernel timeline, the wait split across ranks, the reader's bounds, and a real msrun run sampled with
MindSpore's profiler, shown by `port report` per rank."""

from __future__ import annotations

import json

import pytest

from porting.report import make_report
from porting.rundir import breakdown as bd
from porting.train.run.step.breakdown import sampled
from tests.train.conftest import FAST, TINY, free_port
from tests.helpers import port_process

MS = 1_000_000   # ns


def test_parts_of_a_timeline_add_up_and_overlap_counts_once():
    """Step 0..100 ms; one cell 10..90 ms. Compute 10..40 and 30..50 (overlap: 40 ms once), a collective
    45..70 (5 ms under compute: 20 exposed), the optimizer 70..80, then the cell idles 80..90; the host
    holds 0..10 and 90..100."""
    ks = [bd.Kernel("Default/MatMul-op0", 10 * MS, 30 * MS), bd.Kernel("Gradients/Default/MatMul-op1", 30 * MS, 20 * MS),
          bd.Kernel("Default/AllReduce-op0", 45 * MS, 25 * MS), bd.Kernel("Default/optimizer-AdamW/Adam-op0", 70 * MS, 10 * MS)]
    rec = bd.from_timeline(3, 1, "mindspore-profiler", (0, 100 * MS), [("step", 10 * MS, 90 * MS)], ks)
    assert (rec.wall_s, rec.compute_s, rec.comm_s, rec.idle_s, rec.host_s) == (0.1, 0.05, 0.02, 0.01, 0.02)
    assert rec.compute_s + rec.comm_s + rec.idle_s + rec.host_s == pytest.approx(rec.wall_s)
    assert rec.free_s == pytest.approx(0.03)
    assert rec.phases == {"backward": 0.02, "communication": 0.025, "forward": 0.03, "optimizer": 0.01}
    assert rec.collectives_s == (0.025,)


def test_clipping_after_the_backward_of_a_one_graph_step_is_the_optimizer():
    ks = [bd.Kernel("Gradients/Default/MatMul-op1", 0, 10 * MS), bd.Kernel("Default/Mul-op7", 12 * MS, 3 * MS)]
    rec = bd.from_timeline(2, 0, "mindspore-profiler", (0, 20 * MS), [("step", 0, 20 * MS)], ks)
    assert rec.phases == {"backward": 0.01, "optimizer": 0.003}


def test_marks_alone_give_compute_and_host_but_no_split():
    rec = bd.from_marks(2, 0, (0, 10 * MS), [("forward_backward", 1 * MS, 4 * MS), ("update", 5 * MS, 9 * MS)], "why")
    assert (rec.compute_s, rec.host_s, rec.comm_s, rec.idle_s) == (0.007, 0.003, None, None)
    assert rec.phases == {"forward_backward": 0.003, "update": 0.004} and rec.note == "why"


def test_the_rank_that_arrives_last_waits_least():
    """Each rank's k-th collective ends together; the shortest is the transfer, the rest is waiting."""
    a = bd.Breakdown(2, 0, "mindspore-profiler", 1.0, 0.5, 0.1, collectives_s=(0.30, 0.02))
    b = bd.Breakdown(2, 1, "mindspore-profiler", 1.0, 0.8, 0.1, collectives_s=(0.05, 0.03))
    assert bd.waits({0: a, 1: b}) == {0: 0.25, 1: 0.01}
    c = bd.Breakdown(2, 2, "mindspore-profiler", 1.0, 0.8, 0.1, collectives_s=(0.05,))
    assert bd.waits({0: a, 2: c}) == {}   # different collectives: no pairing


def test_sampling_skips_step_one_and_stops_at_the_bound():
    assert [s for s in range(1, 12) if sampled(s, 2, 11, 0)] == [2, 4, 6, 8, 10, 11]
    assert not sampled(4, 2, 11, bd.MAX_SAMPLES) and not sampled(4, 0, 11, 0)


def test_reader_skips_bad_lines_and_links_with_a_note(tmp_path):
    d = tmp_path / bd.DIR
    d.mkdir()
    good = bd.Breakdown(2, 0, "timestamps", 0.5, 0.4, 0.1).to_dict()
    (d / "rank_0.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, "wall_s": "x"}) + "\n{\n"
                                    + json.dumps({**good, "source": "guess"}) + "\n")
    (d / "rank_1.jsonl").symlink_to(d / "rank_0.jsonl")
    notes: list[str] = []
    got = bd.read(tmp_path, notes)
    assert list(got) == [0] and got[0][0].wall_s == 0.5
    assert len(notes) == 4 and "wall_s" in notes[0] and "source 'guess'" in notes[2]
    assert "rank_1.jsonl: not read" in notes[3]   # the link, never followed, said so


@pytest.mark.msrun
@pytest.mark.slow
def test_a_sampled_msrun_run_shows_each_ranks_breakdown_in_the_report(tmp_path, model_dir):
    """Two data-parallel ranks, accumulation 2 (the forward/backward cell twice, then the update cell with the
    gradient all-reduce), steps 2..4 sampled with MindSpore's profiler: every rank's parts add up to its step
    and hold a collective; `port report` has a row per rank, names the slowest and gates both shares."""
    run = tmp_path / "bd"
    sets = ["cluster.devices_per_node=2", "schedule.max_steps=4", "logging.breakdown_every=1",
            "logging.comm_sample_every=0", "checkpointing.every_steps=0", "batching.micro_batch_size=1",
            "batching.grad_accum_steps=2", f"model.source={model_dir}", f"cluster.master_port={free_port()}"]
    port_process("train", str(TINY), "--run-dir", str(run), *FAST, *[a for s in sets for a in ("--set", s)],
                 check=True, timeout=600)
    recs = bd.read(run)
    assert sorted(recs) == [0, 1]
    for rank, rows in recs.items():
        assert [r.step for r in rows] == [2, 3, 4], rows
        for r in rows:
            assert r.source == "mindspore-profiler", r.note
            assert r.compute_s + r.comm_s + r.host_s + r.idle_s == pytest.approx(r.wall_s, abs=5e-6)
            assert r.compute_s > 0 and r.comm_s > 0 and len(r.collectives_s) >= 1
            assert r.phases["forward"] > 0 and r.phases["backward"] > 0 and r.phases["optimizer"] > 0
        assert (run / bd.DIR / "profile" / f"rank_{rank}" / "step_2").is_dir()
    res = make_report(run, tmp_path / "report")
    rows = {r.item: r for r in res.rows}
    for rank in (0, 1):
        v = rows[f"step breakdown rank {rank}"].value
        assert "compute" in v and "exposed communication" in v and "host" in v and "idle" in v, v
    assert rows["slowest rank"].value.startswith("rank ")
    assert rows["exposed communication share"].status in ("pass", "warn")
    assert "MindSpeed-LLM" in rows["device free share (host + idle)"].value


def test_report_names_the_slowest_rank_and_gates_both_shares(tmp_path):
    """Rank 1 computes 80 ms where rank 0 computes 50 ms: rank 0 waits 30 ms in the all-reduce, so rank 1 is the
    slowest; exposed communication 40% and free 10% of rank 0's step are both over MindSpeed-LLM's references."""
    from porting.report.breakdown import breakdown_rows
    from porting.rundir import read_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"recipe": {}, "world_size": 2}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 1.0}) + "\n")
    for rank, comp in ((0, 50), (1, 80)):
        ks = [bd.Kernel("Default/MatMul-op0", 0, comp * MS), bd.Kernel("Default/AllReduce-op0", comp * MS, (90 - comp) * MS)]
        bd.append(run, bd.from_timeline(2, rank, "mindspore-profiler", (0, 100 * MS), [("step", 0, 95 * MS)], ks))
    rows = {r.item: r for r in breakdown_rows(read_run(run, strict=False))}
    assert "compute 0.0500 s (50.0%) + exposed communication 0.0400 s (40.0%), of which waiting for other ranks " \
           "0.0300 s" in rows["step breakdown rank 0"].value
    assert rows["slowest rank"].value.startswith("rank 1: 0.1000 s of its own")
    assert rows["exposed communication share"].status == "warn" and "40.0%" in rows["exposed communication share"].value
    free = rows["device free share (host + idle)"]
    assert free.status == "warn" and "10.0% of the step" in free.value and "MindSpeed-LLM" in free.value


def test_report_says_what_to_run_when_nothing_was_sampled(tmp_path):
    from porting.report.breakdown import breakdown_rows
    from porting.rundir import read_run

    (tmp_path / "manifest.json").write_text(json.dumps({"recipe": {}}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    (row,) = breakdown_rows(read_run(tmp_path, strict=False))
    assert row.status == "missing" and "logging.breakdown_every" in row.evidence
