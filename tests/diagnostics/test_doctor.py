"""`port doctor`: works without an NPU and says so; compatibility table and env knobs as data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from porting import env
from porting.diagnostics import doctor

ROOT = Path(__file__).resolve().parents[2]

NPU_SMI_910B = """+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc2                 Version: 23.0.rc2                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.5        41                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3338 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 91.0        40                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3338 / 65536         |
+===========================+===============+====================================================+
"""


def test_report_on_this_machine_says_no_npu_and_is_json():
    rep = doctor.doctor_report(environ={})
    assert rep["npu"]["present"] is (env.npu_smi() is not None)
    if not rep["npu"]["present"]:
        assert "no NPU" in rep["npu"]["detail"] and "CPU-only" in rep["npu"]["detail"]
    assert rep["versions"]["packages"]["mindspore"]
    json.dumps(rep)  # `port train` writes it into manifest.json
    knobs = {r["name"]: r for r in rep["env"]}
    assert knobs["HCCL_EXEC_TIMEOUT"]["in_effect"] == "1836" and knobs["HCCL_EXEC_TIMEOUT"]["set"] is False
    assert knobs["HCCL_CONNECT_TIMEOUT"]["default"] == "120"
    assert knobs["ASCEND_GLOBAL_LOG_LEVEL"]["default"] == "3"
    assert rep["ok"] is True, [c for c in rep["checks"] if c["status"] == "fail"]


def test_npu_smi_parsed(monkeypatch):
    monkeypatch.setattr(env, "npu_smi", lambda: NPU_SMI_910B)
    st = doctor.npu_status()
    assert st == {"present": True, "count": 2, "types": ["910B3"], "detail": "2 NPU(s): 910B3"}


@pytest.mark.parametrize("ms,cann,driver,status", [
    ("2.7.0", "8.2.RC1", "25.2.0", "ok"),
    ("2.7.1", "8.3.RC1.alpha002", None, "ok"),
    ("2.7.0", "8.0.0", None, "fail"),
    ("2.4.10", None, None, "info"),
    ("2.10.0", "8.3.RC1", None, "warn"),
])
def test_mindspore_cann_pairs(ms, cann, driver, status):
    assert doctor.check_mindspore_cann(ms, cann, driver)[0]["status"] == status


def test_driver_mismatch_warns():
    rows = doctor.check_mindspore_cann("2.7.0", "8.2.RC1", "24.1.0")
    assert [r["status"] for r in rows] == ["ok", "warn"] and "25.2.0" in rows[1]["detail"]


@pytest.mark.parametrize("torch,npu,status", [
    ("2.5.1", "2.5.1.post2", "ok"),
    ("2.6.0+cpu", "2.5.1", "fail"),
    (None, "2.5.1", "fail"),
    ("2.13.0+cpu", None, "info"),
])
def test_torch_torch_npu_pairs(torch, npu, status):
    assert doctor.check_torch_npu(torch, npu)[0]["status"] == status


def test_env_knob_problems(shared):
    bad_rt = shared / "data/ascend/rank_tables/mindspore_docs_EI0004_invalid_ranktable_duplicate_device_id.json"
    rep = doctor.doctor_report(environ={"HCCL_EXEC_TIMEOUT": "abc", "MS_ALLOC_CONF": "enable_vmm=true",
                                        "RANK_TABLE_FILE": str(bad_rt)})
    fails = {c["check"]: c["detail"] for c in rep["checks"] if c["status"] == "fail"}
    assert "not an integer" in fails["env HCCL_EXEC_TIMEOUT"]
    assert "key:value" in fails["env MS_ALLOC_CONF"]
    assert "device_id 1 repeats" in fails["RANK_TABLE_FILE"]
    assert rep["ok"] is False
    rep = doctor.doctor_report(environ={"HCCL_CONNECT_TIMEOUT": "900", "HCCL_EXEC_TIMEOUT": "600"})
    warn = [c for c in rep["checks"] if c["check"] == "env HCCL timeouts"]
    assert warn and warn[0]["status"] == "warn"


def test_cli_json_and_failure_exit():
    r = subprocess.run([sys.executable, "-m", "porting", "doctor", "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("HCCL")})
    assert r.returncode == 0, r.stderr
    assert "checks" in json.loads(r.stdout)
    r = subprocess.run([sys.executable, "-m", "porting", "doctor"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, HCCL_CONNECT_TIMEOUT="soon"))
    assert r.returncode == 1 and "HCCL_CONNECT_TIMEOUT" in r.stderr and r.stderr.startswith("error: ")
    assert "* HCCL_CONNECT_TIMEOUT" in r.stdout  # shown as set here
