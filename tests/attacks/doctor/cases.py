"""The host's environment as `port doctor` and `port convert` read it (porting/env.py, porting/diagnostics/doctor.py;
issue 51): an installed ``version.cfg`` of 3 GB is read only at its top (it took both past 3 GB of memory), a path
variable longer than the file-name limit is a finding or passed over, never a traceback, and a FIFO
``tokenizer.json`` beside the weights is said (a note, and the manifest's ``output.not_copied``), never blocked on.
Paths in ``env`` are relative: the harness runs each case in its own directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case

LONG = "x" * 10_000     # one name past NAME_MAX (255) and the whole past PATH_MAX (4096)


def _cann(d: Path) -> None:
    """A CANN toolkit whose version.cfg is 3 GiB: its version line, then a hole."""
    (d / "cann").mkdir()
    with open(d / "cann" / "version.cfg", "wb") as f:
        f.write(b"# CANN\nversion=8.5.0\n")
        f.truncate(3 << 30)


def _says_cann(line: str, d: Path) -> None:
    assert "CANN: 8.5.0" in line, line[-2000:]


@case(dest=None, refusal=False, check=_says_cann, env={"ASCEND_HOME_PATH": "cann"}, timeout=30)
def doctor_version_cfg_3_gib(d):
    _cann(d)
    return ["doctor"]


def _converted(line: str, d: Path) -> None:
    man = json.loads((d / "out" / "port_manifest.json").read_text())
    assert man["versions"]["cann"] == "8.5.0", man["versions"]


@case(dest="out", refusal=False, check=_converted, env={"ASCEND_HOME_PATH": "cann"}, timeout=60)
def convert_version_cfg_3_gib(d):
    _cann(d)
    return ["convert", "--hf", str(I.hf(d)), "--out", str(d / "out")]


def _no_cann(line: str, d: Path) -> None:
    assert "CANN: not installed" in line, line[-2000:]


def _unusable(line: str, d: Path) -> None:
    assert "the path cannot be used (File name too long)" in line and LONG not in line, line[-2000:]


for _var, _check in [("ASCEND_HOME_PATH", _no_cann), ("ASCEND_TOOLKIT_HOME", _no_cann), ("HF_HOME", None),
                     ("RANK_TABLE_FILE", _unusable), ("ASCEND_PROCESS_LOG_PATH", _unusable)]:
    def _doctor(d):
        return ["doctor"]
    _doctor.__name__ = f"doctor_{_var.lower()}_10000_characters"
    case(dest=None, refusal=False, check=_check, env={_var: LONG}, timeout=30)(_doctor)

for _var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "HF_HOME"):
    def _convert(d):
        return ["convert", "--hf", str(I.hf(d)), "--out", str(d / "out")]
    _convert.__name__ = f"convert_{_var.lower()}_10000_characters"
    case(dest="out", refusal=False, check=lambda line, d: (d / "out" / "port_manifest.json").is_file(),
         env={_var: LONG}, timeout=60)(_convert)


def _fifo_said(line: str, d: Path) -> None:
    man = json.loads((d / "out" / "port_manifest.json").read_text())
    assert "tokenizer.json" not in man["output"]["companion_files"], man["output"]
    assert len(man["output"]["not_copied"]) == 1 and "tokenizer.json: a FIFO, not copied" in man["output"]["not_copied"][0]


@case(dest="out", refusal=False, check=_fifo_said, subprocess=True, timeout=60)
def convert_tokenizer_json_is_a_fifo(d):
    """Skipped without a note before; a process of its own: a FIFO that were opened would block it."""
    src = I.hf(d)
    (src / "tokenizer.json").unlink()
    os.mkfifo(src / "tokenizer.json")
    return ["convert", "--hf", str(src), "--out", str(d / "out")]
