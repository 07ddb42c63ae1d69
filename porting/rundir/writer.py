"""The one writer of a run directory: ``manifest.json`` atomically, ``metrics.jsonl`` a line per record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from model_zoo import files
from porting.rundir.reader import read_metrics
from porting.rundir.records import MANIFEST_FILE, METRICS_FILE, RunDirError, RunManifest, StepRecord, SummaryRecord


def _dumps(rec: dict) -> str:
    # NaN/Infinity are written as Python's json writes them (a diverged step's loss); the reader takes them.
    return json.dumps(rec, default=str)


def write_manifest(run_dir: Path, manifest: RunManifest, *, resume_step: int = 0) -> Path:
    """``manifest.json``, or ``manifest_resume_<step>.json`` beside it for a resumed run; atomically."""
    path = run_dir / (MANIFEST_FILE if not resume_step else f"manifest_resume_{resume_step}.json")
    files.write_atomic(path, json.dumps(manifest.to_dict(), indent=2, default=str) + "\n", error=RunDirError)
    return path


class MetricsWriter:
    """Appends records to ``metrics.jsonl``, one line each, flushed as written (a kill loses at most the
    line being written, which the reader skips and counts)."""

    def __init__(self, run_dir: Path, *, keep_through_step: int = 0):
        self.path = run_dir / METRICS_FILE
        self._keep(keep_through_step)
        try:
            self._f: IO[str] | None = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise RunDirError(f"{self.path}: cannot open for writing ({e.strerror}); check the run directory") from None

    def _keep(self, through: int) -> None:
        """A fresh run starts empty; a resumed one keeps the steps up to its checkpoint (a killed run may
        have logged later steps, which it runs again), rewritten atomically."""
        self.note: str | None = None   # what the kept file had that was not kept (malformed lines)
        if not self.path.exists():
            return
        old = read_metrics(self.path) if through else None
        self.note = old.warning if old else None
        kept = old.steps if old else []
        files.write_atomic(self.path, "".join(_dumps(r.to_dict()) + "\n" for r in kept if r.step <= through),
                           error=RunDirError)

    def _write(self, rec: dict) -> None:
        assert self._f is not None, "MetricsWriter used after close()"
        try:
            self._f.write(_dumps(rec) + "\n")
            self._f.flush()
        except OSError as e:
            raise RunDirError(f"{self.path}: cannot write a metrics record ({e.strerror}); free disk space "
                              "and rerun with --resume") from None

    def step(self, rec: StepRecord) -> None:
        self._write(rec.to_dict())

    def summary(self, rec: SummaryRecord) -> None:
        self._write(rec.to_dict())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
