"""The dry-run plan: memory estimator against real measurements, refusal with remedies, msrun commands."""

from __future__ import annotations

import dataclasses
import json

import pytest

from model_zoo import presets
from porting.train.plan.launch import msrun_commands
from porting.train.plan.make import make_plan
from porting.train.plan.memory import estimate_memory
from porting.train.recipe.schema import validate_recipe
from tests.train.conftest import ROOT, error_line
from tests.helpers import port


def _recipe(**sections):
    raw = {"model": {"source": "llama-7b"}, "data": {"path": "x.jsonl", "max_seq_length": 4096},
           "cluster": {"device": "ascend"}}
    for k, v in sections.items():
        raw.setdefault(k, {}).update(v)
    return validate_recipe(raw, check_files=False)


def test_estimator_matches_h200_measurements():
    """HF Llama-7B, bf16 params and bf16 AdamW states, seq 4096, micro 1, measured on a real H200
    (the copy port ships in porting/baseline/data)."""
    runs = json.loads((ROOT / "porting" / "baseline" / "data" / "h200_hf_llama_baseline.json").read_text())["runs"]
    cfg = presets.config("llama-7b")
    bf16 = {"param_dtype": "bfloat16", "compute_dtype": "bfloat16"}
    for r in runs:
        if r["shape"] != "llama-7b":
            continue
        m = estimate_memory(cfg, _recipe(precision=bf16, memory={"recompute": r["grad_checkpointing"]}))
        bf16_states = m.optimizer_states / 2          # the measurement keeps AdamW states in bf16
        if r["grad_checkpointing"]:
            # backward peak: weights, gradients, states, layer inputs and one recomputed layer
            est = m.weights + m.gradients + bf16_states + m.activations_recompute
            assert est == pytest.approx(r["peak_backward_gib"], rel=0.10)
        else:
            # forward peak: weights, states and every activation kept for backward (grads freed)
            est = m.weights + bf16_states + m.activations
            assert est == pytest.approx(r["peak_forward_gib"], rel=0.10)


def test_plan_global_batch_and_sharding():
    r = _recipe(batching={"micro_batch_size": 1, "grad_accum_steps": 4}, cluster={"devices_per_node": 8},
                parallel={"optimizer_sharding": True, "zero_stage": 1},
                precision={"param_dtype": "bfloat16", "compute_dtype": "bfloat16"}, memory={"recompute": True})
    plan = make_plan(r, presets.config("llama2-7b"), "runs/x")
    assert plan.global_batch == 32 and plan.world_size == 8
    mem = plan.memory_gib_by_phase
    from porting.train.plan.memory_terms import TERMS

    assert {f.name for f in dataclasses.fields(mem)} == set(TERMS) | {"peak_forward_backward", "peak_apply", "total"}
    assert mem.optimizer_states == pytest.approx(2 * 4 * 6.738e9 / 8 / 2**30, rel=0.01)
    assert mem.master_weights == pytest.approx(4 * 6.738e9 / 8 / 2**30, rel=0.01)   # fp32 masters, sharded
    assert plan.device_hbm_gib == 64 and plan.usable_hbm_gib == 58
    assert "float32 master weights" in plan.mixed_precision
    assert json.loads(json.dumps(plan.to_dict()))["memory_gib_by_phase"] == dataclasses.asdict(mem)


def test_msrun_command_per_node():
    r = _recipe(cluster={"nodes": 4, "devices_per_node": 8, "master_addr": "10.0.0.1", "master_port": 9000})
    cmds = msrun_commands(r, "runs/13b")
    assert len(cmds) == 4
    for i, c in enumerate(cmds):
        assert "--worker_num=32" in c and "--local_worker_num=8" in c and f"--node_rank={i}" in c
        assert "--master_addr=10.0.0.1" in c and "--master_port=9000" in c
        # a worker reads the run's job document, never the recipe file or --set strings (porting/job/)
        assert c.endswith("workers/train.py --run-dir runs/13b") and "--recipe" not in c and "--set" not in c


def test_dry_run_refuses_plan_that_does_not_fit_with_remedies():
    r = port("train", "recipes/7b-8card.yaml", "--dry-run", "--set", "precision.param_dtype=float32",
             "--set", "precision.compute_dtype=float32", "--set", "memory.recompute=false",
             "--set", "parallel.optimizer_sharding=false")
    assert r.returncode == 2
    line = error_line(r)
    assert "GiB per device, more than the 64 GiB" in line
    assert "memory.recompute=true" in line and "parallel.optimizer_sharding=true" in line and "(fits)" in line
    assert "DOES NOT FIT" in r.stdout


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")))
def test_every_shipped_recipe_plans_and_fits(recipe):
    """Every recipe port ships dry-runs in one go: text and JSON agree on world, batch and fit (a new recipe
    is covered by being in recipes/, with nothing to regenerate)."""
    text = port("train", f"recipes/{recipe}", "--dry-run")
    js = port("train", f"recipes/{recipe}", "--dry-run", "--json")
    assert text.returncode == 0 == js.returncode, (text.stderr[-2000:], js.stderr[-2000:])
    plan = json.loads(js.stdout)
    assert plan["fits"] and plan["margin_gib"] > 0 and plan["global_batch"] >= 1
    assert f"world size: {plan['world_size']} device" in text.stdout
    assert f"global batch: {plan['global_batch']} = " in text.stdout and "DOES NOT FIT" not in text.stdout


