"""Read what a `port train` run directory holds, per the run-directory contract (docs/training.md):
manifest.json, metrics.jsonl (one JSON per optimizer step, then a summary line), checkpoints/, hf/.
Every defect is one ConfigError line naming the file and what was expected."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_zoo.errors import ConfigError

REQUIRED_STEP_KEYS = ("step", "loss")


@dataclass
class RunData:
    path: Path
    manifest: dict[str, Any]
    steps: list[dict[str, Any]]            # one per optimizer step, in step order (a resumed step: last record)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def last_step(self) -> int:
        return int(self.steps[-1]["step"])


def _read_manifest(run: Path) -> dict[str, Any]:
    p = run / "manifest.json"
    if not p.is_file():
        raise ConfigError(f"{p}: missing; expected a run directory written by `port train` (manifest.json, metrics.jsonl)")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: corrupt JSON at line {e.lineno} column {e.colno} ({e.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("recipe"), dict):
        raise ConfigError(f"{p}: expected an object with a 'recipe' object (the resolved recipe)")
    return doc


def _read_metrics(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    p = run / "metrics.jsonl"
    if not p.is_file():
        raise ConfigError(f"{p}: missing; the run logged no metrics (did `port train` reach its first step?)")
    by_step: dict[int, dict[str, Any]] = {}
    summary: dict[str, Any] = {}
    bad: list[str] = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            bad.append(f"line {n}: {e.msg}")
            continue
        if not isinstance(row, dict):
            bad.append(f"line {n}: not an object")
        elif row.get("event") == "summary":
            summary = row
        elif "event" in row:
            continue  # other events (resume, checkpoint) are not steps
        elif any(k not in row for k in REQUIRED_STEP_KEYS):
            bad.append(f"line {n}: missing {', '.join(k for k in REQUIRED_STEP_KEYS if k not in row)}")
        else:
            by_step[int(row["step"])] = row  # after a resume the re-run step replaces the earlier record
    if bad:
        raise ConfigError(f"{p}: {len(bad)} bad line(s): {'; '.join(bad[:5])}; expected one JSON object per step")
    if not by_step:
        raise ConfigError(f"{p}: no step records; the run logged no optimizer step")
    return [by_step[k] for k in sorted(by_step)], summary


def read_run(path: str | Path) -> RunData:
    run = Path(path)
    if not run.is_dir():
        raise ConfigError(f"{run}: no such run directory; pass the --out folder of `port train`")
    manifest = _read_manifest(run)
    steps, summary = _read_metrics(run)
    return RunData(run, manifest, steps, summary)
