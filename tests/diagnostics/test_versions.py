"""The versions port declares and how honestly it labels them: Python 3.9-3.12, MindSpore up to 2.11 (paired,
not run by CI: "untested pairing" in `port doctor`, the manifest and `port report`), what MindSpore 2.11's
release notes change that port calls, and msprobe's own version table. A stand-in version is the version
the doctor reads (porting.env.package_version), never MindSpore itself."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from porting import env
from porting.diagnostics import doctor
from tests.helpers import port

ROOT = Path(__file__).resolve().parents[2]
LINE_211 = ("untested pairing: MindSpore 2.11.0 is paired with CANN 9.2.0 / HDK 26.2.RC1 (MindSpore Transformers' "
            "VERSION_MAP), not run by port's CI")


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _stand_in(monkeypatch, ms: str) -> None:
    real = env.package_version
    monkeypatch.setattr(env, "package_version", lambda name: ms if name == "mindspore" else real(name))


def test_python_range_is_pyproject_s_and_this_python_is_in_it():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(_pyproject()["requires-python"])
    assert [v for v in ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13") if f"{v}.0" in spec] == \
        [".".join(map(str, p)) for p in doctor.PYTHONS]
    assert sys.version_info[:2] in doctor.PYTHONS
    rep = doctor.doctor_report(environ={})
    assert next(c for c in rep["checks"] if c["check"] == "python")["status"] == "ok"


def test_mindspore_range_reaches_2_11_and_stops_before_2_12():
    from packaging.specifiers import SpecifierSet

    ms = next(d for d in _pyproject()["dependencies"] if d.startswith("mindspore"))
    spec = SpecifierSet(ms[len("mindspore"):])
    assert "2.11.0" in spec and "2.7.0" in spec and "2.12.0" not in spec and "2.6.0" not in spec
    assert doctor.pairing("2.11.0")["supported"] and not doctor.pairing("2.12.0")["supported"]


def test_doctor_on_a_2_11_pairing_says_untested_pairing(monkeypatch):
    _stand_in(monkeypatch, "2.11.0")
    rows = {c["check"]: c for c in doctor.check_mindspore_cann("2.11.0", "9.2.0", "26.2.RC1")}
    assert rows["mindspore range"]["status"] == "ok" and "not run by port's CI" in rows["mindspore range"]["detail"]
    assert rows["mindspore pairing"] == {"check": "mindspore pairing", "status": "warn", "detail": LINE_211}
    assert rows["mindspore/cann"]["status"] == "ok" and rows["cann/driver"]["status"] == "ok"
    rep = doctor.doctor_report(environ={})
    assert rep["versions"]["packages"]["mindspore"] == "2.11.0"
    assert rep["untested_pairing"] == LINE_211 and rep["ok"] is True
    notes = [c["detail"] for c in rep["checks"] if c["check"] == "mindspore changes"]
    assert len(notes) == 2 and all("MindSpore 2.11.0" in n and "release notes" in n for n in notes)
    assert LINE_211 in doctor.render_text(rep)


@pytest.mark.parametrize("ms,untested", [("2.10.0", False), ("2.7.2", False), ("2.9.0", True), ("2.7.1", True)])
def test_only_releases_without_a_ci_tier_are_untested(monkeypatch, ms, untested):
    _stand_in(monkeypatch, ms)
    rep = doctor.doctor_report(environ={})
    assert (rep["untested_pairing"] is not None) is untested
    assert not [c for c in rep["checks"] if c["check"] == "mindspore changes"]   # 2.11's notes only from 2.11 on


def test_report_shows_the_untested_pairing_a_manifest_recorded(monkeypatch, tmp_path):
    from porting.report import make_report
    from tests.report.test_report import write_run

    _stand_in(monkeypatch, "2.11.0")
    run = write_run(tmp_path / "run")   # port train writes doctor_report() into the manifest as "doctor"
    monkeypatch.undo()
    res = make_report(run)
    row = next(r for r in res.rows if r.item == "untested pairing")
    assert (row.area, row.status, row.value) == ("environment", "warn", LINE_211)
    assert LINE_211.replace("_", "\\_") in (run / "report" / "report.md").read_text()   # Markdown-escaped


def test_every_grad_port_takes_is_with_respect_to_float_weights_only():
    """MindSpore 2.11.0's one incompatible change (PR 93133): a grad with respect to a non-differentiable dtype
    raises. port is unaffected while every value_and_grad differentiates weights only (grad_position=None) and
    every trainable weight is floating point; this test fails the day either stops being true."""
    calls = []
    for path in sorted((ROOT / "porting").rglob("*.py")) + sorted((ROOT / "model_zoo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "value_and_grad", "grad", "GradOperation"):
                pos = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "grad_position"), None)
                calls.append((path.relative_to(ROOT).as_posix(), node.lineno, ast.unparse(pos) if pos else None))
    assert len(calls) >= 4, calls   # train step, ZeRO step, parity, bisect
    assert all(pos == "None" for _, _, pos in calls), calls
    import mindspore as ms

    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    for dtype in ("float32", "bfloat16"):
        params = build(cfg, param_dtype=dtype).trainable_params()
        assert params and all(p.dtype in (ms.float32, ms.float16, ms.bfloat16) for p in params), dtype


def test_release_notes_entries_name_their_source():
    for c in doctor.compat_table()["mindspore_changes"]:
        assert c["source"].startswith("MindSpore ") and "release notes" in c["source"] and c["port"], c
    assert doctor.release_changes("2.11.0") and not doctor.release_changes("2.10.0")


@pytest.mark.parametrize("ms,warns", [("2.7.1", False), ("2.4.0", False), ("2.10.0", True), ("2.7.2", True),
                                      ("2.11.0", True), (None, False)])
def test_msprobe_note_follows_msprobe_s_own_table(ms, warns):
    note = doctor.msprobe_note(ms)
    assert (note is not None) is warns
    if note:
        assert note.startswith("warning: ") and f"MindSpore {ms}" in note and "2.4.0, 2.5.0, 2.6.0, 2.7.1" in note


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_bisect_msprobe_mapping_warns_outside_msprobe_s_table(tmp_path):
    from importlib.metadata import version

    out = tmp_path / "cell_mapping.yaml"
    # in this process (tests/helpers.py `port`): the warning and the file are the subject, not the process
    r = port("bisect", "--hf", "stories260k", "--msprobe-mapping", str(out), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert out.is_file()
    installed = version("mindspore")
    warned = re.search(r"^warning: msprobe's version table", r.stderr, re.M) is not None
    assert warned is (installed not in doctor.compat_table()["tools"]["msprobe"]["mindspore"]), r.stderr


def _stand_in_wheel(folder: Path, version: str) -> None:
    """A wheel named mindspore ``version`` holding metadata only: how to ask pip's resolver about a release the
    package registry does not have (2.11.0 is paired by MindSpore Transformers 2.1.0 but not published there)."""
    import zipfile

    info = f"mindspore-{version}.dist-info"
    files = {"mindspore/__init__.py": "",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: mindspore\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: port-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"mindspore-{version}-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def test_pip_resolver_accepts_port_beside_mindspore_2_11_and_refuses_2_12(tmp_path):
    """`pip install --dry-run -e . mindspore==X` against stand-in wheels, offline (--no-index: port's other
    dependencies are the ones installed here): the metadata range, as pip's resolver reads it."""
    for v in ("2.11.0", "2.12.0"):
        _stand_in_wheel(tmp_path, v)
    answers = {}
    for v in ("2.11.0", "2.12.0"):
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links",
                            str(tmp_path), "--no-build-isolation", "--disable-pip-version-check", "-e", str(ROOT),
                            f"mindspore=={v}"], capture_output=True, text=True, timeout=300)
        answers[v] = (r.returncode, r.stdout + r.stderr)
    assert answers["2.11.0"][0] == 0 and re.search(r"Would install .*mindspore-2\.11\.0", answers["2.11.0"][1]), \
        answers["2.11.0"][1][-2000:]
    assert answers["2.12.0"][0] != 0 and "ResolutionImpossible" in answers["2.12.0"][1], answers["2.12.0"][1][-2000:]