@pytest.mark.parametrize("name,nodes,world,tp", [("7b-8card", 1, 16, 2), ("7b-a2-8dev", 1, 8, 4),
                                                 ("13b-32card", 4, 64, 8)])
def test_shipped_910c_recipes_fit(name, nodes, world, tp):
    r = port("train", f"recipes/{name}.yaml", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    # 58 GiB usable of a 64 GiB die (MindFormers' max_device_memory), fp32 masters counted
    assert plan["fits"] and plan["memory_gib_by_phase"]["total"] <= 58 and plan["margin_gib"] > 4.0
    assert plan["memory_gib_by_phase"]["master_weights"] > 0
    # bf16 as Megatron-LM runs it: fp32 gradient accumulation and reduction, no loss scale (docs/ascend.md)
    prec = plan["precision"]
    assert prec["param_dtype"] == "bfloat16" and prec["grad_reduce_dtype"] == "float32"
    assert prec["loss_scale"]["kind"] == "none" and "reduce-scattered in float32" in plan["mixed_precision"]
    assert not [w for w in plan["warnings"] if w.startswith("precision:")]
    assert len(plan["msrun_commands"]) == nodes and plan["world_size"] == world and plan["tensor_parallel"] == tp
    assert plan["sharding"]["enabled"] and plan["sharding"]["reduce_scatter"] == "reduce_scatter"   # HCCL has it
    ops = {c["op"] for c in plan["collectives"] if c["group"] == "dp" and c["purpose"].startswith("gradients,")}
    assert ops == {"ReduceScatter"} and plan["collective_bytes"]["wire_bytes"] > 0


def test_13b_on_four_a3_servers_plans_64_dies_with_tensor_parallel_and_accumulation():
    r = port("train", "recipes/13b-32card.yaml", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "world size: 64 devices (dies) = 4 node(s) x 8 chip(s) x 2 die(s)" in out
    assert "= 8 tensor parallel x 8 data parallel (no sequence parallel)" in out
    assert "global batch: 32 = 1 micro x 4 accum x 8 DP" in out and "seq 4096" in out
    assert "ZeRO-1: gradients by ReduceScatter (HCCL)" in out and "collectives per step per rank" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("node ")]) == 4
    assert all("--worker_num=64 --local_worker_num=16" in ln for ln in out.splitlines() if ln.startswith("node "))


def test_13b_in_pure_data_parallel_is_refused_with_a_working_setting():
    """TP 1 does not fit; the refusal names the fastest (TP, DP, sharding, recompute) setting that does,
    at the same global batch, by the roofline estimate; that setting then plans as fitting."""
    r = port("train", "recipes/13b-32card.yaml", "--dry-run", "--json", "--set", "parallel.tensor_parallel=1")
    assert r.returncode == 2
    line = error_line(r)
    assert "58 GiB usable" in line and "fastest working setting (estimate): TP " in line
    plan = json.loads(r.stdout)
    best = plan["proposals"][0]
    times = [p["estimated_step_s"] for p in plan["proposals"]]
    assert times == sorted(times) and best["tensor_parallel"] > 1
    assert best["micro_batch_size"] * best["grad_accum_steps"] * best["data_parallel"] == plan["global_batch"]
    sets = [a for s in best["set"] for a in ("--set", s)]
    ok = port("train", "recipes/13b-32card.yaml", "--dry-run", "--json", *sets)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["memory_gib_by_phase"]["total"] == pytest.approx(best["memory_gib"])


def test_cluster_hardware_shape_is_derived_and_contradictions_refused():
    from model_zoo.errors import RecipeError

    a3 = _recipe(cluster={"server": "atlas-800t-a3", "nodes": 4})
    assert (a3.cluster.chips_per_node, a3.cluster.dies_per_chip, a3.cluster.devices_per_node, a3.world_size) == (8, 2, 16, 64)
    chips = _recipe(cluster={"chips_per_node": 4, "dies_per_chip": 2})
    assert chips.cluster.devices_per_node == 8
    with pytest.raises(RecipeError, match="cluster.devices_per_node: 8 contradicts cluster.server: atlas-800t-a3"):
        _recipe(cluster={"server": "atlas-800t-a3", "devices_per_node": 8})
    with pytest.raises(RecipeError, match="cluster.devices_per_node: 6 contradicts cluster.chips_per_node: 4"):
        _recipe(cluster={"chips_per_node": 4, "dies_per_chip": 2, "devices_per_node": 6})
    r = port("train", "recipes/13b-32card.yaml", "--dry-run", "--set", "cluster.devices_per_node=8")
    assert r.returncode == 2 and "cluster.devices_per_node: 8 contradicts cluster.server" in error_line(r)
    assert r.stdout == ""


