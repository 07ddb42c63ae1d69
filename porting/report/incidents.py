"""Stability rows of `port report` for a supervised run (`port train --supervise`, porting/launch/supervise.py): one
row per incident, from ``RUN/incidents.jsonl``: when, what was seen, the suspect, what was done, what was lost."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

from porting.report.rows import FAIL, INFO, Row
from porting.rundir import RunRecords
from model_zoo.files import read_text
from porting.launch.supervise import SuperviseError
from porting.rundir.paths import INCIDENTS_FILE


def incident_rows(run: RunRecords) -> list[Row]:
    try:
        incidents = read_incidents(run.path)
    except SuperviseError as e:
        return [Row("stability", "incidents (supervised run)", FAIL, str(e), "incidents.jsonl")]
    out = []
    for inc in incidents:
        when = _when(inc.get("at"))
        who = f"rank {inc['suspect']}" if isinstance(inc.get("suspect"), int) else "no rank named"
        stopped = str(inc.get("action", "")).startswith("stopped")
        out.append(Row("stability", f"incident {inc.get('n')}: {inc.get('kind')}", FAIL if stopped else INFO,
                       f"{when} step {inc.get('step')}: {who}; {inc.get('action')}; {inc.get('steps_lost')} step(s), "
                       f"{inc.get('seconds_lost')} s lost; seen: {inc.get('seen')}",
                       str(inc.get("evidence") or "incidents.jsonl")))
    return out


def _when(at: Any) -> str:
    if isinstance(at, (int, float)) and not isinstance(at, bool) and 0 < at < 1e11:
        return _dt.datetime.fromtimestamp(at, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return "?"


def read_incidents(run_dir: Path) -> list[dict[str, Any]]:
    """``RUN/incidents.jsonl`` (bounded); an unreadable line is skipped."""
    p = run_dir / INCIDENTS_FILE
    if not p.is_file() and not p.is_symlink():
        return []
    out = []
    # a link planted in the run may reach any file: refused, never followed (O_NOFOLLOW)
    text = read_text(p, what="incidents", max_bytes=16 << 20, error=SuperviseError, follow_links=False)
    for line in text.splitlines()[:10_000]:
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):   # a damaged or planted line: skipped, as documented
            continue
        if isinstance(d, dict):
            out.append(d)
    return out
