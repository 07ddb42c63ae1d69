"""The `port report` row of `port diverge`'s verdict: where this run and another part, or that they do not.

Evidence: ``RUNDIR/diverge.json`` (``port diverge RUNDIR OTHER --out RUNDIR/diverge.json``), read bounded; a file of
another shape is one line (docs/diverge.md)."""

from __future__ import annotations

from pathlib import Path

from model_zoo import files
from model_zoo.errors import PortingError
from porting.report.rows import FAIL, PASS, Row
from porting.rundir.paths import RunDir

MAX_BYTES = 1 << 20


def diverge_row(run_dir: Path) -> Row | None:
    """The verdict's row, or None when the run directory holds no ``diverge.json``."""
    p = RunDir(run_dir).diverge
    if not p.is_file() or p.is_symlink():
        return None
    doc = files.read_json_object(p, what="diverge verdict", max_bytes=MAX_BYTES)
    verdict, first = doc.get("verdict"), doc.get("first")
    if doc.get("format") != "port-diverge" or verdict not in ("diverged", "bitwise_equal", "within_envelope") \
            or not (first is None or isinstance(first, dict)):
        raise PortingError(f"{p}: expected the verdict `port diverge A B --out FILE` writes (format port-diverge); "
                           "write it again with port diverge")
    other = str(doc.get("b", ""))[:200]
    if first is not None:
        layer = f" (layer {first.get('layer')})" if isinstance(first.get("layer"), int) else ""
        c = first.get("collective") if isinstance(first.get("collective"), dict) else {}
        cause = {"output": " (inputs matched, outputs did not)", "input": " (the all-reduce inputs differed)"}.get(
            c.get("side") if c.get("inputs") != "not compared" else None, "")
        value = (f"parts at step {first.get('step')}: {first.get('phase')} of {str(first.get('name'))[:200]}{layer}"
                 f"{cause}, from {other}")
    else:
        through = doc.get("bitwise_equal_through")
        value = (f"no divergence from {other} over {len(doc.get('steps_compared') or [])} sampled steps"
                 + (f"; bitwise equal up to step {through}" if isinstance(through, int) else ""))
    return Row("correctness", "diverge: where this run and another part", FAIL if first else PASS, value, str(p))
