"""`port report`: the report never deletes what it did not write, and hostile run files
are notes or one line, never a traceback. The --out fixes belong to the run-directory work."""

from __future__ import annotations

import json
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case


def run_dir(d: Path, **files: str) -> Path:
    """A small run directory: manifest, plan, two metric lines (plus ``files`` overriding any of them)."""
    r = d / "run"
    (r / "checkpoints" / "step_2").mkdir(parents=True)
    (r / "checkpoints" / "step_2" / "state.json").write_text('{"step": 2}')
    base = {"manifest.json": json.dumps({"tool": "port train"}), "plan.json": "{}",
            "metrics.jsonl": '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'}
    for name, text in {**base, **files}.items():
        (r / name.replace("__", ".")).write_text(text) if isinstance(text, str) else (r / name).write_bytes(text)
    return r


@case(dest=None)
def out_is_the_run_dir(d):
    """`port report runs/x --out runs/x` deleted the whole run and exited 0."""
    return ["report", str(run_dir(d)), "--out", str(d / "run")]


@case(dest=None)
def out_is_a_model_dir(d):
    return ["report", str(run_dir(d)), "--out", str(I.hf(d))]


@case(dest=None)
def out_is_a_directory_port_did_not_write(d):
    (d / "mine").mkdir()
    (d / "mine" / "notes.txt").write_text("mine")
    return ["report", str(run_dir(d)), "--out", str(d / "mine")]


@case(dest=None)
def out_is_the_parent_of_the_run(d):
    return ["report", str(run_dir(d)), "--out", str(d)]


@case("not a run directory", dest=None)
def rundir_is_empty(d):
    (d / "run").mkdir()
    return ["report", str(d / "run")]


@case("is a file", dest=None)
def rundir_is_a_file(d):
    (d / "run").write_text("x")
    return ["report", str(d / "run")]


@case(dest=None)
def rundir_missing(d):
    return ["report", str(d / "nope")]


@case(dest="run/report", refusal=False, timeout=30)
def manifest_nested_100000_levels(d):
    return ["report", str(run_dir(d, **{"manifest.json": I.deep_json()}))]


@case(dest="run/report", refusal=False, timeout=30)
def plan_not_utf8(d):
    r = run_dir(d)
    (r / "plan.json").write_bytes(I.NOT_UTF8)
    return ["report", str(r)]


@case(dest="run/report", refusal=False, timeout=30)
def metrics_line_nested_100000_levels(d):
    return ["report", str(run_dir(d, **{"metrics.jsonl": '{"step": 1, "loss": 2.0}\n' + I.deep_object() + "\n"}))]


@case(dest="run/report", refusal=False, timeout=30)
def parity_passed_is_the_string_false(d):
    """"passed": "false" must not be shown as a pass: the report must say FAIL or invalid for it."""
    r = run_dir(d, **{"parity.json": json.dumps({"passed": "false", "checks": []})})
    return ["report", str(r), "--json"]


def _report_reads(line: str, d: Path) -> None:
    assert (d / "out" / "report.md").is_file(), "the report was not written"


@case(dest="out", refusal=False, check=_report_reads)
def metrics_with_a_401_digit_loss(d):
    """A 401-digit loss raised OverflowError in the report's plot; the line is now skipped and counted."""
    r = run_dir(d, metrics__jsonl='{"step": 1, "loss": 2.0}\n{"step": 2, "loss": ' + "9" * 401 + "}\n"
                                 '{"step": 3, "loss": 1.5}\n')
    return ["report", str(r), "--out", str(d / "out")]


@case(dest="out", refusal=False, check=_report_reads)
def metrics_with_non_finite_and_huge_float_losses(d):
    r = run_dir(d, metrics__jsonl='{"step": 1, "loss": NaN}\n{"step": 2, "loss": Infinity}\n'
                                 '{"step": 3, "loss": 1e308}\n{"step": 4, "loss": -1e308, "grad_norm": 1e308}\n'
                                 '{"step": 5, "loss": 1.5}\n')
    return ["report", str(r), "--out", str(d / "out")]


# -- Markdown escaped as HTML is, bounded reads, no link followed out of the run
def _md_has_no_live_content(line: str, d: Path) -> None:
    import re

    md = (d / "out" / "report.md").read_text()
    md = md.replace("![loss](loss.svg) ![step time](step_time.svg) ![memory](memory.svg)", "")   # port's own plots
    assert "evil.example" in md, "the hostile text is shown (escaped), not dropped"
    assert not re.search(r"(?<!\\)!\[", md) and not re.search(r"(?<!\\)\]\(https?://", md), md


