"""The Ascend kernel plan in GRAPH_MODE under real msrun data parallel (2 workers) equals one process
accumulating the same two micro-batches (tests/train/ascend_dp_script.py; stand-ins for the fused ops)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.train.conftest import ROOT, free_port

pytestmark = [pytest.mark.msrun, pytest.mark.slow]
SCRIPT = ROOT / "tests" / "train" / "ascend_dp_script.py"


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")


def test_fused_plan_data_parallel_under_msrun_equals_accumulation(tmp_path):
    msrun = shutil.which("msrun")
    if msrun is None:
        pytest.skip("msrun (MindSpore's launcher) is not on PATH")
    one = tmp_path / "accum.json"
    subprocess.run([sys.executable, str(SCRIPT), "accum", str(one)], cwd=tmp_path, env=_env(), check=True,
                   capture_output=True, text=True, timeout=300)
    dp = tmp_path / "dp.json"
    p = subprocess.run([msrun, "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
                        f"--log_dir={tmp_path / 'logs'}", "--join=True", str(SCRIPT), "dp", str(dp)],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=400)
    logs = "".join(f.read_text()[-2000:] for f in (tmp_path / "logs").glob("worker_*.log"))
    assert p.returncode == 0, logs
    a, b = json.loads(dp.read_text()), json.loads(one.read_text())
    assert a["world"] == 2 and b["world"] == 1
    np.testing.assert_allclose(a["losses"], b["losses"], rtol=2e-3)
    for k in b["weights"]:
        np.testing.assert_allclose(a["weights"][k], b["weights"][k], atol=2e-5, err_msg=k)
