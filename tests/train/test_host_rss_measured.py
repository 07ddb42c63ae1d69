"""The host-RAM plan held against a measurement: the peak RSS of a real one-device `port train`
(2 steps and a final checkpoint) of a random-weight Llama 4096 hidden is within 20% of the dry run's worker
figure (porting/train/plan/host_memory.py). benchmarks/host_rss_plan.py prints the same comparison with the terms,
at this width and at 2048 (BENCHMARKS.md: +2.4% and +9.5%)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import port as run_port
from tests.train.conftest import ROOT, TINY

pytestmark = pytest.mark.slow

WIDTHS = {2048: dict(intermediate_size=5632, num_hidden_layers=2, num_attention_heads=16),
          4096: dict(intermediate_size=11008, num_hidden_layers=1, num_attention_heads=32)}
SETS = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
        "checkpointing.every_steps=0", "schedule.max_steps=2", "schedule.warmup_steps=0"]
# the parent's only child is `port train`, so RUSAGE_CHILDREN's ru_maxrss (KiB on Linux) is its peak
PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stderr.write(r.stderr[-3000:]); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "sys.exit(r.returncode)")


def _model(d, width: int):
    from safetensors.numpy import save_file

    from converters import names
    from model_zoo.config import LlamaConfig

    cfg = LlamaConfig(vocab_size=4096, hidden_size=width, num_key_value_heads=WIDTHS[width]["num_attention_heads"],
                      max_position_embeddings=256, tie_word_embeddings=False, **WIDTHS[width])
    d.mkdir()
    rng = np.random.default_rng(0)
    save_file({n: (np.ones(s, np.float32) if len(s) == 1 else (0.02 * rng.standard_normal(s, np.float32)))
               for n, s in names.expected_hf_shapes(cfg).items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({**cfg.to_hf(), "torch_dtype": "float32"}))
    for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        (d / f).write_bytes((ROOT / "model_zoo" / "assets" / "stories260k" / f).read_bytes())
    return d


# the test holds the largest width this machine holds (4096); benchmarks/host_rss_plan.py measures both, side by side
@pytest.mark.parametrize("width", [4096])
def test_peak_host_rss_of_a_real_worker_is_within_20_percent_of_the_plan(tmp_path, width):
    model = _model(tmp_path / "model", width)
    sets = [a for s in SETS + [f"model.source={model}"] for a in ("--set", s)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    port = [sys.executable, "-m", "porting", "train", str(TINY), *sets]
    # the dry run in this process (tests/helpers.py `port`): its figure is the subject, the process is the measured run's
    dry = run_port("train", str(TINY), *sets, "--dry-run", "--json", cwd=ROOT, check=True)
    plan = json.loads(dry.stdout)["host_memory"]["worker_gib"]
    r = subprocess.run([sys.executable, "-c", PEAK, *port, "--run-dir", str(tmp_path / "run")], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=1800)
    assert r.returncode == 0, r.stderr
    peak = int(r.stdout.split()[-1]) * 1024 / 2**30
    assert abs(plan / peak - 1) <= 0.20, (width, plan, peak)
