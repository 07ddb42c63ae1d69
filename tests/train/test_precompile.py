"""Bounded, pre-paid compiles: every shape compiled before step 1 on every rank, the
weights untouched by it, data-parallel ranks that never compile at different steps, down to the run that
died before: TP 2 x DP 2, ZeRO-1, bucketed, one rank compiling 20 s late (real msrun workers, real stories260K); the
compile cache under the run, reused with the same losses, and a process-wide one refused."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from porting.rundir import ranklog
from tests.helpers import port, port_process
from tests.train.conftest import TINY, error_line, free_port, metrics

# The text recipe's windows have 4 bucket lengths; micro-batch 1 x 2 accumulation steps mixes them.
BUCKETED = ["data.max_seq_length=128", "batching.micro_batch_size=1", "batching.grad_accum_steps=2",
            "schedule.max_steps=4", "checkpointing.every_steps=0", "checkpointing.export_hf=false"]


def _sets(settings: list[str]) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


@pytest.fixture(scope="module")
def trainer(model_dir, tmp_path_factory):
    """A Trainer of the 1-layer stories260K with bucketing and accumulation, before any step."""
    from porting.train.recipe.schema import load_recipe
    from porting.train.run import loop
    from porting.train.run.step import setup

    recipe = load_recipe(TINY, [f"model.source={model_dir}", *BUCKETED])
    run = tmp_path_factory.mktemp("pre") / "run"
    log = logging.getLogger("test.precompile")
    grid = loop.grid_mod.make_grid(recipe, 0, 1)
    loop.configure_mindspore(recipe, False)
    plan, _, model, _ = setup.data_and_model(recipe, model_dir, grid, log, run)
    return loop.Trainer(recipe, run, 0, 1, model, model_dir, plan, log, grid)


@pytest.mark.slow
def test_precompile_compiles_every_shape_and_changes_no_weight(trainer):
    from porting.train.run.step import precompile as pre
    from porting.train.run.step.cells import compiled_graphs

    plan = trainer.plan
    shapes = plan.run_shapes()
    assert len(shapes) >= 2   # more than one bucket in these 4 steps
    before = [p.asnumpy().copy() for p in trainer.state_params + list(trainer.buffers)]
    lines: list[str] = []
    report = pre.precompile(trainer, shapes, plan.step(0, 0).micro_batches[0], None, lines.append)
    # one accumulation graph per shape, one update graph; nothing ran
    assert report.graphs == compiled_graphs(*trainer.cells) == len(shapes) + 1
    # one log line per graph as it finishes: no silent window before step 1
    n = len(shapes) + 1
    assert [ln.split(":")[1].strip() for ln in lines] == [f"graph {i} of {n}" for i in range(1, n + 1)]
    assert all(f"shape {list(s)} in " in ln for s, ln in zip(shapes, lines)) and "the update" in lines[-1]
    after = [p.asnumpy() for p in trainer.state_params + list(trainer.buffers)]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    for step in plan.steps():   # the steps find their graphs: none compiles
        r = trainer.run_step(step, 1e-3)
        assert not r.compile and np.isfinite(r.loss)
    assert compiled_graphs(*trainer.cells) == report.graphs


def test_a_run_with_mindspores_compile_cache_on_is_refused_before_anything_is_written(tmp_path):
    """A process-wide MindSpore compile cache matches graphs by compile order only (a changed recipe value
    loads a stale graph), so `port train` refuses it in one line, before the run directory exists; port keys
    its own cache by the recipe. PyNative compiles nothing."""
    from porting.train.plan.execution import compile_cache_problem
    from porting.train.recipe.schema import load_recipe

    run = tmp_path / "run"
    p = port("train", TINY, "--run-dir", run, "--set", "schedule.max_steps=2", env={"MS_COMPILER_CACHE_ENABLE": "1"})
    assert p.returncode != 0 and not run.exists()
    line = error_line(p)
    assert "MS_COMPILER_CACHE_ENABLE=1" in line and "unset it" in line and "RUN/compile_cache" in line
    recipe = load_recipe(TINY)
    assert compile_cache_problem(recipe, {"MS_COMPILER_CACHE_ENABLE": "0"}) == ""
    assert compile_cache_problem(recipe, {}) == ""
    assert "enable_compile_cache" in compile_cache_problem(recipe, {}, context_on=True)
    assert compile_cache_problem(load_recipe(TINY, ["execution=pynative"]), {"MS_COMPILER_CACHE_ENABLE": "1"}) == ""


def test_the_compile_cache_is_off_on_ascend_unless_asked_for():
    from porting.train.recipe.schema import load_recipe
    from porting.train.run.step.precompile import cache_wanted
    from tests.train.conftest import ROOT

    def rec(*sets):
        return load_recipe(ROOT / "recipes" / "13b-32card.yaml", list(sets), check_files=False)

    assert not cache_wanted(rec()) and cache_wanted(rec("cluster.compile_cache=true"))
    assert cache_wanted(load_recipe(TINY, [])) and not cache_wanted(load_recipe(TINY, ["cluster.compile_cache=false"]))


def test_cache_key_follows_what_builds_the_graph():
    """MindSpore's cache names graphs by compile order and loads a changed constant stale, so its folder is
    keyed by everything the graphs are built from."""
    from porting.train.run.step.precompile import cache_key

    base = ({"optimizer": {"grad_clip": 1.0}}, {"hidden_size": 64}, [(1, 80), (1, 128)], 4)
    key = cache_key(*base)
    assert key == cache_key(*base)
    assert cache_key({"optimizer": {"grad_clip": 0.5}}, *base[1:]) != key
    assert cache_key(base[0], {"hidden_size": 128}, *base[2:]) != key
    assert cache_key(*base[:2], [(1, 80)], 4) != key
    assert cache_key(*base[:3], 2) != key


@pytest.mark.slow
def test_compile_cache_is_written_under_the_run_and_reused_with_the_same_losses(model_dir, tmp_path):
    """A run writes its compile cache under RUN/compile_cache and publishes it to PORT_COMPILE_CACHE_SHARED; a
    second process in another run directory copies it into its own, loads the graphs (MindSpore says so) and
    trains to the same losses, bit for bit. With accumulation: the loaded
    accumulation graph once trained on zeros (loss ln(vocab) at every step) while the model was only inside
    its grad_fn, not a sub-cell (run/step/cells.py AccumGradStep)."""
    first, second, shared = tmp_path / "a", tmp_path / "b", tmp_path / "shared"
    args = ["train", str(TINY), *_sets([f"model.source={model_dir}", *BUCKETED])]
    env = {"PORT_COMPILE_CACHE_SHARED": str(shared)}   # this test's own, whatever the suite set
    port_process(*args, "--run-dir", str(first), check=True, timeout=600, env=env)
    graphs = sorted(p.name for p in (first / "compile_cache").rglob("compile_cache_*.mindir"))
    assert len(graphs) == metrics(first)[1]["precompiled_graphs"] >= 3
    published = sorted(p.name for p in shared.rglob("compile_cache_*.mindir"))
    assert published == graphs and len(list(shared.glob("*/rank_0/READY"))) == 1
    # another run directory and another master port: the same graphs, copied from the shared folder into the run
    p = port_process(*args, "--run-dir", str(second), "--set", "cluster.master_port=29555", check=True,
                     timeout=600, env={**env, "GLOG_v": "2"})
    assert "Use the compilation cache" in p.stderr and "copied from" in (second / "logs" / "rank_0.log").read_text()
    assert sorted(p.name for p in (second / "compile_cache").rglob("compile_cache_*.mindir")) == graphs
    assert [s["loss"] for s in metrics(second)[0]] == [s["loss"] for s in metrics(first)[0]]


def _rank_steps(run) -> dict[int, dict[int, tuple]]:
    """rank -> step -> (shapes, graphs) from every rank's own log."""
    out: dict[int, dict[int, tuple]] = {}
    for log in sorted((run / "logs").glob("rank_*.log")):
        rank = int(log.stem.split("_")[1])
        for s in ranklog.read_steps(log.read_text()):
            out.setdefault(rank, {})[s.step] = (s.shapes, s.graphs)
    return out


