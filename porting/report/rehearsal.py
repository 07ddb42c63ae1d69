"""Rows of `port report` filled from a rehearsal (`port rehearse`, porting/rehearse.py): its rungs are runs at
one device, one node with the recipe's groups, and two node ranks, so one rehearsal folder fills the
stability rows a single run directory cannot, plus each rung's compile time and diagnosis."""

from __future__ import annotations

from typing import Any

from porting.report.rows import FAIL, INFO, MISSING, PASS, Row, _evidence
from porting.rundir import RunRecords

SCALES = {"single": "1 device", "node": "single-node multi-device", "two-nodes": "multi-node"}
STATUS = {"pass": PASS, "fail": FAIL}


def rehearsal_rows(run: RunRecords) -> list[Row] | None:
    """Rows from ``rehearse.json`` beside the run (None when there is none, or it is not a rehearsal)."""
    doc = _evidence(run, "rehearse.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("rungs"), list):
        return None
    rungs = _rungs(doc["rungs"], run.notes)
    out = []
    for name, label in SCALES.items():
        r = rungs.get(name) or {}
        status = STATUS.get(r.get("status"), MISSING if r.get("status") in (None, "not run") else INFO)
        value = f"{r.get('status') or 'absent'}: " + (f"[{r['layout']}] " if r.get("layout") else "") + str(r.get("detail", ""))
        out.append(Row("stability", f"run at {label}", status, value, f"rehearse.json rung {name}"))
    for name, r in rungs.items():
        d = r.get("diagnosis")
        if isinstance(d, dict):
            who = f"rank {d.get('first_failing_rank')}" if d.get("first_failing_rank") is not None else "no rank named"
            out.append(Row("communication", f"diagnosis of rung {name}", FAIL, f"{who}: {d.get('reason')}",
                           f"rungs/{name}/logs"))
        comp = r.get("compile_s")
        if isinstance(comp, (int, float)) and not isinstance(comp, bool):
            out.append(Row("performance", f"compile, rung {name}", INFO,
                           f"{comp:.2f} s over the compile step(s); rung took {_num(r.get('seconds'))} s",
                           f"rungs/{name}/metrics.jsonl"))
    links = rungs.get("links") or {}
    if links.get("status") in ("pass", "fail"):
        out.append(Row("communication", "collective bus bandwidth per group (rehearsal)", STATUS[links["status"]],
                       str(links.get("detail", "")), "rehearse.json rung links"))
    par = rungs.get("parity") or {}
    out.append(Row("correctness", "rehearsal parity (forward and backward vs HF)",
                   STATUS.get(par.get("status"), MISSING if par.get("status") in (None, "not run") else INFO),
                   str(par.get("detail", "")), "rehearse.json rung parity"))
    return out


def _rungs(listed: list, notes: list[str]) -> dict[str, dict]:
    """The rungs by name: a rung whose name is not a string is skipped, one whose status is not a string is shown
    without one (as not run), each with a note; never a TypeError on a list where a name or status belongs."""
    out: dict[str, dict] = {}
    for i, r in enumerate(listed[:64]):
        if not isinstance(r, dict):
            continue
        if not isinstance(r.get("name"), str):
            notes.append(f"rehearse.json: rung {i + 1}: name {str(r.get('name'))[:40]!r} is not a string; skipped")
            continue
        if "status" in r and not isinstance(r["status"], str):
            notes.append(f"rehearse.json: rung {r['name'][:40]!r}: status {str(r['status'])[:40]!r} is not a string; "
                         "shown as not run")
            r = {**r, "status": None}
        out[r["name"]] = r
    return out


def _num(x: Any) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"


def merge(rows: list[Row], extra: list[Row]) -> list[Row]:
    """``rows`` with each row of the same (area, item) replaced by ``extra``'s; the rest of ``extra`` after
    the last row of its area."""
    by = {(r.area, r.item): r for r in extra}
    out = [by.pop((r.area, r.item), r) for r in rows]
    for r in extra:
        if (r.area, r.item) in by:
            last = max((i for i, o in enumerate(out) if o.area == r.area), default=len(out) - 1)
            out.insert(last + 1, r)
    return out
