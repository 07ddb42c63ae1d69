"""Each collective of a plan priced with where its figure comes from (porting/train/plan/comm_price.py): measured on
groups of the recipe's own sizes and kinds, a native ReduceScatter at half an AllReduce of its payload, a size one
node does not hold extrapolated by the ring, a multi-node DP group never faster than the inter-node peak, the peak
link figure where nothing was measured; the compute pieces of a layout at another TP from its own slice; a worker's
share of the cores; and a calibration of another device refused. The calibration documents here are of the form the
compute rung writes (porting/rehearse_compute.py), their points made up: the arithmetic is what is checked."""

from __future__ import annotations

import json
import os

import pytest

from model_zoo.errors import RecipeError
from porting.rehearse_compute import group_sizes, tp_sizes
from porting.train import load_recipe, make_plan, plan_config
from porting.train.plan import calibrated, comm_price, sharding
from porting.train.plan.render import format_plan
from tests.train.conftest import ROOT, TINY
from tests.train.test_calibrated_plan import _points

ASCEND_RECIPES = ("7b-8card.yaml", "7b-a2-8dev.yaml", "13b-32card.yaml", "qwen3-14b-32die.yaml", "qwen3-8b-16die.yaml")


def _ms(nbytes: float, n: int) -> float:
    """A made-up call time: 0.02 ms a ring step plus 50 GB/s of bus bandwidth."""
    return 0.02 * (n - 1) + nbytes / 50e9 * 1e3


def _measured(device: str, sizes, kinds=("AllReduce", "ReduceScatter", "AllGather"), emulate=False) -> dict:
    out = {}
    for n in sizes:
        for k in kinds:
            runs = "AllReduce + slice" if emulate and k == "ReduceScatter" else k
            out[f"{k}@{n}"] = {"ranks": n, "runs": runs, "emulated": "stub" if runs != k else "",
                               "points_bytes_ms": [[b, _ms(b, n)] for b in (1024, 1 << 20, 16 << 20, 1 << 30)]}
    return {"device": device, "workers": max(sizes), "measured": out}


def _cal(tmp_path, rec, cfg, collectives=None, by_tp=None, device=None):
    d = tmp_path / "rh"
    d.mkdir(exist_ok=True)
    shape = calibrated.shape_of(rec, cfg)
    by = {str(t): calibrated.derive(_points(shape), shape) for t in {os.cpu_count() or 1, 1}}
    doc = {"format": "port-calibration/1", "device": device or rec.cluster.device, "load_avg_1min": 1.0,
           "shape": shape, "by_threads": by, "by_tp": by_tp or {}}
    if collectives is not None:
        doc["collectives"] = collectives
    (d / "calibration.json").write_text(json.dumps(doc))
    return calibrated.load(d)


def _recipe(path, *sets):
    rec = load_recipe(str(path), list(sets), check_files=False)
    cfg, _ = plan_config(rec)
    return rec, cfg, sharding.layout_for(rec, cfg)


@pytest.mark.parametrize("name", ASCEND_RECIPES)
def test_a_calibrated_dry_run_of_every_ascend_recipe_lists_what_was_measured_at_its_group_sizes(name, tmp_path):
    """The rehearsal of a recipe on one of its nodes times the TP and DP sizes that node holds (all of them for
    the shipped recipes: TP <= 8 and DP <= 16 on 8- and 16-device servers); every collective of such a size is
    priced from them and says so, a DP group spanning nodes no faster than the inter-node peak."""
    rec, cfg, layout = _recipe(ROOT / "recipes" / name)
    held, extrapolated = group_sizes(rec, cfg)
    assert rec.parallel.tensor_parallel in held and rec.data_parallel_size in held and rec.cluster.devices_per_node in held
    plan = make_plan(rec, cfg, str(tmp_path / "run"), calibration=_cal(tmp_path, rec, cfg, _measured("ascend", held)))
    figs = plan.estimated_step.comm_figures
    assert len(figs) == len(plan.collectives) > 0
    for c, f in zip(plan.collectives, figs):
        assert (f.op, f.group, f.ranks, f.count) == (c.op, c.group, c.ranks, c.count)
        assert f.basis == "measured" and f.measured_ranks == f.ranks, f
        assert f.figure.startswith(f"measured at group size {f.ranks} on ascend")
        if f.group == "dp" and rec.cluster.nodes > 1:
            assert f"the group spans {rec.cluster.nodes} nodes" in f.figure
            assert f.seconds >= round(c.wire_bytes / plan.links.dp_bytes_per_s, 9)
    text = format_plan(plan)
    assert f"collective figures: {len(figs)} measured" in text and "priced" in text
    # without a calibration, every figure is the peak link's, and says so
    roof = make_plan(rec, cfg, str(tmp_path / "run")).estimated_step.comm_figures
    assert {f.basis for f in roof} == {"peak"} and all(f.figure.startswith("peak link figure (") for f in roof)


