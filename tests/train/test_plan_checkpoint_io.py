"""The 13B dry run's restore, disk, save overhead, per-phase silence allowances, resumed host memory and MFU,
each recomputed here from first principles (the model's shapes from its config.json, the recipe's numbers, the
sources named in porting/train/plan/checkpoint_io.py and allowances.py), not from the planner's helpers; the bytes a
rank reads checked against what the real checkpoint reader needs (format.py ``needed``); and `port doctor --cluster`'s
disk row."""

from __future__ import annotations

import json
import math
import re

import pytest

from porting.train import format_plan, load_recipe, make_plan, plan_config
from tests.helpers import port
from tests.train.conftest import ROOT, TINY

GIB = 2 ** 30


def _plan(name: str, *sets: str):
    rec = load_recipe(ROOT / "recipes" / name, list(sets), check_files=False)
    cfg, _ = plan_config(rec)
    return rec, cfg, make_plan(rec, cfg, "runs/x")


def _hand_13b() -> dict[str, float]:
    """Llama-2-13B (meta-llama/Llama-2-13b-hf config.json: hidden 5120, intermediate 13824, 40 layers, 40 heads, no
    GQA, vocabulary 32000, untied head) on TP 8 x DP 8 (64 ranks, 4 nodes), bf16 parameters, ZeRO over the 8 DP
    ranks, fs_gib_per_s 0.3 (the recipe's default), keep_last 2, every 500 steps, HF export on."""
    h, i, L, V, tp, dp, world = 5120, 13824, 40, 32000, 8, 8, 64
    layer_local = (4 * h * h + 3 * h * i) // tp + 2 * h        # q, k, v, o, gate, up, down sliced; 2 norms whole
    p_local = V * h // tp + L * layer_local + h + V * h // tp   # embedding, layers, final norm, head
    n_full = 2 * V * h + L * (4 * h * h + 3 * h * i + 2 * h) + h
    bw = 0.3 * GIB
    read = p_local * 2 + p_local * (4 + 4 + 4) / dp             # all weights of the slice, 1/8 of master, m, v
    checkpoint = tp * p_local * (2 + 4 + 4 + 4)                 # every slice's weights, master, m, v once
    save_s = checkpoint / bw
    group = max(layer_local, V * h // tp, V * h // tp + h) * 2  # a layer's slice (the largest group) in bf16
    return {"read": read, "restore_s": world * read / bw, "checkpoint": checkpoint, "export": n_full * 2,
            "need": 3 * checkpoint + n_full * 2, "save_s": save_s, "group_s": world * group / bw,
            "connect": max(600, math.ceil(2 * save_s) + 120), "exec": max(1836, math.ceil(3 * save_s) + 600),
            "states_host": p_local * 12 / dp, "p_local": p_local}


def test_the_13b_dry_run_states_restore_disk_save_share_and_phase_allowances_a_hand_computation_gives():
    rec, cfg, plan = _plan("13b-32card.yaml")
    hand = _hand_13b()
    a = plan.allowances
    assert a.restore_read_bytes == pytest.approx(hand["read"], rel=1e-6)
    phases = {p.name: p for p in a.phases}
    assert phases["restore"].whole_s == pytest.approx(hand["restore_s"], rel=1e-4)       # 1,132 s: reads, not writes
    assert hand["read"] / (hand["checkpoint"] / 64) == pytest.approx(2.0, rel=0.02)    # 2x what a rank writes at DP 8
    d = plan.disk
    assert d.checkpoint_gib == pytest.approx(hand["checkpoint"] / GIB, abs=1e-3)
    assert d.hf_export_gib == pytest.approx(hand["export"] / GIB, abs=1e-3)
    assert d.need_gib == pytest.approx(hand["need"] / GIB, abs=1e-3) and d.peak_during == "a save"
    assert d.checkpoints_at_peak == 3 and 570e9 < hand["need"] < 575e9                 # 3 x 182 GB + 26 GB
    step = plan.estimated_step.step_s                                                 # the plan's own estimate
    so = plan.save_overhead
    assert so.steps is None and so.every_steps == 500                                 # epochs: per interval
    assert so.share == pytest.approx(hand["save_s"] / (500 * step + hand["save_s"]), abs=1e-4)
    assert 0.5 < so.share < 0.55                                                      # a save is as long as ~550 steps
    # allowances: each phase its planned silence x 3 (at least 120 s); init the plan's own connect bound + 60 s
    assert phases["compile"].allowance_s == a.compile_s == 3 * 15 * 40               # one graph, not all 5
    assert a.compile_total_s == 3 * 5 * 15 * 40
    assert phases["init"].allowance_s == max(hand["connect"], rec.cluster.cluster_time_out) + 60
    assert phases["hf_load"].planned_s == pytest.approx(hand["group_s"], rel=1e-3)
    assert phases["hf_load"].allowance_s == max(120, math.ceil(3 * hand["group_s"]))
    assert phases["restore"].allowance_s == a.restore_s == max(120, math.ceil(3 * hand["group_s"]))
    assert phases["save"].allowance_s == a.save_s == math.ceil(3 * hand["save_s"])
    assert phases["step"].allowance_s == a.step_s == math.ceil(min(max(300, 20 * step), hand["exec"] / 2))
    assert a.setup_s == max(phases["init"].allowance_s, phases["hf_load"].allowance_s) < 9000 / 4
    # the text states each figure
    text = format_plan(plan)
    assert f"restore (a resume): {hand['restore_s']:.0f} s, every rank reading {hand['read'] / GIB:.2f} GiB" in text
    assert f"disk (the run directory's filesystem): {hand['need'] / GIB:,.1f} GiB at the peak, during a save" in text
    assert f"save overhead: {hand['save_s']:.1f} s a save, {so.share:.1%} of wall time" in text
    assert re.search(rf"per phase: init {phases['init'].allowance_s} s, hf_load \d+ s, compile 1800 s, restore "
                     rf"{a.restore_s} s, save {a.save_s} s, step {a.step_s} s", text)
    back = json.loads(json.dumps(plan.to_dict()))
    assert back["disk"]["need_gib"] == d.need_gib and back["allowances"]["setup_s"] == a.setup_s


def test_a_resumed_13b_worker_holds_its_optimizer_states_on_the_host():
    rec, cfg, plan = _plan("13b-32card.yaml")
    hm, hand = plan.host_memory, _hand_13b()
    assert hm.terms_gib.restored_states_host == pytest.approx(hand["states_host"] / GIB, abs=1e-3)   # 2.27 GiB
    assert 2.2 < hm.terms_gib.restored_states_host < 2.35
    assert hm.worker_gib == pytest.approx(hm.fresh_worker_gib + hm.terms_gib.restored_states_host, abs=2e-3)
    cpu = make_plan(*(lambda r: (r, plan_config(r)[0]))(load_recipe(TINY, ["cluster.devices_per_node=2",
                                                                          "parallel.optimizer_sharding=true"])), "x")
    assert cpu.host_memory.terms_gib.restored_states_host == 0.0   # on the CPU they are the device state


def test_save_share_with_a_step_count_counts_every_save_and_the_final_one():
    rec, cfg, plan = _plan("13b-32card.yaml", "schedule.max_steps=1200")
    so, step = plan.save_overhead, plan.estimated_step.step_s
    assert so.saves == 3                                   # at 500, 1000 and the final one at 1200
    assert so.share == pytest.approx(3 * so.save_s / (1200 * step + 3 * so.save_s), abs=1e-3)


@pytest.mark.parametrize("sets", [["parallel.optimizer_sharding=true"], ["parallel.optimizer_sharding=false"]])
def test_planned_read_bytes_are_what_the_checkpoint_reader_needs(sets):
    """stories260K's real parameter list cut by the checkpoint's own layout rules (format.py ``needed``: what a rank
    holds while training, which a resume reads): within the ZeRO buckets' padding of the plan's figure."""
    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build
    from porting.train.plan import sharding
    from porting.train.plan.checkpoint_io import read_bytes
    from porting.train.run.checkpoint.format import Layout, ParamSpec, needed, piece_bytes
    from porting.train.run.checkpoint.merge import target_layout

    cfg = LlamaConfig.from_hf(ROOT / "model_zoo" / "assets" / "stories260k")
    params = tuple(ParamSpec(p.name, tuple(p.shape), None, "F32") for p in build(cfg).trainable_params())
    rec = load_recipe(TINY, sets + ["cluster.devices_per_node=4", "batching.micro_batch_size=1"], check_files=False)
    lay = target_layout(Layout(1, 1, 0, False, params, ()), rec)
    most = max(piece_bytes(lay, needed(lay, r)) for r in range(lay.world))
    pad = sum(n - sum(params[i].local_numel(1) for i in idx) for idx, n in lay.buckets) * 12
    planned = read_bytes(rec, sharding.layout_for(rec, cfg))
    assert planned - pad <= most <= planned + pad


def test_mfu_is_taken_against_the_peak_of_the_device_the_recipe_names():
    """The A2 recipe (910B) against 328 TFLOP/s, the A3 recipes (910C die) against 390, each with its source."""
    for name, peak, chip, source in (("7b-a2-8dev.yaml", 328e12, "910B", "gameofdimension/limulidae"),
                                     ("13b-32card.yaml", 390e12, "910C", "ASCEND_FACTS.md")):
        rec, cfg, plan = _plan(name)
        t = plan.throughput
        assert t.peak_tflops == peak / 1e12 and chip in t.peak_source and source in t.peak_source
        assert t.mfu == pytest.approx(round(t.tokens_per_s_per_device * t.flops_per_token / peak, 4), abs=2e-4)
    a2 = _plan("7b-a2-8dev.yaml")[2].throughput
    assert 0.78 < a2.mfu < 0.79   # 65.9% against the 910C die's peak before


def test_doctor_cluster_checks_the_run_directorys_disk(tmp_path):
    r = port("doctor", "--cluster", str(TINY), "--no-smoke", "--json", "--set", f"output_dir={tmp_path / 'runs' / 'x'}")
    row = next(c for c in json.loads(r.stdout)["checks"] if c["check"] == "disk space")
    assert row["status"] == "ok" and f"free on the filesystem of {tmp_path}" in row["detail"], row
    assert not (tmp_path / "runs").exists()                 # measured where it would be, nothing created
    r = port("doctor", "--cluster", str(ROOT / "recipes" / "13b-32card.yaml"), "--no-smoke", "--json",
             "--set", "checkpointing.keep_last=100000", "--set", f"output_dir={tmp_path / 'big'}")
    row = next(c for c in json.loads(r.stdout)["checks"] if c["check"] == "disk space")
    assert r.returncode == 1 and row["status"] == "fail" and "lower checkpointing.keep_last" in row["detail"], row
