"""The one writer of a run directory: ``manifest.json`` atomically, ``metrics.jsonl`` a line per record."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from model_zoo import files
from porting.rundir.reader import read_metrics
from porting.rundir.paths import INCIDENTS_FILE
from porting.rundir.records import MANIFEST_FILE, METRICS_FILE, PLAN_FILE, RunDirError, RunManifest, StepRecord, SummaryRecord


def _dumps(rec: dict) -> str:
    # NaN/Infinity are written as Python's json writes them (a diverged step's loss); the reader takes them.
    return json.dumps(rec, default=str)


# What a run writes besides its records: a directory (created if absent) or a file, and what goes there.
SIDE_DIRS = {"logs": "the rank logs", "checkpoints": "checkpoints", "tensorboard": "TensorBoard events",
             "hf": "the HF export", "incidents": "a supervised run's incident evidence",
             "supervise": "the supervisor's launch logs"}
SIDE_FILES = (MANIFEST_FILE, METRICS_FILE, PLAN_FILE)
SIDE_FILES_OF = {"incidents": (INCIDENTS_FILE,)}   # written with a side directory: checked with it
PROBE_BYTES = 1 << 16


def check_side_paths(run_dir: Path, dirs: tuple[str, ...]) -> None:
    """Before a step runs: every place the run will write (``dirs`` of :data:`SIDE_DIRS`, the record
    files) is usable, else one RunDirError line. A side directory is a real directory or absent (never a
    file or a link out of the run directory), and a file is written there for real (a read-only or full
    disk is found now, not at the end of a finished run)."""
    for name in SIDE_FILES + tuple(f for d in dirs for f in SIDE_FILES_OF.get(d, ())):
        p = run_dir / name
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise RunDirError(f"{p}: exists and is not a regular file (a directory or a link); port writes {name} "
                              "there: remove it or choose another --run-dir")
    where = [run_dir]
    for name in dirs:
        p = run_dir / name
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            raise RunDirError(f"{p}: exists and is not a directory (a file or a link); port writes {SIDE_DIRS[name]} "
                              "there: remove it or choose another --run-dir")
        if name == "hf" and p.is_dir() and any(p.iterdir()) and not (p / "port_manifest.json").is_file():
            raise RunDirError(f"{p}: holds files port did not write (no port_manifest.json); the HF export would "
                              "replace them: move them away or set checkpointing.export_hf=false")
        if p.is_dir():
            where.append(p)
    for d in where:
        _probe_write(d)


def _probe_write(d: Path) -> None:
    import tempfile

    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".port-probe-")
        with open(fd, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise RunDirError(f"{d}: cannot write there ({e.strerror}); the run writes its records, logs and checkpoints "
                          "under the run directory: check its permissions and free space, or choose another "
                          "--run-dir") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


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
