"""The calibrated step estimate (porting/train/plan/calibrated.py): the arithmetic from measured pieces, the FLOP
scaling to another shape, the collectives from the links rung, what the dry run says, and the compute rung of
`port rehearse` writing real figures."""

from __future__ import annotations

import json
import os

import pytest

from model_zoo.errors import RecipeError
from porting.train import load_recipe, make_plan, plan_config
from porting.train.plan import calibrated, sharding
from porting.train.plan.estimates import CalibratedStep
from porting.train.plan.make import TrainPlan
from porting.train.plan.render import format_plan
from tests.train.conftest import TINY

# per micro-batch: a layer 0.1 s at micro 4 and 0.15 s at micro 8 (so 0.05 s fixed + the rest per FLOP), the ends
# 0.05 s and 0.08 s; the update 0.01 s + 1e-8 s a parameter; one graph saves 2 ms + 1 ms a layer
LAYER, ENDS = (0.10, 0.15), (0.05, 0.08)


def _points(shape, depths=(1, 4)):
    out = []
    for m, layer, ends in ((shape["micro"], LAYER[0], ENDS[0]), (2 * shape["micro"], LAYER[1], ENDS[1])):
        for n in depths:
            params = 1000 + 500 * n
            fb, up = n * layer + ends, 0.01 + 1e-8 * params
            out.append({"layers": n, "micro": m, "parameters": params, "forward_backward_s": fb, "update_s": up,
                        "fused_s": fb + up - 0.002 - 0.001 * n})
    return out


def _write(tmp_path, rec, cfg, links=None, threads=None):
    d = tmp_path / "rh"
    d.mkdir()
    shape = calibrated.shape_of(rec, cfg)
    by = {str(t): calibrated.derive(_points(shape), shape) for t in (threads or {os.cpu_count() or 1, 1})}
    (d / "calibration.json").write_text(json.dumps({"format": "port-calibration/1", "device": "cpu",
                                                    "load_avg_1min": 1.0, "shape": shape, "by_threads": by}))
    if links is not None:
        (d / "rehearse.json").write_text(json.dumps({"rungs": [{"name": "links", "status": "pass",
                                                                "links": {"measured": links}}]}))
    return calibrated.load(d)


def _recipe(*sets):
    rec = load_recipe(str(TINY), ["data.max_seq_length=64", *sets], check_files=False)
    return rec, plan_config(rec)[0]


def test_derive_splits_each_piece_into_a_fixed_time_and_a_time_per_flop():
    rec, cfg = _recipe("batching.grad_accum_steps=2")
    shape = calibrated.shape_of(rec, cfg)
    d = calibrated.derive(_points(shape), shape)
    f4, f8 = calibrated.layer_flops(shape), calibrated.layer_flops({**shape, "micro": 8})
    assert d["layer_s_per_flop"] == pytest.approx(0.05 / (f8 - f4)) and d["layer_a_s"] == pytest.approx(0.1 - 0.05 * f4 / (f8 - f4))
    assert d["update_per_param_s"] == pytest.approx(1e-8) and d["update_fixed_s"] == pytest.approx(0.01)
    assert d["fused_delta_layer_s"] == pytest.approx(-0.001) and d["fused_delta_fixed_s"] == pytest.approx(-0.002)
    # two points tilted the wrong way (noise): the piece is taken as proportional to its FLOPs
    assert calibrated._affine(0.2, 1.0, 0.1, 2.0) == (0.0, 0.2)


def test_ends_measured_at_nothing_take_the_layer_rate_and_load(tmp_path):
    """A loaded machine can time the 4-layer model so slow that the 1-layer model leaves nothing for the ends (found
    by CI: ``ends_s_per_flop`` 0.0, refused by the loader). The ends then take the layer's rate per FLOP, and the
    folder rehearse wrote loads."""
    rec, cfg = _recipe()
    shape = calibrated.shape_of(rec, cfg)
    pts = _points(shape)
    for p in pts:   # the deep model twice as slow as its layers explain: the ends extrapolate below zero
        if p["layers"] == 4:
            p["forward_backward_s"] *= 2.0
    d = calibrated.derive(pts, shape)
    assert d["ends_s_per_flop"] == d["layer_s_per_flop"] > 0 and d["ends_a_s"] == 0.0
    dd = tmp_path / "rh"
    dd.mkdir()
    (dd / "calibration.json").write_text(json.dumps({"format": "port-calibration/1", "device": "cpu",
                                                     "load_avg_1min": 1.0, "shape": shape,
                                                     "by_threads": {str(os.cpu_count() or 1): d}}))
    assert calibrated.load(dd)


