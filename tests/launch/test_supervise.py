"""`port train --supervise` (porting/launch/supervise.py) under real msrun workers on the CPU (4 on one node): rank 2
killed with SIGKILL, and rank 1 frozen with SIGSTOP (a silent hang), are seen, kept as evidence, diagnosed, and the run
resumes from its last checkpoint to the same losses and weights as an uninterrupted run; a fault that
repeats at the same step stops the run with its diagnosis instead of looping. The watch itself, with a clock the
tests move: tests/launch/test_watch.py. The model is one layer of stories260K (tests/conftest.py model_dir)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from porting.rundir import ranklog
from tests.helpers import port_process
from tests.train.conftest import ROOT, TINY, free_port

COMMON = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "batching.micro_batch_size=1",
          "batching.grad_accum_steps=2", "schedule.max_steps=10", "checkpointing.every_steps=2",
          "checkpointing.export_hf=false", "cluster.devices_per_node=4", "optimizer.lr=1e-4"]
WORKERS = 4   # the layout: 4 workers on one node


def _sets(model_dir: Path, extra: list[str] = ()) -> list[str]:
    return [a for s in [*COMMON, f"model.source={model_dir}", f"cluster.master_port={free_port()}", *extra]
            for a in ("--set", s)]


def _start(run: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    return subprocess.Popen([sys.executable, "-m", "porting", "train", str(TINY), "--run-dir", str(run), *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _pid_at_step(run: Path, rank: int, step: int, deadline: float) -> int:
    """The pid rank ``rank`` logged, once its log shows ``step``."""
    log = run / "logs" / f"rank_{rank}.log"
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        pid = ranklog.pid_of(text)
        if pid is not None and any(s.step == step for s in ranklog.read_steps(text)):
            return pid
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not reach step {step}: {log.read_text() if log.exists() else 'no log'}")


def signal_at_step(p: subprocess.Popen, run: Path, rank: int, step: int, sig: int) -> tuple[str, str]:
    """Send ``sig`` to rank ``rank`` of the supervised run ``p`` once its log shows ``step``; the run's
    (stdout, stderr) after it ends (it is killed if the test fails first)."""
    try:
        os.kill(_pid_at_step(run, rank, step, time.monotonic() + 600), sig)
        return p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            p.kill()


def _final_weights(run: Path) -> dict:
    from porting.train.run.checkpoint.read import full_state

    last = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[-1]
    return full_state(last)


def _losses(run: Path) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (run / "metrics.jsonl").read_text().splitlines()
            if ln.strip() and '"step"' in ln and '"loss"' in ln]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, model_dir) -> Path:
    run = tmp_path_factory.mktemp("sup") / "clean"
    r = port_process("train", str(TINY), "--run-dir", str(run), *_sets(model_dir), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def _check_recovered(run: Path, clean: Path, killed_rank: int, kind: str, atol: float = 0.0) -> None:
    """One incident of ``kind`` at ``killed_rank``, its evidence kept, and the same 10 losses and final weights as
    the uninterrupted run: bitwise in the same mode (``atol`` 0), within ``atol`` across modes."""
    incidents = [json.loads(ln) for ln in (run / "incidents.jsonl").read_text().splitlines()]
    assert len(incidents) == 1 and incidents[0]["kind"] == kind, incidents
    inc = incidents[0]
    assert inc["suspect"] == killed_rank and inc["observed_rank"] == killed_rank, inc
    assert inc["action"].startswith("relaunched with --resume from step"), inc
    ev = run / inc["evidence"] / "logs"
    assert {p.name for p in ev.glob("rank_*.log")} == {f"rank_{r}.log" for r in range(WORKERS)}   # every rank's log
    assert (run / inc["evidence"] / "fingerprint.json").is_file()
    assert len(_losses(run)) == len(_losses(clean)) == 10
    np.testing.assert_allclose(_losses(run), _losses(clean), rtol=0, atol=1e-6)
    a, b = _final_weights(run), _final_weights(clean)
    assert a.keys() == b.keys()
    for k in a:
        if atol:
            np.testing.assert_allclose(a[k], b[k], rtol=0, atol=atol, err_msg=k)
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _recipe_file(dest: Path, model_dir: Path) -> Path:
    """tiny-cpu.yaml with COMMON and the model written into the file itself (no --set), its data path absolute."""
    from porting.train.recipe.schema import apply_overrides

    raw = yaml.safe_load(TINY.read_text())
    raw["data"]["path"] = str((TINY.parent / raw["data"]["path"]).resolve())
    dest.write_text(yaml.safe_dump(apply_overrides(raw, [*COMMON, f"model.source={model_dir}"]), sort_keys=False))
    return dest


@pytest.mark.msrun
@pytest.mark.slow
def test_a_killed_rank_is_diagnosed_and_the_run_resumes_to_the_same_weights(tmp_path, uninterrupted, model_dir):
    """Also: the user's recipe file is edited while the supervised run goes (max_steps, parallel, checkpointing); the
    relaunch runs the job document written at the start (RUN/job.json), so its 10 steps, losses and weights still
    equal the uninterrupted run's, and no second revision is written."""
    run, recipe = tmp_path / "sup", _recipe_file(tmp_path / "recipe.yaml", model_dir)
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    p = subprocess.Popen([sys.executable, "-m", "porting", "train", str(recipe), "--run-dir", str(run), "--set",
                          f"cluster.master_port={free_port()}", "--supervise", "--stall-timeout", "120"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _pid_at_step(run, 0, 1, time.monotonic() + 600)   # the job was written before any rank started
    raw = yaml.safe_load(recipe.read_text())
    raw["schedule"]["max_steps"], raw["parallel"] = 4, {**raw.get("parallel", {}), "tensor_parallel": 2}
    raw["checkpointing"]["every_steps"] = 3
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    out, err = signal_at_step(p, run, 2, 3, signal.SIGKILL)
    assert p.returncode == 0, err[-3000:]
    assert "1 restart(s)" in out, out
    _check_recovered(run, uninterrupted, 2, "exit")
    assert "(--resume) of job revision 1" in err and not (run / "job.2.json").exists(), err[-3000:]
    job = json.loads((run / "job.json").read_text())
    assert job["recipe"]["schedule"]["max_steps"] == 10 and job["recipe"]["parallel"]["tensor_parallel"] == 1
    assert [p.name for p in sorted((run / "checkpoints").glob("step_*"))] == ["step_10", "step_8"]   # every 2, keep 2


@pytest.mark.msrun
@pytest.mark.slow
def test_a_frozen_rank_is_seen_before_the_collective_timeout_and_the_run_resumes(tmp_path, uninterrupted, model_dir):
    """In PyNative (issue 48: supervised recovery in both modes; the killed-rank test runs graph mode): port's
    gradient buckets launched during the backward, the hang seen, the relaunch resumes, and the run ends within 1e-6
    of the uninterrupted graph-mode run (two modes: not bitwise, tests/train/test_comm_fusion.py)."""
    run = tmp_path / "sup"
    # saves at steps 4 and 8, the freeze after step 5: rank 1 stops inside a step, not in a save's barrier, where a
    # stop looks like a slow save for the save allowance and msrun's scheduler, which sees its heartbeat stop, ends
    # the job first (one CI run froze it at step 3 of saves every 2 steps and it had reached step 4's save)
    p = _start(run, *_sets(model_dir, ["checkpointing.every_steps=4", "execution=pynative"]), "--supervise",
               "--stall-timeout", "20")
    out, err = signal_at_step(p, run, 1, 5, signal.SIGSTOP)
    assert p.returncode == 0, err[-3000:]
    _check_recovered(run, uninterrupted, 1, "stall", atol=1e-6)
    assert json.loads((run / "job.json").read_text())["recipe"]["execution"] == "pynative"
    assert "its process" in (run / "incidents.jsonl").read_text() and "is stopped (SIGSTOP" in (run / "incidents.jsonl").read_text()


@pytest.mark.slow
def test_a_fault_that_repeats_stops_with_its_diagnosis(tmp_path, model_dir):
    """One device (the supervised `port train` child, no msrun). A real divergence (lr 1e30: step 1 applies a huge
    update, every later loss is NaN) with no skips allowed:
    the supervisor rolls back once (no checkpoint yet: the start) skipping step 2's data, the fault comes back at
    step 3, and the run stops with its diagnosis instead of looping (5 restarts were allowed)."""
    run = tmp_path / "sup"
    r = port_process("train", str(TINY), "--run-dir", str(run), *_sets(model_dir, ["optimizer.lr=1e30",
                     "nonfinite.max_consecutive_skips=0", "cluster.devices_per_node=1"]), "--supervise", "--max-restarts", "5", timeout=900)
    assert r.returncode != 0
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert err and "supervised run stopped after incident 2 (diverged at step 3)" in err[-1], r.stderr[-2000:]
    incidents = [json.loads(ln) for ln in (run / "incidents.jsonl").read_text().splitlines()]
    assert [i["kind"] for i in incidents] == ["diverged", "diverged"]
    assert incidents[0]["action"].startswith("rolled back to the start") and incidents[0]["skip_window"] == [2, 2]
    assert incidents[1]["action"].startswith("stopped: non-finite steps again after the rollback (steps 3..3)")
    assert "loss is nan" in incidents[1]["seen"] and "loss is nan" in incidents[1]["verdict"]["reason"]