@case(dest="out", refusal=False, check=_md_has_no_live_content)
def markdown_image_link_from_a_run_file(d):
    """An image link in a run file was live Markdown in report.md (a viewer fetches the remote image)."""
    r = run_dir(d, **{"ops_scan.json": json.dumps({"ops": [{"op": "x"}], "counts": {},
                                                   "blocking": ["![x](https://evil.example/p.png) [y](https://evil.example)"]})})
    return ["report", str(r), "--out", str(d / "out")]


def _outside_not_shown(line: str, d: Path) -> None:
    md = (d / "out" / "report.md").read_text() + (d / "out" / "report.json").read_text()
    assert "OUTSIDE-SECRET" not in md, "a file outside the run was shown through a link"
    assert "symbolic link" in md


@case(dest="out", refusal=False, check=_outside_not_shown)
def incidents_jsonl_is_a_link_to_a_file_outside_the_run(d):
    import os

    r = run_dir(d)
    (d / "outside.jsonl").write_text(json.dumps({"n": 1, "kind": "OUTSIDE-SECRET", "action": "x"}) + "\n")
    os.symlink(d / "outside.jsonl", r / "incidents.jsonl")
    return ["report", str(r), "--out", str(d / "out")]


@case(dest="out", refusal=False, check=_outside_not_shown)
def evidence_file_is_a_link_to_a_file_outside_the_run(d):
    import os

    r = run_dir(d)
    (d / "outside.json").write_text(json.dumps({"ops": [{"op": "x"}], "counts": {}, "blocking": ["OUTSIDE-SECRET"]}))
    os.symlink(d / "outside.json", r / "ops_scan.json")
    return ["report", str(r), "--out", str(d / "out")]


@case(dest="out", refusal=False, check=_report_reads, timeout=20)
def metrics_jsonl_sparse_2_gb(d):
    r = run_dir(d)
    I.big_sparse(r / "metrics.jsonl", 2 << 30)
    return ["report", str(r), "--out", str(d / "out")]


# -- the comparison `port compare --out RUNDIR/compare.json` leaves for the report (porting/report/compare_section.py)
def _comparison_invalid(line: str, d: Path) -> None:
    md = (d / "run" / "report" / "report.md").read_text()
    assert "invalid compare.json" in md and "baseline comparison (port compare) | **fail**" in md, md


@case(dest="run/report", refusal=False, check=_comparison_invalid, timeout=30)
def compare_json_nested_100000_levels(d):
    return ["report", str(run_dir(d, **{"compare.json": I.deep_json()}))]


@case(dest="run/report", refusal=False, check=_comparison_invalid, timeout=30)
def compare_json_check_passed_is_the_string_true(d):
    """A real comparison whose failed row says "passed": "true": shown as invalid, never as a pass."""
    from tests.baseline.test_document import _measured

    rep = _measured(d, 0.1).to_dict()
    rep["checks"][1]["passed"] = "true"
    rep["ok"] = True
    return ["report", str(run_dir(d, **{"compare.json": json.dumps(rep)}))]


@case(dest="out", refusal=False, check=_outside_not_shown)
def compare_json_is_a_link_to_a_file_outside_the_run(d):
    import os

    r = run_dir(d)
    (d / "outside.json").write_text(json.dumps({"format": "port-compare", "failures": ["OUTSIDE-SECRET"]}))
    os.symlink(d / "outside.json", r / "compare.json")
    return ["report", str(r), "--out", str(d / "out")]


@case("base.json", "expected 'port-compare' version 1", "port compare BASELINE RUNDIR --out", dest=None)
def compare_option_names_a_baseline_file(d):
    import shutil

    from tests.attacks.harness import ROOT

    shutil.copy(ROOT / "tests" / "fixtures" / "baselines" / "imported_tensorboard.json", d / "base.json")
    return ["report", str(run_dir(d)), "--compare", str(d / "base.json"), "--out", str(d / "out")]


# -- issue 51: the step breakdown's records are bounded (porting/rundir/breakdown.py ``_bounds_problem``) and read within
# a total (``MAX_TOTAL_BYTES``); a rehearse.json rung whose name or status is a list is a note, not a TypeError
_BD = {"step": 2, "rank": 0, "source": "mindspore-profiler", "wall_s": 1.0, "compute_s": 0.8, "comm_s": 0.05,
       "host_s": 0.1, "idle_s": 0.05}


