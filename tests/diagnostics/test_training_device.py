"""Training devices only: `port doctor` and `port train` on a node whose chips cannot train (310P, 310B) stop
before anything runs, with one line naming the chip and what to use instead. Input: real `npu-smi info`
outputs (tests/fixtures/npu_smi, each with its source), read through the real `npu-smi` call path: a stand-in
`npu-smi` executable on PATH prints the recorded output."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from model_zoo.errors import ConfigError
from porting import env
from porting.diagnostics import doctor

ROOT = Path(__file__).resolve().parents[2]
NPU_SMI = ROOT / "tests" / "fixtures" / "npu_smi"

# file -> (chip names npu-smi lists, in order; status of the training check)
FIXTURES = {
    "310P3_atlas300i_duo.txt": (["310P3", "310P3"], "fail"),
    "310B4.txt": (["310B4"], "fail"),
    "910B2C_atlas_a2.txt": (["910B2C", "910B2C"], "ok"),
    "910C_atlas_a3.txt": (["Ascend910"] * 4, "ok"),
}


def test_fixtures_are_the_recorded_files_each_with_its_source():
    sums = dict(reversed(line.split("  ", 1)) for line in (NPU_SMI / "SHA256SUMS").read_text().splitlines())
    readme = (NPU_SMI / "README.md").read_text()
    assert set(sums) == set(FIXTURES) == {p.name for p in NPU_SMI.glob("*.txt")}
    for name, digest in sums.items():
        assert hashlib.sha256((NPU_SMI / name).read_bytes()).hexdigest() == digest, name
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert "github.com/" in row and ("GPL" in row or "Apache" in row), row


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_chips_read_from_real_npu_smi_output(name):
    chips, status = FIXTURES[name]
    text = (NPU_SMI / name).read_text()
    assert doctor.npu_chips(text) == chips
    check = doctor.training_device_check(sorted(set(chips)))
    assert check["status"] == status, check
    if status == "fail":
        assert chips[0] in check["detail"] and "910-class" in check["detail"] and "cannot train" in check["detail"]


def test_a_chip_the_table_does_not_know_warns_and_no_npu_says_nothing():
    check = doctor.training_device_check(["950PR"])
    assert check["status"] == "warn" and "950PR" in check["detail"]
    assert doctor.training_device_check([]) is None
    # one inference chip among training chips still stops the node
    assert doctor.training_device_check(["310P3", "910B3"])["status"] == "fail"


def test_doctor_report_on_a_310p_node_fails_naming_the_chip(monkeypatch):
    monkeypatch.setattr(env, "npu_smi", lambda: (NPU_SMI / "310P3_atlas300i_duo.txt").read_text())
    rep = doctor.doctor_report(environ={})
    row = next(c for c in rep["checks"] if c["check"] == "npu training")
    assert rep["ok"] is False and row["status"] == "fail" and "310P3" in row["detail"]
    assert rep["npu"]["types"] == ["310P3"] and rep["npu"]["count"] == 2
    with pytest.raises(ConfigError, match=r"310P3.*training needs a 910-class"):
        doctor.require_training_device()
    monkeypatch.setattr(env, "npu_smi", lambda: (NPU_SMI / "910C_atlas_a3.txt").read_text())
    doctor.require_training_device()   # an A3 node trains
    assert next(c for c in doctor.doctor_report(environ={})["checks"] if c["check"] == "npu training")["status"] == "ok"


def _fake_npu_smi(tmp_path: Path, fixture: str) -> dict[str, str]:
    """A PATH whose `npu-smi info` prints the recorded output (the real subprocess call in porting/env.py)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True)
    exe = bindir / "npu-smi"
    exe.write_text(f"#!/bin/sh\n[ \"$1\" = info ] && exec cat '{NPU_SMI / fixture}'\nexit 1\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")


def _port(args: list[str], environ: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "porting", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=120)


def test_cli_doctor_and_train_dry_run_stop_on_a_310p_node(tmp_path):
    environ = _fake_npu_smi(tmp_path, "310P3_atlas300i_duo.txt")
    r = _port(["doctor"], environ, ROOT)
    assert r.returncode == 1 and "[fail] npu training" in r.stdout, r.stdout
    assert r.stderr.startswith("error: ") and "310P3" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    recipe = ROOT / "recipes" / "7b-8card.yaml"   # an Ascend recipe: its dry run plans for this node's chips
    r = _port(["train", str(recipe), "--dry-run", "--run-dir", str(tmp_path / "run")], environ, tmp_path)
    assert r.returncode != 0 and r.stdout == "", r.stdout
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: npu-smi: this node's NPU is 310P3"), line
    assert "training needs a 910-class training device" in line and not (tmp_path / "run").exists()
    ok = _port(["train", str(recipe), "--dry-run"], _fake_npu_smi(tmp_path / "a3", "910C_atlas_a3.txt"), tmp_path)
    assert ok.returncode == 0, ok.stderr
