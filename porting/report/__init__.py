"""`port report RUNDIR`: the acceptance table of a migrated run, filled from evidence in the run dir.

Rows (correctness, operators, stability, communication, resources, performance, environment;
:mod:`porting.report.rows`) read the run directory through :mod:`porting.rundir` and optional
evidence files written next to it by other commands:

* ``parity.json``  -- ``port verify ... --json > RUNDIR/parity.json``
* ``ops_scan.json`` -- ``port ops scan --hf MODEL --out RUNDIR/ops_scan.json``
* ``rank_table.json`` -- the rank table the run used (checked with ``port ranktable check`` rules)
* ``baseline.json`` -- ``port baseline ... --out RUNDIR/baseline.json`` (or ``port report --baseline
  FILE``): its loss curve is drawn on the run's loss plot
* ``compare.json`` -- ``port compare BASE RUNDIR --out RUNDIR/compare.json`` (or ``port report --compare
  FILE``): a row with `port compare`'s verdict and its result rows (:mod:`porting.report.compare_section`)
* ``bisect.json`` -- ``port bisect ... --json > RUNDIR/bisect.json`` (or ``port report --bisect FILE``):
  a row naming the first divergent layer and phase, and a per-layer error plot
  (:mod:`porting.report.bisect_section`)

Output (:mod:`porting.report.render`, :mod:`porting.report.plots`): ``report.html`` (inline SVG
plots, no network), ``report.md``, ``report.json``, the SVGs and the marker file ``.port-report``,
written into a staged directory (``converters.atomic``) that replaces the destination only when
complete. The destination is never a directory port did not create (:func:`check_out`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from converters import atomic
from model_zoo import files
from model_zoo.errors import PortingError
from porting.report.plots import plots
from porting.report.render import render_html, render_md, render_text
from porting.report.rehearsal import merge, rehearsal_rows
from porting.report.breakdown import breakdown_rows
from porting.report.incidents import incident_rows
from porting.report.rows import Row, build_rows, read_plan
from porting.report.verdict_section import Verdict, verdict as first_screen
from porting.rundir import read_run

if TYPE_CHECKING:
    from porting.baseline.document import Baseline

MARKER = ".port-report"            # identifies a directory `port report` wrote
MARKER_BODY = {"tool": "port report", "format_version": 1}
DEFAULT_DIR = "report"             # RUNDIR/report, the one place inside a run directory a report may go


class ReportError(PortingError):
    """A report destination port may not write (it would replace or mix with something else)."""


@dataclasses.dataclass(frozen=True)
class ReportResult:
    out: Path
    rows: list[Row]
    notes: list[str]
    steps: int
    first_failing_rank: int | None
    verdict: Verdict | None = None   # the first screen (porting/report/verdict_section.py)

    def to_dict(self) -> dict:
        return {"out": str(self.out), "verdict": self.verdict.to_dict() if self.verdict else None,
                "rows": [dataclasses.asdict(r) for r in self.rows], "notes": self.notes,
                "steps": self.steps, "first_failing_rank": self.first_failing_rank}

    def text(self) -> str:
        return render_text(self.out, self.rows, self.notes, self.verdict)


def is_report_dir(d: Path) -> bool:
    """True when ``d`` holds the marker `port report` writes (a regular file with the expected body)."""
    m = d / MARKER
    if m.is_symlink() or not m.is_file():
        return False
    try:
        return files.read_json_object(m, max_bytes=4096) == MARKER_BODY
    except PortingError:
        return False


def check_out(out: Path, run_dir: Path, force: bool) -> bool:
    """Refuse a destination that is, holds or lies inside the run directory (except RUNDIR/report), a
    link, a file, a non-empty directory port did not write, or an earlier report without ``force``.
    Returns whether an earlier report is to be replaced."""
    o, r = out.resolve(), run_dir.resolve()
    if out.is_symlink():
        raise ReportError(f"{out}: is a symbolic link; pass --out a real directory path (port does not write "
                          "through links)")
    if o != (r / DEFAULT_DIR):
        if o == r:
            raise ReportError(f"{out}: is the run directory itself; writing the report there would replace the "
                              f"run. Pass --out a new directory outside it (default: {run_dir / DEFAULT_DIR})")
        if o in r.parents:
            raise ReportError(f"{out}: contains the run directory {run_dir}; pass --out a new directory "
                              "outside it")
        if r in o.parents:
            raise ReportError(f"{out}: is inside the run directory {run_dir}, which holds the run's own files; "
                              f"use the default {run_dir / DEFAULT_DIR} or an --out outside the run directory")
    if not out.exists():
        return False
    if not out.is_dir():
        raise ReportError(f"{out}: exists and is not a directory; pass --out a new directory path")
    if not any(out.iterdir()):
        return False
    if not is_report_dir(out):
        raise ReportError(f"{out}: exists, is not empty and is not a report port wrote (no {MARKER} marker); "
                          "port replaces only its own output: pass --out a new or empty directory")
    if not force:
        raise ReportError(f"{out}: holds an earlier `port report`; pass --force to replace it, or choose "
                          "another --out")
    return True


BASELINE_FILE = "baseline.json"    # RUNDIR/baseline.json: a `port baseline` file drawn with the run's loss


def load_baseline(run_dir: Path, baseline: str | os.PathLike | None) -> Baseline | None:
    """The `port baseline` document to plot: ``baseline`` if given (it must load), else
    RUNDIR/baseline.json when it is there, else None."""
    from porting.baseline import document

    if baseline is not None:
        return document.load(baseline)
    p = run_dir / BASELINE_FILE
    return document.load(p) if p.is_file() and not p.is_symlink() else None


def make_report(rundir: str | os.PathLike, out: str | os.PathLike | None = None, *,
                force: bool = False, baseline: str | os.PathLike | None = None,
                bisect: str | os.PathLike | None = None, compare: str | os.PathLike | None = None) -> ReportResult:
    """Write report.html/.md/.json, the SVG plots and the marker into ``out`` (default RUNDIR/report);
    the loss plot also shows ``baseline`` (a `port baseline` file; default RUNDIR/baseline.json), and ``compare``
    (a `port compare --out` file; default RUNDIR/compare.json) adds its verdict's row."""
    run = read_run(rundir, strict=False)
    dest = Path(out) if out is not None else run.path / DEFAULT_DIR
    replace = check_out(dest, run.path, force)
    plan = read_plan(run)
    rows, diag = build_rows(run, plan)
    rehearsal = rehearsal_rows(run)   # a `port rehearse` folder: its rungs fill the rows of each scale
    rows = merge(rows, rehearsal) if rehearsal else rows
    rows = rows + incident_rows(run)   # a supervised run's incidents (porting/launch/supervise.py)
    rows = rows + breakdown_rows(run)   # where each rank's step time goes (logging.breakdown_every)
    base = load_baseline(run.path, baseline)
    svgs = plots(run, base, plan)
    from porting.report import bisect_section, compare_section

    cmp = compare_section.load_comparison(run.path, compare)
    if cmp is not None:
        rows.append(cmp if isinstance(cmp, Row) else compare_section.compare_row(*cmp))
    screen = first_screen(*cmp) if isinstance(cmp, tuple) else first_screen(None, None)
    bis = bisect_section.load_bisect(run.path, bisect)
    if bis is not None:
        rows.append(bisect_section.bisect_row(*bis))
        svgs["bisect.svg"] = bisect_section.bisect_svg(bis[0])
    res = ReportResult(dest, rows, run.notes, len(run.steps), diag.first_failing_rank if diag else None, screen)
    doc = {"format": "port-report", "format_version": 1, "rundir": str(run.path), **res.to_dict()}
    del doc["out"]
    with atomic.staged_dir(dest.absolute(), replace) as tmp:
        (tmp / "report.html").write_text(render_html(run.path.name, rows, svgs, run.notes, len(run.steps), screen),
                                         encoding="utf-8")
        (tmp / "report.md").write_text(render_md(run.path.name, rows, run.notes, screen), encoding="utf-8")
        for name, svg in svgs.items():
            (tmp / name).write_text(svg, encoding="utf-8")
        (tmp / "report.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
        (tmp / MARKER).write_text(json.dumps(MARKER_BODY) + "\n", encoding="utf-8")
    return res
