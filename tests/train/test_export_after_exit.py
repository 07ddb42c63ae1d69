"""With world > 1 nothing is merged inside the job: the launcher makes the HF export once msrun's workers
have exited (porting/train/run/checkpoint/export.py ``export_after_exit``), from the run's final per-rank checkpoint.
A real 2-worker run under msrun with ``checkpointing.export_hf: true``."""

from __future__ import annotations

import pytest

from tests.helpers import port_process
from tests.train.conftest import TINY, free_port

pytestmark = [pytest.mark.msrun, pytest.mark.slow]


def test_two_workers_export_after_they_exit(tmp_path, model_dir):
    run = tmp_path / "run"
    sets = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.export_hf=true",
            "cluster.devices_per_node=2", "batching.micro_batch_size=1", "schedule.max_steps=2",
            f"model.source={model_dir}", f"cluster.master_port={free_port()}"]
    r = port_process("train", str(TINY), "--run-dir", str(run), *[a for s in sets for a in ("--set", s)],
                     check=True, timeout=600)
    out = r.stdout
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
