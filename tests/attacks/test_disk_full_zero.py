"""A disk that fills while a sharded (ZeRO-1) run under real msrun workers writes a checkpoint: the run
stops with an error, the previous checkpoint is intact, and no partial checkpoint is left behind."""

from __future__ import annotations

import resource
import shutil
import signal

import pytest

from tests.train.conftest import DP2_ZERO1, TINY, free_port, shared_dp2_zero1_step2
from tests.helpers import port_process

pytestmark = [pytest.mark.msrun, pytest.mark.slow]


@pytest.fixture(scope="session")
def dp2_zero1_step2(model_dir, tmp_path_factory):
    """tests/train/conftest.py's fixture of that name, seen from here: one build for both (built_once)."""
    return shared_dp2_zero1_step2(model_dir, tmp_path_factory)


def _args(steps: int, model_dir) -> list[str]:   # one layer of stories260K (tests/conftest.py model_dir)
    return [a for s in DP2_ZERO1 + [f"model.source={model_dir}", f"schedule.max_steps={steps}",
                                    f"cluster.master_port={free_port()}"]
            for a in ("--set", s)]


def test_disk_full_during_a_sharded_checkpoint_keeps_the_previous_one(tmp_path, model_dir, dp2_zero1_step2):
    # steps 1-2 (a checkpoint at step 2) are the suite's shared ZeRO-1 launch (tests/train/conftest.py
    # dp2_zero1_step2), copied: this test resumes it towards step 4 on a full disk
    run = tmp_path / "zero1"
    shutil.copytree(dp2_zero1_step2 / "run", run, symlinks=True)
    step2 = run / "checkpoints" / "step_2"
    before = {p.name: p.read_bytes() for p in step2.iterdir()}
    assert {"rank_00000.safetensors", "rank_00001.safetensors", "layout.json", "state.json"} == set(before)
    limit = min(len(before["rank_00000.safetensors"]), len(before["rank_00001.safetensors"])) // 2

    def full_disk():  # inherited by msrun and its workers: every file stops growing past `limit` bytes
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    # resumed in PyNative (the execution mode may change on resume): the full disk is the subject, not the mode,
    # and two workers op by op cost less than compiling
    r = port_process("train", str(TINY), "--run-dir", str(run), *_args(4, model_dir), "--resume", "--set",
                     "execution=pynative", preexec_fn=full_disk, timeout=400)
    assert r.returncode != 0, r.stdout[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    logs = "\n".join(p.read_text(errors="replace") for p in (run / "logs").glob("rank_*.log"))
    assert "could not write the checkpoint" in logs and "step_2 is intact" in logs, logs[-3000:]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_2"], names   # no partial step_4, no temporary directory left
    assert {p.name: p.read_bytes() for p in step2.iterdir()} == before