def test_a_dp_group_across_nodes_is_at_least_the_inter_node_peak():
    rec, cfg, layout = _recipe(ROOT / "recipes" / "13b-32card.yaml")
    rs = next(c for c in sharding.collectives(rec, cfg, layout=layout) if c.op == "ReduceScatter")
    fast = {"collectives": {"measured": {f"ReduceScatter@{rs.ranks}": {"points_bytes_ms": [[1024, 1e-2], [1 << 30, 1e-2]]}}}}
    f = comm_price.price(rs, fast, {}, native_rs=True, nodes=4, peak=(25e9, "RoCE"))
    assert f.seconds == pytest.approx(rs.wire_bytes / 25e9, rel=1e-5) and "inter-node peak link figure (RoCE" in f.figure
    inside = comm_price.price(rs, fast, {}, native_rs=True, nodes=1, peak=(25e9, "RoCE"))
    assert inside.seconds == pytest.approx(rs.count * 1e-5, rel=1e-3)


def test_a_native_reduce_scatter_without_its_own_points_is_half_the_allreduce_of_its_payload():
    rec, cfg, layout = _recipe(ROOT / "recipes" / "7b-8card.yaml")
    rs = next(c for c in sharding.collectives(rec, cfg, layout=layout) if c.op == "ReduceScatter")
    doc = {"collectives": _measured("ascend", [rs.ranks], kinds=("AllReduce",))}
    f = comm_price.price(rs, doc, {}, native_rs=True, nodes=1, peak=None)
    per_call = rs.payload_bytes / rs.count
    assert f.basis == "half of measured AllReduce"
    assert f.seconds == pytest.approx(rs.count * 0.5 * _ms(per_call, rs.ranks) / 1e3, rel=1e-4)
    assert "(n-1)/n" in f.figure and "nccl-tests" in f.figure


def test_a_size_one_node_does_not_hold_is_extrapolated_by_the_ring():
    """A CPU recipe of 2 nodes x 2 workers: the node holds groups of 2; TP 1 x DP 4 (a layout the plan ranks) has a
    DP group of 4: its AllReduce is the 1 KiB call's time x (4-1)/(2-1) plus the rest x f(4)/f(2)."""
    rec, cfg, _ = _recipe(TINY, "cluster.nodes=2", "cluster.devices_per_node=2", "parallel.tensor_parallel=2",
                          "data.max_seq_length=64")
    assert tp_sizes(rec, cfg)[0] == 2 and group_sizes(rec, cfg) == ([2], [4])
    dp4, _, lay4 = _recipe(TINY, "cluster.nodes=2", "cluster.devices_per_node=2", "data.max_seq_length=64")
    ar = next(c for c in sharding.collectives(dp4, cfg, layout=lay4) if c.purpose.startswith("gradients"))
    doc = {"collectives": _measured("cpu", [2], kinds=("AllReduce",))}
    f = comm_price.price(ar, doc, {}, native_rs=False, nodes=2, peak=None)
    per_call = ar.payload_bytes / ar.count
    t2, fixed = _ms(per_call, 2), _ms(1024, 2)
    want = ar.count * (fixed * 3 / 1 + (t2 - fixed) * 1.5 / 1.0) / 1e3
    assert f.basis == "extrapolated" and f.measured_ranks == 2 and f.seconds == pytest.approx(want, rel=1e-4)
    assert "extrapolated from the measured at group size 2 to 4 on cpu" in f.figure and "spans 2 nodes" in f.figure


