"""Data parallel under real msrun workers: 2 workers equal 1 worker with 2 accumulation steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.train.conftest import ROOT, TINY, free_port, metrics, port

pytestmark = [pytest.mark.msrun, pytest.mark.slow]


def test_two_msrun_workers_equal_one_worker_with_two_accumulation_steps(tmp_path):
    from safetensors.numpy import load_file

    from porting.train.loop import train
    from porting.train.recipe import load_recipe

    common = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "schedule.max_steps=3",
              "checkpointing.every_steps=0", "batching.micro_batch_size=2"]
    dp = tmp_path / "dp2"
    args = [a for s in common + ["cluster.devices_per_node=2", "batching.grad_accum_steps=1",
                                 f"cluster.master_port={free_port()}",
                                 "parallel.comm_fusion.allreduce_mode=size",
                                 "parallel.comm_fusion.allreduce_config=1"] for a in ("--set", s)]
    port("train", str(TINY), "--run-dir", str(dp), *args, check=True, timeout=400)
    one = tmp_path / "acc2"
    train(load_recipe(TINY, common + ["batching.grad_accum_steps=2"]), one, echo=False)

    wa, wb = load_file(str(dp / "hf" / "model.safetensors")), load_file(str(one / "hf" / "model.safetensors"))
    diff = max(float(np.abs(wa[k] - wb[k]).max()) for k in wa)
    assert diff < 2e-5, diff
    la = [s["loss"] for s in metrics(dp)[0]]
    lb = [s["loss"] for s in metrics(one)[0]]
    assert np.allclose(la, lb, atol=1e-5), (la, lb)
    # Every rank logged, msrun kept its own logs, and rank 0 wrote the run files.
    for r in (0, 1):
        lines = (dp / "logs" / f"rank_{r}.log").read_text().splitlines()
        assert lines and all(f" rank={r} " in l for l in lines)
    assert (dp / "logs" / "msrun" / "scheduler.log").is_file()
    assert {p.name for p in (dp / "logs" / "msrun").glob("worker_*.log")} == {"worker_0.log", "worker_1.log"}
    manifest = json.loads((dp / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["recipe"]["parallel"]["comm_fusion"]["allreduce_mode"] == "size"
