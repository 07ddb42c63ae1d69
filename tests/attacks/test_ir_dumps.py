"""A graph that fails to compile: MindSpore writes its analysis (``rank_<r>/om/analyze_fail.ir``) under
``MS_OM_PATH``, which defaults to the working directory: a failed `port train` left ``./rank_0/om/analyze_fail.ir``
in the user's folder (issue 51). port's precompile (porting/train/run/step/precompile.py ``ir_dumps``) points it at
``RUN/logs/ir`` for its compiles, names the file in its one-line error, and leaves a value the user set alone.
A real cell that graph mode refuses, compiled by the real precompile; the working directory is hashed before and
after (tests/attacks/harness.py ``snapshot``). MindSpore 2.7.2 honours ``MS_OM_PATH`` the same way: this file is
in the compatibility tier (passed there: ``PYTHONPATH=. .venv-compat/bin/python -m pytest tests/attacks/test_ir_dumps.py``)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from tests.attacks.harness import TINY_RECIPE, changes, snapshot

pytestmark = pytest.mark.compat   # MS_OM_PATH on the oldest MindSpore in range too (scripts/compat.sh: 2.7.2)


def _failing_trainer(run_dir):
    from mindspore import nn

    from porting.train.recipe.schema import load_recipe

    class DictKey(nn.Cell):   # a tensor as a dict key: graph mode refuses it at compile time
        def construct(self, x, *rest):
            seen = {}
            seen[x] = 1
            return x * 2

    cell = DictKey()
    return SimpleNamespace(recipe=load_recipe(TINY_RECIPE), accum=1, fused=cell, cells=[cell], run_dir=run_dir,
                           packed_inputs=lambda mb: ())


@pytest.mark.parametrize("user_value", [None, "mine"])
def test_a_failed_compile_leaves_its_analysis_in_the_run_not_the_working_directory(tmp_path, monkeypatch, user_value):
    import mindspore as ms

    from porting.train.run.step import execution
    from porting.train.run.step import precompile as pre

    work, run = tmp_path / "work", tmp_path / "run"
    work.mkdir()
    (work / "notes.txt").write_text("the user's folder")
    (run / "logs").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.delenv("MS_OM_PATH", raising=False)
    monkeypatch.delenv("MS_DEV_SAVE_GRAPHS_PATH", raising=False)
    if user_value:
        monkeypatch.setenv("MS_OM_PATH", str(tmp_path / user_value))
    before = snapshot(work, None)
    template = SimpleNamespace(input_ids=np.zeros((1, 8), np.int32), labels=np.zeros((1, 8), np.int32))
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(execution.GraphCompileError) as caught:
            pre.precompile(_failing_trainer(run), [(1, 16)], template, None)
    finally:
        ms.set_context(mode=mode)
    assert changes(before, snapshot(work, None)) == [], "MindSpore wrote into the working directory"
    where = tmp_path / user_value if user_value else run / "logs" / pre.IR_DIR
    dumps = list(where.glob("rank_*/om/analyze_fail.ir"))
    assert len(dumps) == 1 and f"MindSpore's analysis: {dumps[0]}" in str(caught.value), (dumps, str(caught.value))
    assert "\n" not in str(caught.value) and "--set execution=pynative" in str(caught.value)
    assert os.environ.get("MS_OM_PATH") == (str(tmp_path / user_value) if user_value else None)   # restored
    assert "MS_DEV_SAVE_GRAPHS_PATH" not in os.environ