def test_the_cpus_emulated_reduce_scatter_is_priced_as_what_port_runs_and_named():
    rec, cfg, layout = _recipe(TINY, "cluster.devices_per_node=2", "parallel.optimizer_sharding=true",
                               "data.max_seq_length=64")
    grads = next(c for c in sharding.collectives(rec, cfg, layout=layout) if "flat buckets" in c.purpose)
    assert grads.op == "AllReduce" and comm_price.stands_for(grads) == "ReduceScatter"
    doc = {"collectives": _measured("cpu", [2], emulate=True)}
    f = comm_price.price(grads, doc, {}, native_rs=False, nodes=1, peak=None)
    assert f.figure == ("measured at group size 2 on cpu (ReduceScatter as port runs it there: AllReduce + slice, "
                        "emulated)")


def test_a_layout_at_another_tp_is_priced_from_its_own_slice_and_a_worker_from_its_share_of_the_cores(
        tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    rec, cfg, layout = _recipe(TINY, "cluster.devices_per_node=2", "data.max_seq_length=64",
                               "batching.grad_accum_steps=2")
    shape = {**calibrated.shape_of(rec, cfg), "tp": 2}   # TP 2's slice: its pieces 3x the TP 1 slice's times
    tp2 = {str(t): {k: v * 3 if k.endswith(("_s", "_per_flop")) else v
                    for k, v in calibrated.derive(_points(shape), shape).items()} for t in (1, 2)}
    cal = _cal(tmp_path, rec, cfg, by_tp={"2": tp2})
    one = calibrated.predict(rec, cfg, layout, cal)
    alt, _, alt_layout = _recipe(TINY, "cluster.devices_per_node=2", "data.max_seq_length=64",
                                 "batching.grad_accum_steps=2", "parallel.tensor_parallel=2")
    two = calibrated.predict(alt, cfg, alt_layout, cal)
    assert "at TP 2" in two.how and two.measured_shape["tp"] == 2
    assert two.compute_s == pytest.approx(3 * one.compute_s, rel=1e-3)   # TP 2's own pieces (3x), same FLOPs / TP
    # 4 workers of 1 thread on 2 cores: each worker's pieces x 2
    four, _, lay4 = _recipe(TINY, "cluster.devices_per_node=4", "data.max_seq_length=64", "batching.grad_accum_steps=2")
    busy = calibrated.predict(four, cfg, lay4, cal)
    assert "x 2: 4 worker threads share 2 cores" in busy.how
    assert busy.compute_s == pytest.approx(2 * one.compute_s, rel=1e-3)


def test_a_calibration_of_another_device_is_refused(tmp_path):
    rec, cfg, layout = _recipe(ROOT / "recipes" / "7b-8card.yaml")
    cal = _cal(tmp_path, rec, cfg, device="cpu")
    with pytest.raises(RecipeError, match=r"measured on cpu, the recipe runs on ascend; rehearse on the recipe's own"):
        calibrated.predict(rec, cfg, layout, cal)


def test_bad_collective_tables_are_one_line(tmp_path):
    rec, cfg, _ = _recipe(TINY, "data.max_seq_length=64")
    for bad, says in (({"measured": {"Broadcast@2": {"points_bytes_ms": [[1, 1]]}}}, "collectives.Broadcast@2: expected a kind"),
                      ({"measured": {"AllReduce@2": {"points_bytes_ms": [[1, -1]]}}}, "collectives.AllReduce@2.points_bytes_ms: found -1"),
                      ({"measured": [1]}, "collectives.measured must map")):
        with pytest.raises(RecipeError, match=says):
            _cal(tmp_path, rec, cfg, bad)


def test_the_rehearsal_says_which_group_sizes_one_node_times_and_which_it_extrapolates():
    """13B on 4 A3 nodes: one node of 16 holds groups of 2 to 16 (TP 8 and DP 8 among them); the DP 32 and 64 of
    the TP 2 and TP 1 layouts the plan also ranks are extrapolated; the TP slices timed are every one it ranks."""
    from porting.rehearse import plan_text

    text = plan_text(str(ROOT / "recipes" / "13b-32card.yaml"))
    assert ("one TP rank's slice at TP 8, 1, 2, 4), port's step cells at 1 and 4 layers; every collective kind on "
            "groups of 2, 4, 8, 16 (the node's 16 workers), groups of 32, 64 extrapolated from them by the ring") in text
