"""The `port report` section of a bisection: one acceptance row (where MindSpore and torch part, or
that they do not) and a per-layer plot of the relative error, forward and backward.

Evidence: ``RUNDIR/bisect.json`` (``port bisect ... --json > RUNDIR/bisect.json`` or ``port bisect
--baseline BASE RUNDIR --json > RUNDIR/bisect.json``), or the file ``port report --bisect FILE`` names.
Read bounded (:func:`model_zoo.files.read_json_object`); a file of another shape is one line.
"""

from __future__ import annotations

import math
from pathlib import Path

from model_zoo import files
from model_zoo.errors import PortingError
from porting.report.plots import svg_lines
from porting.report.rows import FAIL, PASS, Row

BISECT_FILE = "bisect.json"
MAX_BYTES = 64 << 20
_FLOOR = 1e-12      # a zero error is drawn at 1e-12 on the log axis


def load_bisect(run_dir: Path, path: str | Path | None) -> tuple[dict, Path] | None:
    """The bisection document to show: ``path`` if given (it must load), else RUNDIR/bisect.json when
    it is there, else None."""
    p = Path(path) if path is not None else run_dir / BISECT_FILE
    if path is None and (not p.is_file() or p.is_symlink()):
        return None
    doc = files.read_json_object(p, what="bisect report", max_bytes=MAX_BYTES)
    rows = doc.get("rows")
    if not isinstance(rows, list) or not isinstance(doc.get("verdict"), str) or not all(
            isinstance(r, dict) and isinstance(r.get("phase"), str) for r in rows):
        raise PortingError(f"{p}: expected the JSON of `port bisect --json` (keys rows, verdict); write it with "
                           "port bisect ... --json > FILE")
    return doc, p


def bisect_row(doc: dict, path: Path) -> Row:
    first = doc.get("first_divergent")
    step = f"step {doc['step']}: " if isinstance(doc.get("step"), int) else ""
    value = doc["verdict"][:300] if first is None else (
        f"{step}first divergence at " + (f"layer {first.get('layer')} " if first.get("layer") is not None else "")
        + f"{first.get('block')}, {first.get('phase')}")
    return Row("correctness", "bisect: first divergent layer and phase", FAIL if first else PASS, value, str(path))


def per_layer(doc: dict, phase: str) -> tuple[list[float], list[float]]:
    """(layers, log10 of the largest relative L2 error of the layer's rows in ``phase``)."""
    worst: dict[int, float] = {}
    for r in doc["rows"]:
        m, layer = r.get("metrics"), r.get("layer")
        if r["phase"] != phase or not isinstance(layer, int) or not isinstance(m, dict):
            continue
        v = m.get("rel_l2")
        v = v if isinstance(v, (int, float)) and math.isfinite(v) else math.inf
        worst[layer] = max(worst.get(layer, 0.0), v)
    layers = sorted(worst)
    return [float(i) for i in layers], [math.log10(max(worst[i], _FLOOR)) if math.isfinite(worst[i]) else 3.0
                                        for i in layers]


def bisect_svg(doc: dict) -> str:
    series = [(phase, *per_layer(doc, phase)) for phase in ("forward", "backward")]
    svg = svg_lines("bisect: relative L2 error per layer (log10; non-finite drawn at 3)", series,
                    ylabel="log10 ||ms - torch|| / ||torch||")
    return svg.replace(">step</text>", ">layer</text>")