def _report_json(d: Path) -> dict:
    return json.loads((d / "out" / "report.json").read_text())


def _rows(d: Path) -> dict[str, dict]:
    return {r["item"]: r for r in _report_json(d)["rows"]}


def _breakdown_case(name: str, record: dict, check):
    def gen(d: Path) -> list[str]:
        r = run_dir(d)
        (r / "breakdown").mkdir()
        (r / "breakdown" / "rank_0.jsonl").write_text(json.dumps(record) + "\n")
        return ["report", str(r), "--out", str(d / "out"), "--json"]
    gen.__name__ = name
    globals()[name] = case(dest="out", refusal=False, check=check, timeout=30)(gen)


def _impossible_skipped(line: str, d: Path) -> None:
    rows, notes = _rows(d), _report_json(d)["notes"]
    assert "exposed communication share" not in rows and "device free share (host + idle)" not in rows, rows
    assert rows["step breakdown per rank"]["status"] == "missing", rows
    assert any("rank_0.jsonl: line 1 skipped" in n for n in notes), notes


for _n, _edit in [("exposed_comm_minus_5000_percent", {"comm_s": -50.0, "host_s": 50.1}),
                  ("comm_above_the_step", {"comm_s": 3.0, "compute_s": 0.0, "host_s": 0.0, "idle_s": -2.0}),
                  ("parts_do_not_add_up", {"compute_s": 0.1}),
                  ("wall_zero", {"wall_s": 0.0, "compute_s": 0.0, "comm_s": 0.0, "host_s": 0.0, "idle_s": 0.0}),
                  ("wall_1e300", {"wall_s": 1e300}),
                  ("phase_negative", {"phases": {"forward": -1.0}}),
                  ("layer_longer_than_the_step", {"layers": {"0": {"forward": 5.0}}}),
                  ("rank_of_another_file", {"rank": 7}),
                  ("collective_negative", {"collectives_s": [-0.5]})]:
    _breakdown_case(f"breakdown_{_n}", {**_BD, **_edit}, _impossible_skipped)


def _gated_right(line: str, d: Path) -> None:
    rows = _rows(d)
    assert rows["exposed communication share"]["status"] == "pass" and "5.0% of the step" in \
        rows["exposed communication share"]["value"], rows
    assert rows["device free share (host + idle)"]["status"] == "warn" and "15.0%" in \
        rows["device free share (host + idle)"]["value"], rows


_breakdown_case("breakdown_real_record_is_gated", _BD, _gated_right)


def _total_bounded(line: str, d: Path) -> None:
    notes = _report_json(d)["notes"]
    assert any("MiB of breakdown records; the rest not read" in n for n in notes), notes[-5:]


@case(dest="out", refusal=False, check=_total_bounded, timeout=30)
def breakdown_512_files_of_16_mib(d):
    """Rank files of 16 MiB each (sparse, one record then NUL bytes) were each read whole, up to 4,096 of them
    (64 GiB); 512 (8 GiB) show the total bound at a tenth of the case's cost."""
    r = run_dir(d)
    (r / "breakdown").mkdir()
    line = (json.dumps(_BD) + "\n").encode()
    for rank in range(512):
        with open(r / "breakdown" / f"rank_{rank}.jsonl", "wb") as f:
            f.write(line.replace(b'"rank": 0', b'"rank": %d' % rank))
            f.truncate(16 << 20)
    return ["report", str(r), "--out", str(d / "out"), "--json"]


def _rung_noted(line: str, d: Path) -> None:
    rows, notes = _rows(d), _report_json(d)["notes"]
    assert any("is not a string" in n for n in notes), notes
    assert rows["run at 1 device"]["status"] != "pass", rows


@case(dest="out", refusal=False, check=_rung_noted, timeout=30)
def rehearse_rung_name_is_a_list(d):
    r = run_dir(d, **{"rehearse.json": json.dumps({"rungs": [{"name": ["single"], "status": "pass"},
                                                            {"name": "node", "status": "pass"}]})})
    return ["report", str(r), "--out", str(d / "out"), "--json"]


@case(dest="out", refusal=False, check=_rung_noted, timeout=30)
def rehearse_rung_status_is_a_list(d):
    r = run_dir(d, **{"rehearse.json": json.dumps({"rungs": [{"name": "single", "status": ["pass"]},
                                                            {"name": "links", "status": {"a": 1}}]})})
    return ["report", str(r), "--out", str(d / "out"), "--json"]
