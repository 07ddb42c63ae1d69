"""PyNative as a first-class mode (recipe key ``execution``, porting/train/run/step/execution.py): the same step
cells run op by op. On the CPU both modes give the same losses and weights within float32 tolerance
(one device here, with accumulation, packing and a resume across modes; DP 2 and TP 2 under msrun in
tests/train/test_msrun.py and test_tensor_parallel.py); the plan says which mode runs; a graph compile
that fails names the PyNative fallback; an older MindSpore without ``runtime.set_memory`` falls back."""

from __future__ import annotations

import shutil
import types

import numpy as np
import pytest

from tests.train.conftest import TINY, metrics

COMMON = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "optimizer.lr=1e-4"]


def _weights(run) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(run / "hf" / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _train(run, model_dir, *sets: str):
    """One layer of stories260K (tests/conftest.py model_dir): PyNative runs each op eagerly, so its cost grows
    with the layers; the execution mode is the subject, not the depth."""
    from porting.train import train
    from porting.train import load_recipe

    return train(load_recipe(TINY, COMMON + [f"model.source={model_dir}"] + list(sets)), run, echo=False)


def _same_training(graph, pynative) -> None:
    """Step losses and grad norms equal within float32 rounding, final weights too."""
    lg, lp = metrics(graph)[0], metrics(pynative)[0]
    assert [s["step"] for s in lg] == [s["step"] for s in lp]
    assert np.allclose([s["loss"] for s in lg], [s["loss"] for s in lp], rtol=0, atol=1e-5)
    assert np.allclose([s["grad_norm"] for s in lg], [s["grad_norm"] for s in lp], rtol=1e-4, atol=0)
    assert _max_diff(_weights(graph), _weights(pynative)) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("sets", [
    ["batching.micro_batch_size=4", "batching.grad_accum_steps=1"],    # FusedTrainStep: the whole step in one cell
    ["batching.micro_batch_size=2", "batching.grad_accum_steps=2"],    # AccumGradStep + ApplyStep
    ["batching.packing=true", "batching.micro_batch_size=1", "batching.grad_accum_steps=2"],   # packed rows
], ids=["fused", "accumulation", "packing"])
def test_pynative_trains_like_graph_mode(tmp_path, sets, model_dir):
    sets = sets + ["schedule.max_steps=3", "checkpointing.every_steps=0"]
    g = _train(tmp_path / "graph", model_dir, *sets)
    p = _train(tmp_path / "pynative", model_dir, *sets, "execution=pynative")
    _same_training(tmp_path / "graph", tmp_path / "pynative")
    assert g.compiled_graphs >= 1 and p.compiled_graphs == 0        # PyNative compiles no step graph
    w0 = _weights_from(model_dir)
    assert _max_diff(w0, _weights(tmp_path / "pynative")) > 1e-5     # it trained
    log = (tmp_path / "pynative" / "logs" / "rank_0.log").read_text()
    assert "execution: pynative (recipe: execution=pynative)" in log


def _weights_from(model_dir) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.slow
def test_a_graph_run_resumes_in_pynative_on_the_same_curve(tmp_path, model_dir):
    """A team whose graph compile starts failing (a CANN change) resumes the same run in PyNative."""
    sets = ["schedule.max_steps=4", "checkpointing.every_steps=2", "checkpointing.keep_last=2"]
    _train(tmp_path / "graph", model_dir, *sets)
    shutil.copytree(tmp_path / "graph", tmp_path / "resumed", ignore=shutil.ignore_patterns("step_4", "hf"))
    from porting.train import train
    from porting.train import load_recipe

    r = train(load_recipe(TINY, COMMON + [f"model.source={model_dir}"] + sets + ["execution=pynative"]), tmp_path / "resumed", resume=True,
              echo=False)
    assert r.steps_done == 2 and r.compiled_graphs == 0
    _same_training(tmp_path / "graph", tmp_path / "resumed")


class _NotAGraph:
    """A real MindSpore cell that PyNative runs and graph mode refuses to compile (a tensor as a dict key)."""

    @staticmethod
    def cell():
        from mindspore import nn

        class DictKey(nn.Cell):
            def construct(self, x):
                seen = {}
                seen[x] = 1
                return x * 2

        return DictKey()


def test_a_failing_graph_compile_names_the_pynative_fallback():
    import mindspore as ms

    from porting.train.run.step import execution
    from porting.train import load_recipe

    x = ms.Tensor(np.ones((2, 3), np.float32))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises((RuntimeError, TypeError, ValueError)) as caught:
            _NotAGraph.cell()(x)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    err = execution.compile_failure(load_recipe(TINY), caught.value, [(1, 64)])
    assert isinstance(err, execution.GraphCompileError) and "\n" not in str(err)
    assert "shape [(1, 64)] failed" in str(err) and "--set execution=pynative" in str(err)
    assert execution.compile_failure(load_recipe(TINY, ["execution=pynative"]), caught.value, [(1, 64)]) is None
    assert np.array_equal(_NotAGraph.cell()(x).asnumpy(), 2 * np.ones((2, 3)))   # PyNative runs the same cell


def test_the_plan_states_the_execution_mode_and_the_recipe_refuses_others():
    from model_zoo.errors import RecipeError
    from porting.train import format_plan, make_plan, plan_config
    from porting.train import load_recipe

    for sets, first in (([], "execution: graph (the default)"),
                        (["execution=pynative"], "execution: pynative (recipe: execution=pynative)")):
        recipe = load_recipe(TINY, sets)
        cfg, _ = plan_config(recipe)
        text = format_plan(make_plan(recipe, cfg, "runs/x"))
        assert first in text
    assert "--set execution=pynative" in format_plan(make_plan(load_recipe(TINY), cfg, "runs/x"))
    with pytest.raises(RecipeError, match="execution"):
        load_recipe(TINY, ["execution=eager"])


def test_an_older_mindspore_without_runtime_set_memory_caps_memory_the_older_way():
    """MindSpore before mindspore.runtime.set_memory: the run logs the fallback (a 'fallback:' warning), the cap still applies."""
    from porting.train.run.step import execution
    from porting.train import validate_recipe

    ascend = validate_recipe({"model": {"source": "llama-7b"}, "data": {"path": "x.jsonl"},
                              "cluster": {"device": "ascend"}}, check_files=False)
    calls = []
    old = types.SimpleNamespace(__version__="2.4.10", set_context=lambda **kw: calls.append(kw))
    assert execution.cap_device_memory("58GB", old) == "mindspore.set_context(max_device_memory)"
    assert calls == [{"max_device_memory": "58GB"}]
    notes = execution.runtime_fallbacks(ascend, old)
    assert len(notes) == 1 and "no mindspore.runtime.set_memory" in notes[0] and "max_device_memory" in notes[0]
    import mindspore

    assert execution.runtime_fallbacks(ascend, mindspore) == []   # every supported MindSpore has it
