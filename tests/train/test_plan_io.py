"""The plan's I/O figures: the filesystem's write bandwidth measured as a save uses it
(porting/train/plan/fs_speed.py), and the supervisor's allowances derived from the graphs, the bytes to
restore and that bandwidth (porting/train/plan/allowances.py)."""

from __future__ import annotations

import pytest

from tests.train.conftest import ROOT


def _plan(name: str, *sets: str):
    from porting.train import load_recipe, plan_config
    from porting.train.plan import sharding

    rec = load_recipe(ROOT / "recipes" / name, list(sets), check_files=False)
    cfg, _ = plan_config(rec)
    return rec, cfg, sharding.layout_for(rec, cfg)


def test_parallel_fsynced_writes_give_a_positive_aggregate_and_leave_nothing(tmp_path):
    from porting.train.plan.fs_speed import measure_write_bandwidth

    got = measure_write_bandwidth(tmp_path, processes=2, bytes_per_process=4 << 20)
    assert got["bytes"] == 8 << 20 and got["processes"] == 2 and got["seconds"] > 0
    assert got["gib_per_s"] == pytest.approx(got["bytes"] / got["seconds"] / 2**30, rel=0.01, abs=1e-3)
    assert list(tmp_path.iterdir()) == []   # its temporary folder is gone
    with pytest.raises(ValueError):
        measure_write_bandwidth(tmp_path, processes=0)


def test_allowances_follow_the_graphs_the_restore_bytes_and_the_filesystem():
    from porting.train.plan.allowances import FLOOR_S, SLACK, allowances
    from porting.train.plan.checkpoint_io import read_bytes
    from porting.train.plan.comm import save_seconds

    rec, cfg, layout = _plan("13b-32card.yaml")
    a = allowances(rec, cfg, layout, shapes=4)
    assert a.graphs == 5   # 4 shapes + the update graph (grad_accum_steps 4)
    assert a.save_s == pytest.approx(SLACK * save_seconds(rec, layout), abs=1)
    restore = next(p for p in a.phases if p.name == "restore")
    assert restore.whole_s == pytest.approx(rec.world_size * read_bytes(rec, layout) / (rec.checkpointing.fs_gib_per_s
                                                                                        * 2**30), rel=1e-4)
    assert a.restore_s == max(FLOOR_S, round(SLACK * restore.planned_s)) and restore.planned_s < restore.whole_s / 40
    # a 4x faster filesystem shortens the save allowance 4x (above the floor)
    fast = allowances(*_plan("13b-32card.yaml", f"checkpointing.fs_gib_per_s={4 * rec.checkpointing.fs_gib_per_s}"), 4)
    assert fast.save_s == pytest.approx(max(FLOOR_S, a.save_s / 4), abs=1)
    # a measured compile replaces the assumption: one graph's silence, and all graphs before step 1
    measured = allowances(rec, cfg, layout, shapes=4, seconds_per_graph=100.0)
    assert measured.compile_s == SLACK * 100 and measured.compile_total_s == SLACK * 5 * 100
    assert measured.line_s >= FLOOR_S and "fs_gib_per_s" in measured.formula


def test_the_doctor_row_compares_the_measured_bandwidth_with_the_recipe(tmp_path):
    from porting.train import load_recipe
    from porting.train.plan.fs_speed import doctor_row
    from tests.train.conftest import TINY

    out = tmp_path / "runs" / "x"   # not there yet: measured in its nearest existing folder, nothing created
    slow = doctor_row(load_recipe(TINY, ["checkpointing.fs_gib_per_s=1000"]), out, 2 << 20)
    assert slow["status"] == "warn" and "checkpointing.fs_gib_per_s=" in slow["detail"]
    fast = doctor_row(load_recipe(TINY, ["checkpointing.fs_gib_per_s=0.000001"]), out, 2 << 20)
    assert fast["status"] == "ok" and "1 writers" in fast["detail"] and str(tmp_path) in fast["detail"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_port_doctor_cluster_measures_the_checkpoint_filesystem(tmp_path):
    import json

    from tests.helpers import port_process
    from tests.train.conftest import TINY, free_port

    r = port_process("doctor", "--cluster", str(TINY), "--json", "--set", f"cluster.master_port={free_port()}",
                     "--set", f"output_dir={tmp_path / 'runs'}", timeout=300)
    rows = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    fs = rows["checkpoint filesystem"]
    assert fs["status"] in ("ok", "warn") and "GiB/s aggregate: 1 writers" in fs["detail"], fs
    assert list(tmp_path.iterdir()) == []   # measured beside, nothing left


def test_a2_plans_are_costed_with_910b_figures():
    """Atlas 800T A2 (910B) steps are estimated with the 910B's own compute and link figures, not the 910C's,
    and the shipped A2 recipe is the fastest fitting layout they give."""
    from porting.train import format_plan, make_plan
    from porting.train.plan import roofline

    rec, cfg, layout = _plan("7b-a2-8dev.yaml")
    assert roofline.device_figures(rec) == (328e12, 1.6e12, 149e9)
    plan = make_plan(rec, cfg, "runs/x")
    assert plan.links.chip == "910B" and plan.links.tp_bytes_per_s == 149e9
    assert "roofline at the 910B peak" in format_plan(plan)
    best = [p for p in plan.proposals if p.with_margin][0]
    assert best.this_recipe, best
    a3, _, _ = _plan("7b-8card.yaml")
    assert roofline.device_figures(a3)[0] == roofline.TFLOPS_PER_DIE


@pytest.mark.parametrize("name", ["7b-8card.yaml", "7b-a2-8dev.yaml", "13b-32card.yaml"])
def test_every_shipped_ascend_recipe_is_its_plans_fastest_fitting_layout(name):
    from porting.train import make_plan

    rec, cfg, _ = _plan(name)
    plan = make_plan(rec, cfg, "runs/x")
    best = [p for p in plan.proposals if p.with_margin][0]   # 4 GiB to spare, as the recipes' comments say
    assert best.this_recipe, (name, best.set)


@pytest.mark.slow
@pytest.mark.msrun
def test_the_single_node_preflight_runs_zeros_collectives_at_the_bucket_size(tmp_path):
    """One node, ZeRO over 2 workers: the preflight's smoke test runs the run's own collectives on its groups
    (ReduceScatter and AllGather, the CPU's emulations here) at the fused bucket's size, not one small
    AllReduce, so step 1 is not the first to meet them."""
    from porting.cluster.preflight import run_train_preflight
    from porting.train import load_recipe
    from tests.train.conftest import TINY, free_port

    rec = load_recipe(TINY, ["cluster.devices_per_node=2", "parallel.optimizer_sharding=true",
                             "batching.micro_batch_size=2", "parallel.comm_fusion.allreduce_mode=size",
                             "parallel.comm_fusion.allreduce_config=4", f"cluster.master_port={free_port()}"])
    rep = run_train_preflight(rec, tmp_path / "run", 0, smoke=True)
    row = next(r for r in rep["checks"] if r["check"] == "smoke collectives")
    assert row["status"] == "ok", row
    assert {"world ReduceScatter (AllReduce + slice)", "world AllGather", "world AllReduce"} <= set(row["collectives"])
    assert "4 MiB each" in row["detail"]
