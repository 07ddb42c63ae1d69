"""`port train --supervise --shrink` (porting/launch/shrink.py): a rank's device that fails its probe after an
incident is left out, and the run resumes on the node's other devices with the same global batch, to the
losses a run without the fault gives."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from model_zoo.errors import RecipeError
from porting import train as T
from porting.rehearse import GRAD_NORM_RTOL, LOSS_ATOL
from porting.launch.shrink import derive, probe
from tests.helpers import port
from tests.train.conftest import ROOT, TINY, free_port
from tests.launch.test_supervise import _start, signal_at_step

SETS = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "batching.micro_batch_size=1",
        "schedule.max_steps=4", "checkpointing.every_steps=2", "checkpointing.export_hf=false", "optimizer.lr=1e-4"]


def _recipe(*extra: str):
    return T.load_recipe(str(TINY), [*SETS, *extra])


def test_derive_keeps_the_global_batch_and_the_tensor_parallel():
    s = derive(_recipe("cluster.devices_per_node=4"), [0, 1, 2, 3], {2})
    assert (s.tensor_parallel, s.data_parallel, s.grad_accum_steps, s.devices) == (1, 2, 2, [0, 1])
    assert s.values == {"cluster.devices_per_node": 2, "batching.grad_accum_steps": 2, "cluster.chips_per_node": 2,
                        "cluster.dies_per_chip": 1} and "global batch 4 kept" in s.text
    s = derive(_recipe("cluster.devices_per_node=4", "batching.grad_accum_steps=3"), [0, 1, 2, 3], {0})
    assert (s.data_parallel, s.grad_accum_steps, s.devices) == (3, 4, [1, 2, 3])   # 12 sequences: DP 3 x 4
    s = derive(_recipe("cluster.devices_per_node=4", "parallel.tensor_parallel=2"), [4, 5, 6, 7], {5})
    assert (s.tensor_parallel, s.data_parallel, s.grad_accum_steps, s.devices) == (2, 1, 2, [4, 6])
    # a job's recipe holds the derived hardware shape: the shrunk values make a recipe that validates, on an A3
    # server preset (16 dies) too, whole chips kept where they remain
    a3 = T.load_recipe(ROOT / "recipes" / "7b-8card.yaml", check_files=False)
    for bad, devices in (({3}, 8), ({3, 4, 5}, 8)):
        s = derive(a3, list(range(a3.cluster.devices_per_node)), bad)
        shrunk = a3.with_overrides(s.values)
        assert shrunk.cluster.devices_per_node == devices and shrunk.global_batch_size == a3.global_batch_size
    with pytest.raises(RecipeError, match="1 device\\(s\\) remain, fewer than tensor_parallel 2"):
        derive(_recipe("cluster.devices_per_node=2", "parallel.tensor_parallel=2"), [0, 1], {1})


@pytest.mark.slow
def test_the_probe_runs_a_checked_matmul_and_the_test_hook_fails_it(monkeypatch):
    assert probe("cpu", 0) is None
    monkeypatch.setenv("PORT_TEST_BAD_DEVICES", "3")
    assert probe("cpu", 3) == "device 3: marked bad by PORT_TEST_BAD_DEVICES (a test hook)"
    assert probe("cpu", 1) is None


def test_shrink_needs_supervise_and_one_node(tmp_path):
    r = port("train", str(TINY), "--run-dir", str(tmp_path / "r"), "--shrink")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == \
        "error: --shrink moves a supervised run onto fewer devices after a fault: add --supervise"
    assert not (tmp_path / "r").exists()


@pytest.mark.msrun
@pytest.mark.slow
def test_a_rank_on_a_bad_device_is_left_out_and_the_run_resumes_on_fewer(tmp_path, model_dir):
    # the reference: one device, accumulation 4 (the same 4 sequences per step as DP 4)
    ref = tmp_path / "one"
    r = port("train", str(TINY), "--run-dir", str(ref), *[a for s in SETS + ["batching.grad_accum_steps=4", f"model.source={model_dir}"]
                                                          for a in ("--set", s)])
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "sup"
    sets = [a for s in SETS + ["cluster.devices_per_node=4", f"model.source={model_dir}", f"cluster.master_port={free_port()}"]
            for a in ("--set", s)]
    os.environ["PORT_TEST_BAD_DEVICES"] = "2"   # rank 2's device fails the supervisor's probe
    # Steps take ~0.1 s here: rank 0 waits 4 s in step 4's sampled all-reduce (commwait's test knob), so the
    # kill after step 3 lands before step 4's checkpoint and the shrunk relaunch has steps 3 and 4 to run.
    os.environ["PORT_TEST_COMM_DELAY"] = "0:4"
    try:
        p = _start(run, *sets, "--supervise", "--shrink", "--stall-timeout", "120")
    finally:
        del os.environ["PORT_TEST_BAD_DEVICES"], os.environ["PORT_TEST_COMM_DELAY"]
    out, err = signal_at_step(p, run, 2, 3, signal.SIGKILL)
    assert p.returncode == 0, err[-3000:]
    inc = [json.loads(ln) for ln in (run / "incidents.jsonl").read_text().splitlines()]
    assert len(inc) == 1 and inc[0]["suspect"] == 2, inc
    assert inc[0]["action"].startswith("device 2: marked bad by PORT_TEST_BAD_DEVICES (a test hook): shrunk to 2 "
                                       "device(s) [0, 1] (TP 1 x DP 2, micro-batch 1 x accumulation 2: global batch 4 "
                                       "kept) without device(s) [2]; relaunched with --resume from step 2"), inc
    assert "launch 2 (--resume)" in err and "done: 2 worker(s), 1 restart(s)" in out, (out, err)
    assert "rank 0 of 2 " in (run / "logs" / "rank_0.log").read_text()   # the relaunch ran 2 workers
    got, want = _steps(run), _steps(ref)
    assert [s for s, _, _ in got] == [s for s, _, _ in want] == [1, 2, 3, 4]
    for (s, la, ga), (_, lb, gb) in zip(got, want):   # the rehearsal's DP-vs-one-device tolerances
        assert abs(la - lb) <= LOSS_ATOL and abs(ga - gb) <= GRAD_NORM_RTOL * abs(gb), (s, got, want)


def _steps(run: Path) -> list[tuple[int, float, float]]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "step" in r and "loss" in r]
