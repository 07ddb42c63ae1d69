"""``kill -9`` of `port intake`, `port ckpt merge` and `port ckpt reshard` while their hidden temporary
folders exist; the next run to the same ``--out`` succeeds and removes them (docs/promises.md 1.5).

The kill lands when a temporary folder of the process is seen beside ``--out`` (polled), and the rerun
starts before the killed process is reaped: a zombie's temporaries are stale too
(``converters.atomic._pid_alive``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.attacks import inputs as I
from tests.attacks.harness import ROOT

FIX = ROOT / "tests" / "fixtures" / "cuda_jobs"


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")


def _temporaries(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def _kill_while_staging(argv: list[str], out: Path, tries: int = 6) -> None:
    """Start ``port argv``, kill -9 it as soon as one of its temporaries appears beside ``out``; the process
    is left unreaped (a zombie) until after the rerun. Retried when a run ends before it is seen."""
    for _ in range(tries):
        p = subprocess.Popen([sys.executable, "-m", "porting", *argv], cwd=out.parent, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while p.poll() is None and not _temporaries(out):
            time.sleep(0.002)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            time.sleep(0.2)
            assert _temporaries(out), "the kill landed after the temporaries were gone"
            _rerun_then_reap(argv, out, p)
            return
        p.wait()
        shutil.rmtree(out, ignore_errors=True)
    pytest.fail(f"port {argv[0]} never showed a temporary folder before finishing ({tries} tries)")


def _rerun_then_reap(argv: list[str], out: Path, killed: subprocess.Popen) -> None:
    left = _temporaries(out)
    res = subprocess.run([sys.executable, "-m", "porting", *argv], cwd=out.parent, env=_env(), capture_output=True,
                         text=True, timeout=300)
    killed.wait()
    assert res.returncode == 0, res.stderr[-2000:]
    assert out.is_dir() and not _temporaries(out), f"left behind: {_temporaries(out)} (after the kill: {left})"


def test_kill_9_of_intake_then_the_rerun_removes_its_temporaries(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(FIX / "configs" / "lf_qwen3_full_sft.yaml", job)
    for i in range(100):   # scanned inside the staged folder: the kill finds it there
        shutil.copy(FIX / "scripts" / "nanogpt_train.py", job / f"train_{i}.py")
    _kill_while_staging(["intake", str(job), "--out", str(tmp_path / "mig"), "--model", "stories260k"],
                        tmp_path / "mig")


@pytest.mark.slow   # trains the tiny run whose checkpoint is merged (~10 s) when no other test has
def test_kill_9_of_ckpt_merge_then_the_rerun_removes_its_temporaries(tmp_path):
    ck = I.train_checkpoint(tmp_path / "run" / "checkpoints" / "step_2")
    _kill_while_staging(["ckpt", "merge", str(ck), "--out", str(tmp_path / "W"), "--model", str(I.EMBEDDED)],
                        tmp_path / "W")


@pytest.mark.slow   # as above
def test_kill_9_of_ckpt_reshard_then_the_rerun_removes_its_temporaries(tmp_path):
    ck = I.train_checkpoint(tmp_path / "run" / "checkpoints" / "step_2")
    recipe = I.recipe(tmp_path)
    _kill_while_staging(["ckpt", "reshard", str(ck), "--to", str(recipe), "--out", str(tmp_path / "R")],
                        tmp_path / "R")
