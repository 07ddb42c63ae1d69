"""The calibrated step estimate (porting/train/plan/calibrated.py): the arithmetic from measured pieces, the FLOP
scaling to another shape, the collectives from the links rung, what the dry run says, and the compute rung of
`port rehearse` writing real figures."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from model_zoo.errors import RecipeError
from porting.train import load_recipe, make_plan, plan_config
from porting.train.plan import calibrated, sharding
from porting.train.plan.render import format_plan
from tests.train.conftest import TINY

RATES = {"layer_fb_s": 0.1, "ends_fb_s": 0.05, "update_per_param_s": 1e-8, "update_fixed_s": 0.01,
         "fused_layer_s": 0.12, "fused_ends_s": 0.06}


def _write(tmp_path, rec, cfg, links=None, threads=None):
    d = tmp_path / "rh"
    d.mkdir()
    by = {str(t): dict(RATES) for t in (threads or {os.cpu_count() or 1, 1})}
    (d / "calibration.json").write_text(json.dumps({"format": "port-calibration/1", "device": "cpu",
                                                    "load_avg_1min": 1.0, "shape": calibrated.shape_of(rec, cfg),
                                                    "by_threads": by}))
    if links is not None:
        (d / "rehearse.json").write_text(json.dumps({"rungs": [{"name": "links", "status": "pass",
                                                                "links": {"measured": links}}]}))
    return calibrated.load(d)


def _recipe(*sets):
    rec = load_recipe(str(TINY), ["data.max_seq_length=64", *sets], check_files=False)
    return rec, plan_config(rec)[0]


def test_same_shape_is_the_measured_pieces_times_the_counts(tmp_path):
    rec, cfg = _recipe("batching.grad_accum_steps=2", "batching.micro_batch_size=2")
    cal = _write(tmp_path, rec, cfg)
    layout = sharding.layout_for(rec, cfg)
    e = calibrated.predict(rec, cfg, layout, cal)
    L = cfg.num_hidden_layers
    assert e["compute_s"] == pytest.approx(2 * (L * 0.1 + 0.05), abs=1e-4)
    assert e["memory_s"] == pytest.approx(0.01 + 1e-8 * layout.parameters, abs=1e-4)
    assert e["comm_s"] == 0 and "at this shape" in e["how"]
    frec, fcfg = _recipe("batching.micro_batch_size=4")
    fused = calibrated.predict(frec, fcfg, sharding.layout_for(frec, fcfg), cal)
    assert fused["compute_s"] == pytest.approx(L * 0.12 * 2 + 0.06 * 2, abs=1e-4)   # micro 4 = twice the FLOPs


def test_another_shape_is_scaled_by_its_flops(tmp_path):
    rec, cfg = _recipe("batching.grad_accum_steps=2")
    cal = _write(tmp_path, rec, cfg)
    long, lcfg = _recipe("batching.grad_accum_steps=2", "data.max_seq_length=128")
    e = calibrated.predict(long, lcfg, sharding.layout_for(long, lcfg), cal)
    h, q = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    p = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size

    def layer(seq):   # 6 x parameters x tokens + 12 x tokens x seq x heads x head_dim, micro 4
        t = 4 * seq
        return 6 * p * t + 12 * t * seq * q
    want = 2 * (cfg.num_hidden_layers * 0.1 * layer(128) / layer(64) + 0.05 * 2.0)
    assert e["compute_s"] == pytest.approx(want, abs=1e-4)
    assert "scaled by FLOPs from hidden 64, seq 64" in e["how"]


def test_collectives_take_the_graph_mode_calls_at_their_own_size_else_the_links_rung(tmp_path):
    rec, cfg = _recipe("cluster.devices_per_node=2", "parallel.tensor_parallel=2")
    layout = sharding.layout_for(rec, cfg)
    cols = sharding.collectives(rec, cfg, layout=layout)
    assert cols and all(c.op == "AllReduce" and c.ranks == 2 for c in cols)
    # the links rung alone (PyNative): 2 ms a call, and 4 MiB in 10 ms at 1 GB/s bus -> 1.25 GB/s beyond the latency
    links = {"world AllReduce": {"ranks": 2, "ms": 10.0, "bus_gb_s": 1.0, "latency_ms": 2.0}}
    cal = _write(tmp_path, rec, cfg, links)
    e = calibrated.predict(rec, cfg, layout, cal)
    assert e["comm_s"] == pytest.approx(sum(c.count * 2e-3 + c.wire_bytes / 1.25e9 for c in cols), abs=1e-4)
    assert all("measured (world AllReduce, PyNative calls)" in s for s in e["comm_sources"])
    # the compute rung's graph-mode calls win: 1 ms at 1 KiB, 41 ms at 4 MiB, linear between
    doc = json.loads((tmp_path / "rh" / "calibration.json").read_text())
    doc["collectives"] = {"AllReduce": {"ranks": 2, "points_bytes_ms": [[1024, 1.0], [4 << 20, 41.0]]}}
    (tmp_path / "rh" / "calibration.json").write_text(json.dumps(doc))
    e = calibrated.predict(rec, cfg, layout, calibrated.load(tmp_path / "rh"))
    want = sum(c.count * (1.0 + 40.0 * (c.payload_bytes / c.count - 1024) / ((4 << 20) - 1024)) / 1e3 for c in cols)
    assert e["comm_s"] == pytest.approx(want, abs=1e-4)
    assert all("measured in graph mode (AllReduce of 2" in s for s in e["comm_sources"])
    assert calibrated.per_call_s([[1024, 1.0], [4 << 20, 41.0]], 10) == 1e-3   # never below the smallest call


def test_the_dry_run_says_what_is_measured_and_shows_throughput_and_mfu(tmp_path):
    rec, cfg = _recipe("batching.grad_accum_steps=2")
    cal = _write(tmp_path, rec, cfg)
    text = format_plan(make_plan(rec, cfg, str(TINY), str(tmp_path / "run"), calibration=cal))
    assert "estimated step (calibrated from" in text and "measured pieces" in text
    assert "tokens/s per device" in text and "6 N + 12 L H Q T" in text and "no peak figure" in text
    ascend = load_recipe("recipes/7b-a2-8dev.yaml", [], check_files=False)
    text = format_plan(make_plan(ascend, plan_config(ascend)[0], "r.yaml", str(tmp_path / "a")))
    assert "peak, an estimate, not calibrated: give --calibration REHEARSAL" in text
    assert "MFU" in text and "TFLOP/s (910" in text


def test_a_folder_without_calibration_is_refused_with_what_to_run(tmp_path):
    with pytest.raises(RecipeError, match=r"no calibration.json there; run `port rehearse RECIPE --out"):
        calibrated.load(tmp_path)
    (tmp_path / "calibration.json").write_text(json.dumps({"format": "port-calibration/1", "shape": {},
                                                           "by_threads": {"2": {"layer_fb_s": "x"}}}))
    with pytest.raises(RecipeError, match="lacks one of layer_fb_s"):
        calibrated.load(tmp_path)


@pytest.mark.slow
def test_the_compute_rung_times_ports_cells_at_the_recipes_shape(tmp_path):
    """The rung's child on stories260K's shape (seq 64): one thread count (one worker), positive times, a layer
    costing more than nothing, and the dry run reading the folder back."""
    from porting.rehearse import _run
    from porting.rehearse_compute import measure

    rec, cfg = _recipe()
    status, detail, doc = measure(rec, cfg, tmp_path, 600, _run)
    assert status == "pass", detail
    (t, v), = doc["by_threads"].items()
    assert int(t) == (os.cpu_count() or 1)
    assert v["depths"]["4"]["forward_backward_s"] > v["depths"]["1"]["forward_backward_s"] > 0
    assert v["layer_parameters"] > 0 and v["update_per_param_s"] > 0
    p = subprocess.run(["python", "-m", "porting", "train", str(TINY), "--set", "data.max_seq_length=64",
                        "--dry-run", "--calibration", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "calibrated from" in p.stdout, p.stderr[-2000:]