def test_multi_node_run_prints_the_command_of_each_node(tmp_path):
    run = tmp_path / "mn"
    r = port("train", "recipes/tiny-cpu.yaml", "--run-dir", str(run), "--set", "cluster.nodes=2",
             "--set", "cluster.master_addr=10.1.2.3")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("node ")]
    assert len(lines) == 2 and "--node_rank=1" in lines[1] and "--master_addr=10.1.2.3" in lines[0]
    assert (run / "plan.json").is_file() and not (run / "checkpoints").exists()


def test_memory_budget_is_applied_on_ascend_only(monkeypatch):
    import mindspore as ms

    from porting.train.run.step.runtime import apply_memory_budget

    calls = []
    monkeypatch.setattr(ms.runtime, "set_memory", lambda **kw: calls.append(kw))
    assert apply_memory_budget(_recipe()) == "58GB" and calls == [{"max_size": "58GB"}]
    cpu = validate_recipe({"model": {"source": "llama-7b"}, "data": {"path": "x.jsonl"}, "cluster": {"device": "cpu"}},
                          check_files=False)
    assert apply_memory_budget(cpu) is None and len(calls) == 1


def test_no_text_calls_the_bf16_reduce_megatrons_default():
    """Megatron-LM forces fp32 accumulation and all-reduce for bf16 (megatron/training/arguments.py); the bf16
    reduce is its --grad-reduce-in-bf16 opt-in. No recipe, doc or module may say otherwise again."""
    texts = [p for d in ("recipes", "docs", "porting") for p in (ROOT / d).rglob("*") if p.suffix in (".yaml", ".md", ".py")]
    said = [str(p.relative_to(ROOT)) for p in texts + [ROOT / "README.md"]
            if "megatron's default" in p.read_text(encoding="utf-8").lower()]
    assert not said, f"these still call a precision choice Megatron's default: {said}"


def test_13b_recipe_uses_the_fastest_layout_with_margin_and_shows_the_runner_ups():
    """The shipped 13B layout is the one the step-time model ranks first among those that fit with the
    sharding margin; the dry run lists the runner-ups with step time and memory, and the link figures each
    group ran at, with their origin."""
    r = port("train", "recipes/13b-32card.yaml", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads(r.stdout)
    layouts = plan["proposals"]
    assert len(layouts) >= 3 and [p["estimated_step_s"] for p in layouts] == sorted(p["estimated_step_s"] for p in layouts)
    best = next(p for p in layouts if p["with_margin"])
    assert best["this_recipe"] and best["tensor_parallel"] == plan["tensor_parallel"]
    assert best["estimated_step_s"] == plan["estimated_step"]["step_s"]
    links = plan["links"]
    assert links["dp_spans_nodes"] and links["dp_bytes_per_s"] < links["tp_bytes_per_s"]   # RoCE between servers
    assert "RoCE" in links["inter_node"] and links["intra_node"] == "HCCS"
    text = port("train", "recipes/13b-32card.yaml", "--dry-run").stdout
    assert "layouts that fit at the same global batch, fastest first" in text and "1. (this recipe) TP 8 x DP 8" in text
    assert "at 25 GB/s, RoCE" in text and "at 200 GB/s, HCCS" in text


def test_links_follow_the_cluster_inside_a_superpod_and_when_measured():
    from porting.train.plan import roofline

    base = validate_recipe({"model": {"source": "llama2-13b"}, "data": {"path": "x.jsonl"},
                            "cluster": {"server": "atlas-800t-a3", "nodes": 4}}, "r.yaml", check_files=False)
    assert roofline.links(base).dp_bytes_per_s == 25e9
    pod = base.model_copy(update={"cluster": base.cluster.model_copy(update={"superpod": True})})
    assert roofline.links(pod).dp_bytes_per_s == 200e9
    measured = base.model_copy(update={"cluster": base.cluster.model_copy(update={"inter_node_gb_s": 40.0})})
    assert roofline.links(measured).dp_bytes_per_s == 40e9 and roofline.links(measured).inter_node == "cluster.inter_node_gb_s"
    one = base.model_copy(update={"cluster": base.cluster.model_copy(update={"nodes": 1})})
    assert roofline.links(one).dp_bytes_per_s == 200e9     # one server: DP stays on HCCS
    cfg = presets.config("llama2-13b")
    assert roofline.step_time(pod, cfg).comm_dp_s < roofline.step_time(base, cfg).comm_dp_s
