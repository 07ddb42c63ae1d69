"""The one reader of a run directory, under the reading rules of ``porting/rundir/__init__.py``: the last
record of a step wins, malformed lines are skipped and counted, everything is bounded."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from model_zoo import files
from porting.rundir.records import (
    MANIFEST_FILE,
    MAX_LINE_BYTES,
    MAX_METRICS_BYTES,
    MAX_RECORD_DEPTH,
    METRICS_FILE,
    PLAN_FILE,
    RunDirError,
    RunManifest,
    StepRecord,
    SummaryRecord,
    step_from,
    summary_from,
)
from porting.rundir.paths import RunDir


@dataclass
class Metrics:
    """What ``metrics.jsonl`` holds under the reading rules (module docstring)."""

    path: Path
    steps: list[StepRecord]
    summary: SummaryRecord | None = None
    skipped: int = 0              # malformed lines skipped
    first_skipped: str = ""       # "line N: why" of the first one
    duplicates: int = 0           # step records replaced by a later record of the same step

    @property
    def warning(self) -> str | None:
        if not self.skipped:
            return None
        return (f"{self.path}: {self.skipped} malformed line(s) skipped (first: {self.first_skipped}); "
                "a run killed mid-write cuts its last line")


def _parse_line(raw: bytes, where: str) -> dict:
    if len(raw) > MAX_LINE_BYTES:
        raise RunDirError(f"{where}: longer than {MAX_LINE_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunDirError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x})") from None
    doc = files.parse_json(text, where=where, what="record", max_depth=MAX_RECORD_DEPTH, error=RunDirError)
    if not isinstance(doc, dict):
        raise RunDirError(f"{where}: expected a JSON object, found {type(doc).__name__}")
    return doc


def _lines(f: IO[bytes]):
    """Lines of a binary file, each cut at MAX_LINE_BYTES + 1 bytes (the rest of an over-long line is
    read in bounded pieces and dropped, so that line is skipped as too long, in constant memory)."""
    while raw := f.readline(MAX_LINE_BYTES + 1):
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
        yield raw


def read_metrics(path: str | Path) -> Metrics:
    """Every step (last record per step, in step order) and the last summary of ``metrics.jsonl``."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise RunDirError(f"{p}: missing; the run logged no metrics (did `port train` reach its first step?)") from None
    except OSError as e:
        raise RunDirError(f"{p}: cannot read ({e.strerror})") from None
    if not p.is_file():
        raise RunDirError(f"{p}: expected a regular file, found something else; pass a run directory of `port train`")
    if size > MAX_METRICS_BYTES:
        raise RunDirError(f"{p}: {size:,} bytes, more than the {MAX_METRICS_BYTES:,} a metrics file may have")
    out = Metrics(p, [])
    by_step: dict[int, StepRecord] = {}
    try:
        with open(p, "rb") as f:
            for n, raw in enumerate(_lines(f), 1):
                if not raw.strip():
                    continue
                where = f"line {n}"
                try:
                    doc = _parse_line(raw.rstrip(b"\r\n"), where)
                    event = doc.get("event")
                    if event == "summary":
                        out.summary = summary_from(doc, where)
                    elif event is None:
                        rec = step_from(doc, where)
                        out.duplicates += rec.step in by_step
                        by_step[rec.step] = rec
                    # other events are not steps and carry nothing this version reads
                except RunDirError as e:
                    out.skipped += 1
                    out.first_skipped = out.first_skipped or str(e)
    except OSError as e:
        raise RunDirError(f"{p}: cannot read ({e.strerror})") from None
    out.steps = [by_step[k] for k in sorted(by_step)]
    return out


def read_manifest(path: str | Path) -> RunManifest:
    p = Path(path)
    if not p.exists():
        raise RunDirError(f"{p}: missing; expected a run directory written by `port train` "
                          f"({MANIFEST_FILE}, {METRICS_FILE})")
    doc = files.read_json(p, what="JSON", error=RunDirError)
    return RunManifest.from_dict(doc, str(p))


@dataclass
class RunRecords:
    """A run directory as read: the manifest, the steps and summary, the plan, and notes on what was
    unreadable (tolerant reads) or skipped."""

    path: Path
    manifest: RunManifest | None
    steps: list[StepRecord]
    summary: SummaryRecord | None = None
    plan: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def dir(self) -> "RunDir":
        """The run directory's paths (porting/rundir/paths.py)."""
        return RunDir(self.path)

    @property
    def last_step(self) -> int:
        return self.steps[-1].step if self.steps else 0


def _note(exc: RunDirError, path: Path) -> str:
    """A reader error as a report note: the file's name instead of its full path."""
    msg = str(exc)
    return path.name + msg[len(str(path)):] if msg.startswith(str(path)) else f"{path.name}: {msg}"


def _tolerant(fn, notes: list[str], path: Path):
    """``fn(path)``, or None with a note when the file is absent or unreadable (tolerant reads)."""
    if not path.exists():
        return None
    try:
        return fn(path)
    except RunDirError as e:
        notes.append(_note(e, path))
        return None


def read_run(path: str | os.PathLike, *, strict: bool = True) -> RunRecords:
    """Read a run directory. ``strict`` (compare, probe): manifest.json and at least one step must be
    readable, else one RunDirError line. Not strict (report): whatever is unreadable becomes a note."""
    run = Path(path)
    if not run.exists():
        raise RunDirError(f"{run}: no such run directory; pass the run directory (--run-dir) of `port train`")
    if not run.is_dir():
        raise RunDirError(f"{run}: is a file; pass the run directory (with {MANIFEST_FILE}, {METRICS_FILE})")
    notes: list[str] = []
    if strict:
        manifest = read_manifest(run / MANIFEST_FILE)
        metrics = read_metrics(run / METRICS_FILE)
        if not metrics.steps:
            raise RunDirError(f"{metrics.path}: no step records; the run logged no optimizer step"
                              + (f" ({metrics.warning})" if metrics.warning else ""))
        plan = _read_plan(run, notes)
    else:
        manifest = _tolerant(read_manifest, notes, run / MANIFEST_FILE)
        metrics = _tolerant(read_metrics, notes, run / METRICS_FILE)
        plan = _read_plan(run, notes)
        if manifest is None and plan is None and metrics is None and not RunDir(run).logs.is_dir():
            raise RunDirError(f"{run}: not a run directory (no {MANIFEST_FILE}, {PLAN_FILE}, {METRICS_FILE} or "
                              f"logs/); run `port train RECIPE` first" + (f" ({notes[0]})" if notes else ""))
        metrics = metrics or Metrics(run / METRICS_FILE, [])
    if metrics.warning:
        notes.append(_note(RunDirError(metrics.warning), metrics.path))
    return RunRecords(run, manifest, metrics.steps, metrics.summary, plan, notes)


def _read_plan(run: Path, notes: list[str]) -> dict | None:
    """``plan.json`` (written by `port train` from the dry-run plan); unreadable: a note, not an error."""
    return _tolerant(lambda p: files.read_json_object(p, what="run plan", error=RunDirError), notes, run / PLAN_FILE)
