"""`port bisect --baseline` on a LoRA step (porting/bisect/lora.py): the PEFT baseline at lr 1e-3 against a LoRA run
at 3e-3 (the same initial adapter, RUN/adapter_init). Step 2's loss is the first beyond tolerance, so step 1 is
replayed from the initial adapter on both sides (HF peft's LoRA layers, the zoo's): every forward and backward row,
the adapters' gradients among them, agrees; the first divergence is the update of step 1 (lora_B's)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from porting.bisect.lora import FROZEN
from porting.cli import main
from tests.train.conftest import TINY

pytestmark = pytest.mark.slow


def test_a_lora_step_is_bisected_to_its_update(model_dir, tmp_path):
    from porting.baseline.runner import BaselineRequest, run
    from porting.train import load_recipe, train

    sets = [f"model.source={model_dir}", "data.max_seq_length=64", "schedule.max_steps=2", "schedule.warmup_steps=0",
            "checkpointing.every_steps=1", "lora.r=4", "lora.target_modules=[q_proj,v_proj,down_proj]"]
    run(BaselineRequest(recipe_path=str(TINY), out=str(tmp_path / "base.json"),
                        overrides=tuple(sets + ["optimizer.lr=1e-3"]), threads=1))
    train(load_recipe(TINY, sets + ["optimizer.lr=3e-3"]), tmp_path / "run", echo=False)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = CliRunner().invoke(main, ["bisect", "--baseline", "base.json", "run", "--json"])
    finally:
        os.chdir(old)
    assert res.exit_code == 1, res.output[-3000:]
    rep = json.loads(res.stdout)
    assert rep["failing_steps"][0] == 2 and rep["step"] == 1 and "adapter_init" in rep["state"]
    assert rep["first_divergent"]["phase"] == "update", rep["first_divergent"]
    frozen = [r for r in rep["rows"] if r.get("detail") == FROZEN]   # below the first adapter: neither side computes
    assert frozen and all(r["phase"] == "backward" and r["layer"] in (0, None) for r in frozen), frozen[:2]
    bad = [(r["name"], r["phase"], r.get("detail")) for r in rep["rows"]
           if r["phase"] in ("forward", "backward") and not r["passed"] and r not in frozen]
    assert not bad, bad
    grads = [r for r in rep["rows"] if r["phase"] == "backward" and ".lora_" in r["name"]]
    assert len(grads) == 2 * 3 and all(r["passed"] for r in grads)
    updates = [r for r in rep["rows"] if r["phase"] == "update"]
    # B starts at zero, so step 1 moves B only (A's gradient is zero on both sides): B's updates differ by the lr
    assert len(updates) == 2 * 3
    assert all(r["passed"] == (".lora_A." in r["name"]) for r in updates), [(r["name"], r["value"]) for r in updates]
