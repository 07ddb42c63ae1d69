"""The `port report` row of a comparison with the baseline: `port compare`'s verdict, read back as its record.

Evidence: ``RUNDIR/compare.json`` (``port compare BASE RUNDIR --out RUNDIR/compare.json``), or the file
``port report --compare FILE`` names. Read bounded (:func:`model_zoo.files.read_json_object`) and typed
(:func:`porting.baseline.comparison.from_json`): the rows are the :class:`porting.verify.check.Check` rows
`port compare` printed. A file named with ``--compare`` must load (one line when it does not); a malformed
``RUNDIR/compare.json`` is a failed row marked invalid, never a pass, and the rest of the report is made.
"""

from __future__ import annotations

from pathlib import Path

from model_zoo import files
from model_zoo.errors import PortingError
from porting.baseline.comparison import AnyComparison, CurveComparison, from_json
from porting.report.rows import FAIL, PASS, Row
from porting.verify.check import brief

COMPARE_FILE = "compare.json"
MAX_BYTES = 64 << 20     # a comparison is ~400 bytes per step or logged point
ITEM = "baseline comparison (port compare)"
FIX = "write it with port compare BASELINE RUNDIR --out RUNDIR/compare.json"


def load_comparison(run_dir: Path, path: str | Path | None) -> tuple[AnyComparison, Path] | Row | None:
    """The comparison to show and its file: ``path`` if given (it must load), else RUNDIR/compare.json when it is
    there (an invalid one: a failed row saying why), else None."""
    p = Path(path) if path is not None else run_dir / COMPARE_FILE
    if path is None and p.is_symlink():   # a link planted in the run may reach any file: never followed
        return Row("correctness", ITEM, FAIL, f"invalid {COMPARE_FILE}: a symbolic link, not followed (the report "
                   "reads only the run's own files)", COMPARE_FILE)
    if path is None and not p.is_file():
        return None
    try:
        doc = files.read_json_object(p, what="comparison", max_bytes=MAX_BYTES)
        return from_json(doc, str(p)), p
    except (PortingError, ValueError) as e:
        if path is not None:
            raise PortingError(f"{e}; {FIX}") from None
        why = str(e)[len(str(p)):].lstrip(": ") if str(e).startswith(str(p)) else str(e)   # the run's own file
        return Row("correctness", ITEM, FAIL, f"invalid {COMPARE_FILE}: {why}; {FIX}", COMPARE_FILE)


def compare_row(rep: AnyComparison, path: Path) -> Row:
    """PASS or FAIL as `port compare` decided, with its failed rows (or the rows it checked) in brief."""
    kind = "imported CUDA curve" if isinstance(rep, CurveComparison) else "baseline"
    failed = [c for c in rep.checks if not c.passed]
    shown = failed[:3] if failed else list(rep.checks[:3])
    value = (f"{'passed' if rep.ok else 'failed'} against the {kind} {rep.baseline}, {len(rep.checks)} check(s)"
             + "".join(f"; {brief(c)}" for c in shown))
    if not rep.ok and not failed:
        value += "; " + "; ".join(rep.failures[:2])
    return Row("correctness", ITEM, PASS if rep.ok else FAIL, value, str(path))