def test_same_shape_is_the_measured_pieces_times_the_counts(tmp_path):
    rec, cfg = _recipe("batching.grad_accum_steps=2")
    cal = _write(tmp_path, rec, cfg)
    layout = sharding.layout_for(rec, cfg)
    e = calibrated.predict(rec, cfg, layout, cal)
    L = cfg.num_hidden_layers
    assert e.compute_s == pytest.approx(2 * (L * 0.1 + 0.05), abs=1e-4)
    assert e.memory_s == pytest.approx(0.01 + 1e-8 * layout.parameters, abs=1e-4)
    assert e.comm_s == 0 and "at this shape" in e.how
    frec, fcfg = _recipe("batching.micro_batch_size=8")   # one graph, twice the micro-batch: the measured 2x point
    flay = sharding.layout_for(frec, fcfg)
    fused = calibrated.predict(frec, fcfg, flay, cal)
    assert fused.compute_s == pytest.approx(L * 0.15 + 0.08, abs=1e-4)
    assert fused.memory_s == pytest.approx(0.01 + 1e-8 * flay.parameters - 0.002 - 0.001 * L, abs=1e-4)


def test_another_shape_follows_its_flops_from_the_fixed_time(tmp_path):
    rec, cfg = _recipe("batching.grad_accum_steps=2")
    cal = _write(tmp_path, rec, cfg)
    long, lcfg = _recipe("batching.grad_accum_steps=2", "data.max_seq_length=128")
    e = calibrated.predict(long, lcfg, sharding.layout_for(long, lcfg), cal)
    shape, lshape = calibrated.shape_of(rec, cfg), calibrated.shape_of(long, lcfg)
    h, q = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    p = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size

    def layer(micro, seq):   # 6 x parameters x tokens + 12 x tokens x seq x heads x head_dim
        t = micro * seq
        return 6 * p * t + 12 * t * seq * q

    def ends(micro, seq):
        return 6 * cfg.vocab_size * h * micro * seq

    assert calibrated.layer_flops(lshape) == layer(4, 128) and calibrated.ends_flops(shape) == ends(4, 64)
    lb = 0.05 / (layer(8, 64) - layer(4, 64))
    eb = 0.03 / (ends(8, 64) - ends(4, 64))
    want = 2 * (cfg.num_hidden_layers * (0.1 + lb * (layer(4, 128) - layer(4, 64))) + 0.05 + eb * (ends(4, 128) - ends(4, 64)))
    assert e.compute_s == pytest.approx(want, abs=1e-4)
    assert "measured at hidden 64, seq 64, micro 4 and 8" in e.how


def test_collectives_take_the_graph_mode_calls_at_their_own_size_else_the_links_rung(tmp_path):
    rec, cfg = _recipe("cluster.devices_per_node=2", "parallel.tensor_parallel=2")
    layout = sharding.layout_for(rec, cfg)
    cols = sharding.collectives(rec, cfg, layout=layout)
    assert cols and all(c.op == "AllReduce" and c.ranks == 2 for c in cols)
    # the links rung alone (PyNative): 2 ms a call, and 4 MiB in 10 ms at 1 GB/s bus -> 1.25 GB/s beyond the latency
    links = {"world AllReduce": {"ranks": 2, "ms": 10.0, "bus_gb_s": 1.0, "latency_ms": 2.0}}
    cal = _write(tmp_path, rec, cfg, links)
    e = calibrated.predict(rec, cfg, layout, cal)
    assert e.comm_s == pytest.approx(sum(c.count * 2e-3 + c.wire_bytes / 1.25e9 for c in cols), abs=1e-4)
    assert all("measured at group size 2 on cpu (PyNative calls, links rung: world AllReduce)" in s
               for s in e.comm_sources)
    assert {f.basis for f in e.comm_figures} == {"links rung"}
    # the compute rung's graph-mode calls win: 1 ms at 1 KiB, 41 ms at 4 MiB, linear between
    doc = json.loads((tmp_path / "rh" / "calibration.json").read_text())
    doc["collectives"] = {"device": "cpu", "workers": 2, "measured": {
        "AllReduce@2": {"ranks": 2, "runs": "AllReduce", "emulated": "", "points_bytes_ms": [[1024, 1.0], [4 << 20, 41.0]]}}}
    (tmp_path / "rh" / "calibration.json").write_text(json.dumps(doc))
    e = calibrated.predict(rec, cfg, layout, calibrated.load(tmp_path / "rh"))
    want = sum(c.count * (1.0 + 40.0 * (c.payload_bytes / c.count - 1024) / ((4 << 20) - 1024)) / 1e3 for c in cols)
    assert e.comm_s == pytest.approx(want, abs=1e-4)
    assert all(f.figure == "measured at group size 2 on cpu" and f.measured_ranks == 2 for f in e.comm_figures)
    assert calibrated.per_call_s([[1024, 1.0], [4 << 20, 41.0]], 10) == 1e-3   # never below the smallest call


