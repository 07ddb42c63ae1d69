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
    ("2.10.0", "9.1.0", "26.1.0", "ok"),
    ("2.10.0", "8.5.0", None, "fail"),
    ("2.8.0", "8.5.0", None, "warn"),     # no VERSION_MAP row for 2.8.0: unverified, not guessed
])
def test_mindspore_cann_pairs(ms, cann, driver, status):
    rows = [r for r in doctor.check_mindspore_cann(ms, cann, driver) if r["check"] == "mindspore/cann"]
    assert rows[0]["status"] == status


@pytest.mark.parametrize("ms,cann,driver", [("2.11.0", "9.2.0", "26.2.RC1"), ("2.10.0", "9.1.0", "26.1.0"),
                                            ("2.9.0", "9.0.0", "26.0.RC1"), ("2.7.2", "8.5.0", "25.5.0")])
def test_table_has_the_published_pairings_each_with_a_source(ms, cann, driver):
    """mindformers/VERSION_MAP.json (mindformers 2.1.0 wheel): MindSpore -> CANN -> HDK."""
    row = doctor.pairing(ms)["row"]
    assert (row["cann"], row["driver"]) == (cann, driver) and "VERSION_MAP.json" in row["source"]
    assert all(r["source"] for r in doctor.compat_table()["mindspore"])


def test_ascend_node_with_the_wrong_cann_fails_naming_the_cann_and_hdk_to_install():
    rows = {r["check"]: r for r in doctor.check_mindspore_cann("2.10.0", "8.5.0", "25.5.0")}
    assert rows["mindspore/cann"]["status"] == "fail"
    assert "install CANN 9.1.0 and Ascend HDK 26.1.0" in rows["mindspore/cann"]["detail"]
    assert "MindSpore 2.7.2" in rows["mindspore/cann"]["detail"]     # or the MindSpore that CANN 8.5.0 pairs with
    assert rows["cann/driver"]["status"] == "fail" and "install Ascend HDK 26.1.0" in rows["cann/driver"]["detail"]
    assert doctor.pairing("2.10.0", "8.5.0", "25.5.0")["known_good"] is False
    ok = {r["check"]: r["status"] for r in doctor.check_mindspore_cann("2.7.2", "8.5.0", "25.5.0")}
    assert ok == {"mindspore range": "ok", "mindspore/cann": "ok", "cann/driver": "ok"}
    assert doctor.pairing("2.7.2", "8.5.0", "25.5.0")["known_good"] is True


@pytest.mark.compat
def test_without_cann_names_the_pairing_the_installed_mindspore_needs():
    from importlib.metadata import version

    ms = version("mindspore")
    row = doctor.pairing(ms)["row"]
    rep = doctor.doctor_report(environ={})
    if rep["versions"]["cann"] is None:
        detail = next(c["detail"] for c in rep["checks"] if c["check"] == "mindspore/cann")
        assert f"MindSpore {ms} needs CANN {row['cann']} and Ascend HDK {row['driver']}" in detail
        if ms == "2.10.0":
            assert "CANN 9.1.0 and Ascend HDK 26.1.0" in detail
    assert rep["pairing"]["row"] == row and rep["pairing"]["supported"] is True
    assert doctor.pairing("2.6.0")["supported"] is False and doctor.pairing("2.12.0")["supported"] is False
    rng = next(c for c in doctor.check_mindspore_cann("2.6.0", None, None) if c["check"] == "mindspore range")
    assert rng["status"] == "warn" and ">=2.7.0,<2.12" in rng["detail"]


def test_driver_mismatch_fails_with_the_hdk_to_install():
    rows = {r["check"]: r for r in doctor.check_mindspore_cann("2.7.0", "8.2.RC1", "24.1.0")}
    assert {k: r["status"] for k, r in rows.items()} == {"mindspore range": "ok", "mindspore pairing": "warn",
                                                         "mindspore/cann": "ok", "cann/driver": "fail"}
    assert "install Ascend HDK 25.2.0" in rows["cann/driver"]["detail"]
    assert rows["mindspore pairing"]["detail"].startswith("untested pairing: MindSpore 2.7.0")   # no CI tier runs it


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


def test_pyproject_range_is_the_table_s_supported_range():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ms = next(d for d in deps if d.startswith("mindspore"))
    rng = doctor.compat_table()["supported"]
    assert ms == f"mindspore>={rng['min'].rsplit('.0', 1)[0]},<{rng['below']}", ms
    tested = {t["mindspore"] for t in doctor.compat_table()["tested"]}
    pins = {line.split("==")[1].strip() for f in ("constraints.txt", "constraints-compat.txt", "constraints-py312.txt")
            for line in (ROOT / "scripts" / f).read_text().splitlines() if line.startswith("mindspore==")}
    assert pins == tested == {"2.10.0", "2.7.2"}
