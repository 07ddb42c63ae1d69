"""port's gradient buckets (issue 48) under real msrun workers, counted where they run.

DP 2 on stories260K's first layer (tests/conftest.py ``model_dir``, 11 gradients), 20 steps, at two comm_fusion
settings (off: 11 buckets; size 0.1: 5 buckets) in graph mode and in PyNative; tests/train/test_msrun.py adds the
third size (size 1 and auto: 1 bucket) in both modes through its own launches. In graph mode the gradient
AllReduces are read from the compiled step graph's IR (the AllReduces in the scope of the step's ``reducer``,
MS_DEV_SAVE_GRAPHS); in
PyNative from each rank's collective trace (PORT_TEST_COLLECTIVE_TRACE, porting/train/run/step/probes.py). Each
must be the plan's buckets, in the plan's order, once a step. The losses must equal the path before port owned
its buckets (MindSpore's gradient reducer, recorded on commit 1828555: tests/train/fixtures/dp2_losses.json, made
by tests/train/record_dp2_losses.py) within 1e-6. The whole suite runs with the retiring static-graph parallel
API refused (tests/conftest.py): every rank's start line says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import port_process
from tests.train.conftest import TINY, free_port, graph_buckets, metrics, plan_of, traced_steps
from tests.train.record_dp2_losses import SETTINGS, STEPS

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((ROOT / "tests/train/fixtures/dp2_losses.json").read_text())
FUSION = {"off": ["parallel.comm_fusion.enabled=false"],
          "size": ["parallel.comm_fusion.allreduce_mode=size", "parallel.comm_fusion.allreduce_config=0.1"]}
REFUSED = "test probe: static-graph parallel API refused (PORT_TEST_REFUSE_STATIC_PARALLEL)"
def dp2_args(model_dir, mode: str, extra: list[str]) -> list[str]:
    sets = SETTINGS + [f"model.source={model_dir}", f"execution={mode}", f"cluster.master_port={free_port()}", *extra]
    return [a for s in sets for a in ("--set", s)]


# PyNative's overlap also in the compatibility tier (MindSpore 2.7.2, scripts/compat.sh): its in-place all_reduce
# once left a one-gradient bucket unreduced there and nowhere else (porting/train/run/step/buckets.py _launch)
@pytest.fixture(scope="module", params=["graph", pytest.param("pynative", marks=pytest.mark.compat)])
def runs(request, tmp_path_factory, model_dir):
    """Both comm_fusion settings' runs of one execution mode: {(mode, fusion): (folder, the plan's buckets)}."""
    out = {}
    # the compatibility tiers (`-m compat`) run the one-gradient buckets only, the case the 2.7.2 bug concerned: two
    # 20-step PyNative launches on MindSpore's spinning default pipeline were 190 CPU-s of a tier's 240 s
    fusions = ["off"] if request.config.getoption("markexpr") == "compat" else list(FUSION)
    for mode, fusion in ((request.param, f) for f in fusions):
        run = tmp_path_factory.mktemp(f"cf_{mode}_{fusion}")
        args = dp2_args(model_dir, mode, FUSION[fusion])
        env = {"PORT_TEST_COLLECTIVE_TRACE": str(run / "trace")} if mode == "pynative" else {
            # only the graph-build dumps this test reads: every pass's dump was 542 MB and doubled a run's CPU
            "MS_DEV_SAVE_GRAPHS": "1", "MS_DEV_DUMP_IR_PASSES": "graph_build", "MS_DEV_SAVE_GRAPHS_PATH": str(run / "ir")}
        port_process("train", str(TINY), "--run-dir", str(run / "run"), *args, env=env, check=True, timeout=600)
        out[mode, fusion] = (run, plan_of(args))
    return out


@pytest.mark.msrun
@pytest.mark.slow
def test_one_collective_per_planned_bucket_and_the_losses_of_the_reducer(runs):
    counts, (mode, _) = {}, next(iter(runs))
    for fusion in [f for m, f in runs if m == mode]:
        run, plan = runs[mode, fusion]
        want = plan["bucket_numels"]
        assert plan["allreduce_ops"] == len(want) and plan["gradients"] == 11, plan
        if mode == "graph":
            assert graph_buckets(run / "ir") == want, (graph_buckets(run / "ir"), want)
        else:
            steps = traced_steps(run / "trace" / "rank_0.jsonl", len(want))
            assert len(steps) == STEPS
            for step in steps:
                # each bucket's all-reduce launched during the backward, in the plan's order, before the step
                # sums its loss and tokens (which it does once the backward has returned)
                assert step == [("all_reduce", n) for n in want] + [("AllReduce", 0)] * 2, step
        counts[fusion] = len(want)
        losses = [s["loss"] for s in metrics(run / "run")[0]]
        ref = REFERENCE["losses"][mode]
        assert len(losses) == STEPS == len(ref)
        assert max(abs(a - b) for a, b in zip(losses, ref)) <= 1e-6, (losses, ref)
        for r in (0, 1):
            log = (run / "run" / "logs" / f"rank_{r}.log").read_text()
            assert REFUSED in log and f"data parallel 2: {len(want)} gradient bucket(s) of 11 gradients" in log
            assert ("launched during the backward" in log) == (mode == "pynative")
    assert counts == {f: {"off": 11, "size": 5}[f] for f in counts} and "off" in counts, counts


def test_no_static_graph_parallel_api_in_port_or_the_model_zoo():
    """The retiring API (MindSpore 2.11's sunset: docs/versions.md) named nowhere in porting/ or model_zoo/."""
    names = ("set_auto_parallel_context", "DistributedGradReducer", "get_auto_parallel_context")
    hits = [f"{p.relative_to(ROOT)}: {n}" for d in ("porting", "model_zoo") for p in sorted((ROOT / d).rglob("*"))
            if p.is_file() and p.suffix in (".py", ".yaml", ".json", ".md", ".txt")
            for n in names if n in p.read_text(errors="replace")]
    assert not hits, hits


def test_the_refusal_raises_outside_mindspore_and_says_why():
    """The suite's refusal (on here: tests/conftest.py) raises for a caller outside MindSpore, naming the API."""
    import mindspore as ms
    from mindspore import nn

    from porting.train.run.step import probes

    probes.refuse_static_parallel()
    assert nn.DistributedGradReducer.port_refused and ms.context.set_auto_parallel_context.port_refused
    with pytest.raises(probes.StaticParallelCalled, match="retires static-graph distributed parallel after 2.11"):
        ms.set_auto_parallel_context(parallel_mode="data_parallel")
    with pytest.raises(probes.StaticParallelCalled, match="was built"):
        nn.DistributedGradReducer([], mean=False)
    assert probes.installed().startswith("; test probe: static-graph parallel API refused")
    assert ms.get_auto_parallel_context("parallel_mode") == "stand_alone"   # the getter is left alone


def test_buckets_follow_the_backward_and_keep_comm_fusions_meaning():
    """porting/train/plan/comm.py: the last parameter first; off one per gradient; index splits after the
    parameters named (parameter order); size closes a bucket at the gradient that crosses N x 256 KiB, that
    gradient inside; every parameter in exactly one bucket."""
    from porting.train.plan import comm
    from porting.train.recipe.schema import CommFusionSection as CF

    unit = comm.THRESHOLD_UNIT_BYTES
    sizes = [unit // 2, unit // 4, unit, unit // 4, unit // 4]   # bytes of parameters 0..4
    assert comm.gradient_buckets(sizes, CF(enabled=False)) == [[4], [3], [2], [1], [0]]
    assert comm.gradient_buckets(sizes, CF(allreduce_mode="index", allreduce_config=[1, 3])) == [[4], [3, 2], [1, 0]]
    # from the end: 4 + 3 (0.5 units), then 2 takes it past 1 unit and closes it; then 1, 0 (0.75 units)
    assert comm.gradient_buckets(sizes, CF(allreduce_mode="size", allreduce_config=1)) == [[4, 3, 2], [1, 0]]
    assert comm.gradient_buckets(sizes, CF(allreduce_mode="size", allreduce_config=0.3)) == [[4, 3], [2], [1, 0]]
    assert comm.gradient_buckets(sizes, CF()) == [[4, 3, 2, 1, 0]]   # auto: 64 units
    numels = [s // 4 for s in sizes]
    for cf in (CF(enabled=False), CF(allreduce_mode="size", allreduce_config=0.3), CF()):
        bs = comm.flat_buckets(numels, 4, cf, 2)
        assert sorted(i for b in bs for i in b.indices) == list(range(5))
        assert all(b.numel == sum(numels[i] for i in b.indices) and b.padded % 2 == 0 for b in bs)


def test_the_plan_states_the_buckets_and_the_exposed_communication_it_assumes():
    from porting.train.plan import comm
    from porting.train.recipe.schema import load_recipe

    from model_zoo.config import LlamaConfig

    cfg = LlamaConfig.from_hf(ROOT / "model_zoo" / "assets" / "stories260k")
    one = comm.fusion_plan(load_recipe(TINY, []), cfg)
    assert one.allreduce_ops == 0 and one.gradients == 47   # one rank: nothing reduced
    two = comm.fusion_plan(load_recipe(TINY, ["cluster.devices_per_node=2", "parallel.comm_fusion.enabled=false"]), cfg)
    assert two.allreduce_ops == 47 and two.bucket_params[0] == (46,) and two.bucket_params[-1] == (0,)
    assert two.exposed_fraction == 1.0 and "no overlap" in two.exposed_source
