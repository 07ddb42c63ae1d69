"""With world > 1 nothing is merged inside the job: the launcher makes the HF export once msrun's workers
have exited (porting/train/run/checkpoint/export.py ``export_after_exit``), from the run's final per-rank checkpoint.
A real 2-worker run under msrun with ``checkpointing.export_hf: true`` (ZeRO-1 with accumulation, 2 steps:
tests/train/conftest.py ``dp2_zero1_step2``, the launch that tests/train/test_msrun.py then resumes)."""

from __future__ import annotations

import pytest


pytestmark = [pytest.mark.msrun, pytest.mark.slow]


def test_two_workers_export_after_they_exit(dp2_zero1_step2):
    run = dp2_zero1_step2 / "run"
    out = (dp2_zero1_step2 / "stdout.txt").read_text()
    # the launcher's lines: the workers are done, then the merge runs
    assert out.index("done: 2 workers") < out.index("HF export: merging") < out.index("HF export /"), out
    for rank in (0, 1):   # no worker exported; rank 0 says who does
        log = (run / "logs" / f"rank_{rank}.log").read_text()
        assert "HF export /" not in log
    assert "made by the launcher once every worker has exited" in (run / "logs" / "rank_0.log").read_text()
    assert (run / "hf" / "port_manifest.json").is_file() and (run / "hf" / "tokenizer.json").is_file()
    # the export holds exactly the final checkpoint's weights
    from safetensors.numpy import load_file

    from converters import names
    from model_zoo.config import LlamaConfig
    from porting.train.run.checkpoint import read as ckpt_read

    cfg = LlamaConfig.from_hf(run / "hf")
    hf = load_file(str(run / "hf" / "model.safetensors"))
    src, _ = ckpt_read.open_checkpoint(run / "checkpoints" / "step_2")
    for hf_name in names.expected_hf_names(cfg):
        ms_name = names.map_name(hf_name, names.NAME_MAPS[cfg.model_type])
        assert (hf[hf_name] == src.full("param", ms_name)).all(), hf_name
    src.files.close()