@pytest.mark.slow
@pytest.mark.msrun
def test_tp2_dp2_zero1_bucketed_run_finishes_with_one_rank_compiling_past_the_collective_timeout(tmp_path, model_dir):
    """The run that died at step 2 (one rank compiling a new shape, the others timing out in AllReduce), now
    with rank 2 finishing its compiles 12 s after the others (a test hook: the uneven compiles of four workers on
    two busy cores, measured 24.5 s against 49-58 s, made deterministic) and a collective timeout of 10 s: the
    others wait for it outside the collective (run/step/ready.py), the run finishes, every rank compiled every shape
    before step 1, and no rank compiled afterwards. Micro-batch 2 (the recipe has 4) makes the steps change
    shape (96 and 128 tokens); with 4 every step of this data is 128 long since ranks share a shape. One layer of
    stories260K (model_dir): the layer count is not the subject, and each TP graph of all 5 took 3x the compile."""
    run = tmp_path / "run"
    # 12 s late, past the 10 s timeout: rank 2 is ready that long after the last of the others (run/step/ready.py)
    env = {"PORT_TEST_COMPILE_DELAY": "2:12", "MS_CPU_COMM_OP_TIMEOUT": "10"}
    p = port_process("train", str(TINY), "--run-dir", str(run), *_sets([
        f"model.source={model_dir}", "cluster.devices_per_node=4", "parallel.tensor_parallel=2", "parallel.optimizer_sharding=true",
        "batching.micro_batch_size=2", "schedule.max_steps=4", "logging.every_steps=1",
        "checkpointing.export_hf=false",
        f"cluster.master_port={free_port()}"]), timeout=1500, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    steps, summary = metrics(run)
    assert len(steps) == 4 and not any(s["compile"] for s in steps)
    assert summary["precompile_s"] > 0 and summary["compiled_graphs"] == summary["precompiled_graphs"]
    ranks = _rank_steps(run)
    assert sorted(ranks) == [0, 1, 2, 3] and all(sorted(r) == list(range(1, 5)) for r in ranks.values())
    for step in range(1, 5):   # every rank: the same shape at each step, and the graph count of precompile
        assert len({ranks[r][step][0] for r in ranks}) == 1, (step, ranks)
    assert len({g for r in ranks.values() for _, g in r.values()}) == 1
    assert len({ranks[0][s][0] for s in ranks[0]}) >= 2   # bucketed: the steps do change shape
    for log in (run / "logs").glob("rank_*.log"):
        text = log.read_text()
        assert "precompile: " in text and "every rank is ready" in text
        if log.name != "rank_2.log":   # the three on time waited for rank 2, past the collective timeout
            waited = float(text.split("every rank is ready (waited ")[1].split(" s")[0])
            assert waited >= 10.0, (log.name, waited)
        assert "compiled a graph during the step" not in text
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["event"] == "summary"


def test_a_graph_that_does_not_compile_stops_before_step_1_naming_pynative(tmp_path):
    """A real cell that graph mode refuses (a tensor as a dict key) fails in precompile, before any step, with
    the one-line error that names the PyNative fallback (the step's own compile error, moved earlier)."""
    from types import SimpleNamespace

    import mindspore as ms
    from mindspore import nn

    from porting.train.recipe.schema import load_recipe
    from porting.train.run.step import execution
    from porting.train.run.step import precompile as pre

    class DictKey(nn.Cell):
        def construct(self, x, *rest):
            seen = {}
            seen[x] = 1
            return x * 2

    cell = DictKey()
    stand_in = SimpleNamespace(recipe=load_recipe(TINY), accum=1, fused=cell, cells=[cell], run_dir=tmp_path,
                               packed_inputs=lambda mb: ())   # MindSpore's analysis: tmp_path/logs/ir (ir_dumps)
    template = SimpleNamespace(input_ids=np.zeros((1, 8), np.int32), labels=np.zeros((1, 8), np.int32))
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(execution.GraphCompileError) as caught:
            pre.precompile(stand_in, [(1, 16)], template, None)
    finally:
        ms.set_context(mode=mode)
    assert "shape [(1, 16)] failed" in str(caught.value) and "--set execution=pynative" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_the_loss_sums_of_the_micro_batches_never_run_in_float64_on_the_device(trainer, monkeypatch):
    """The accumulation path adds the micro-batches' loss sums in float64 on the host (exact, as before), never
    with a float64 tensor op: CANN's float64 coverage is partial."""
    import mindspore as ms

    seen = []
    astype = ms.Tensor.astype
    monkeypatch.setattr(ms.Tensor, "astype", lambda self, dtype, *a, **k: (seen.append(dtype), astype(self, dtype, *a, **k))[1])
    step = next(iter(trainer.plan.steps()))
    assert len(step.micro_batches) > 1   # the accumulation path
    r = trainer.run_step(step, 1e-3)
    assert np.isfinite(r.loss) and ms.float64 not in seen, seen