def test_the_dry_run_says_what_is_measured_and_shows_throughput_and_mfu(tmp_path):
    rec, cfg = _recipe("batching.grad_accum_steps=2")
    cal = _write(tmp_path, rec, cfg)
    plan = make_plan(rec, cfg, str(tmp_path / "run"), calibration=cal)
    text = format_plan(plan)
    assert "estimated step (calibrated from" in text and "measured pieces" in text
    back = TrainPlan.from_dict(json.loads(json.dumps(plan.to_dict())))   # plan.json reads back, "from" and all
    assert back == plan and isinstance(back.estimated_step, CalibratedStep) and back.to_dict() == plan.to_dict()
    assert "tokens/s per device" in text and "6 N + 12 L H Q T" in text and "no peak figure" in text
    ascend = load_recipe("recipes/7b-a2-8dev.yaml", [], check_files=False)
    text = format_plan(make_plan(ascend, plan_config(ascend)[0], str(tmp_path / "a")))
    assert "peak, an estimate, not calibrated: give --calibration REHEARSAL" in text
    assert "MFU" in text and "TFLOP/s (910" in text


def test_a_folder_without_calibration_is_refused_with_what_to_run(tmp_path):
    with pytest.raises(RecipeError, match=r"no calibration.json there; run `port rehearse RECIPE --out"):
        calibrated.load(tmp_path)
    (tmp_path / "calibration.json").write_text(json.dumps({"format": "port-calibration/1", "shape": {},
                                                           "by_threads": {"2": {"layer_fb_s": "x"}}}))
    with pytest.raises(RecipeError, match="lacks one of layer_a_s"):
        calibrated.load(tmp_path)


# The compute rung's own run (its points, the pieces derived from them, the dry run reading them back) is
# checked on the tiny recipe's whole ladder (tests/test_rehearse.py
# test_tiny_recipe_ladder_passes_and_the_report_reads_it).


def test_a_node_of_workers_computes_at_the_chains_factor_and_waits_at_each_synchronising_call(tmp_path):
    """The compute rung's synchronisation chain (porting/launch/workers/collectives.py ``time_contention``): on a
    node like the recipe's (2 workers), compute takes together / alone at the longest chunk (8 / (8/3) = 3: the
    short chunk's 2.0 is not read) instead of the cores' share, and each tensor-parallel call waits ``with - together - the 1 KiB call``
    (2 ms after a 2 ms chunk, 4 ms after 8 ms: linear between, held beyond) after its share of the compute; a
    node of another size gets neither."""
    rec, cfg = _recipe("cluster.devices_per_node=2", "parallel.tensor_parallel=2", "batching.grad_accum_steps=2")
    layout = sharding.layout_for(rec, cfg)
    cal = _write(tmp_path, rec, cfg)
    plain = calibrated.predict(rec, cfg, layout, cal)
    assert plain.sync_s == 0 and plain.sync_how == ""
    doc = json.loads((tmp_path / "rh" / "calibration.json").read_text())
    threads = calibrated._threads(rec)
    doc["collectives"] = {"device": "cpu", "workers": 2, "threads": threads, "measured": {"AllReduce@2": {
        "ranks": 2, "runs": "AllReduce", "emulated": "", "points_bytes_ms": [[1024, 1.0], [4 << 20, 41.0]]}},
        "contention": {"2": {"ranks": 2, "chunks": [
            {"alone_ms": 1.0, "together_ms": 2.0, "with_ms": 5.0, "payload_bytes": 1024},
            {"alone_ms": 8.0 / 3, "together_ms": 8.0, "with_ms": 13.0, "payload_bytes": 1024}]}}}
    (tmp_path / "rh" / "calibration.json").write_text(json.dumps(doc))
    cal = calibrated.load(tmp_path / "rh")
    e = calibrated.predict(rec, cfg, layout, cal)
    share = max(1.0, threads * 2 / (os.cpu_count() or 1))
    assert e.compute_s == pytest.approx(plain.compute_s / share * 3.0, rel=1e-3)
    assert "x 3.00: a worker computing beside the node's 2 against one alone, measured" in e.how
    tp_calls = sum(f.count for f in e.comm_figures if f.group == "tp")
    chunk_ms = e.compute_s / tp_calls * 1e3

    def wait_ms(c):   # (2 ms, 2 ms) and (8 ms, 4 ms)
        return 2.0 if c <= 2 else 4.0 if c >= 8 else 2.0 + 2.0 * (c - 2) / 6
    assert tp_calls == 2 * (2 * (2 * cfg.num_hidden_layers + 1) + 3)
    assert e.sync_s == pytest.approx(tp_calls * wait_ms(chunk_ms) / 1e3, abs=1e-4)
    assert e.step_s == pytest.approx(e.compute_s + e.memory_s + e.comm_s + e.sync_s, abs=2e-4)
    text = "\n".join(calibrated.step_line(e, None))
    assert "+ synchronisation waits" in text and f"tp {tp_calls} x" in text
    other, ocfg = _recipe("cluster.devices_per_node=4", "parallel.tensor_parallel=2", "batching.grad_accum_steps=2")
    o = calibrated.predict(other, ocfg, sharding.layout_for(other, ocfg), cal)
    assert o.sync_s == 0 and "against one alone" not in o.how
