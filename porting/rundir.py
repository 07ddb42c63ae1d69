"""The run directory of `port train`: its records, their one writer and their one reader.

A run directory holds ``manifest.json`` (:class:`RunManifest`: what ran, with which versions, recipe,
model and data), ``metrics.jsonl`` (one :class:`StepRecord` per optimizer step, then one
:class:`SummaryRecord`), ``plan.json`` (the dry-run plan), ``logs/``, ``checkpoints/`` and ``hf/``.
The format is documented once, in docs/rundir.md; ``FORMAT_VERSION`` is written into the manifest
and the summary.

Reading rules (the same for `port report`, `port compare`, the logits probe and the tests):

* A step that appears more than once (a resumed run re-runs the steps after its checkpoint) counts
  once: the **last** record of that step wins. Steps come back in step order.
* A line of ``metrics.jsonl`` that is not a valid record (cut by a kill mid-write, not UTF-8, not
  JSON, not an object, a known key of the wrong type) is **skipped and counted**; the reader says
  how many and which was first (:attr:`Metrics.warning`). Nothing is silently dropped.
* Everything is bounded: the manifest by ``model_zoo.files`` (size, JSON depth), every metrics line
  by :data:`MAX_LINE_BYTES` and :data:`MAX_RECORD_DEPTH`, the metrics file by :data:`MAX_METRICS_BYTES`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from model_zoo import files
from model_zoo.errors import PortingError

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
METRICS_FILE = "metrics.jsonl"
PLAN_FILE = "plan.json"
MAX_METRICS_BYTES = 1 << 30     # ~2.5 million steps of ~400 bytes
MAX_LINE_BYTES = 1 << 20        # a step record is ~400 bytes
MAX_RECORD_DEPTH = 8            # a step record nests 2 levels (the shapes list)

_NUM = (int, float)


class RunDirError(PortingError):
    """A run directory (or one of its records) is missing, malformed or of an unknown format version."""


def _type_problem(doc: dict, spec: dict[str, tuple[type, ...]], where: str) -> str | None:
    """The first known key whose value has the wrong type ("found X, expected Y"); None when all fit."""
    for key, types in spec.items():
        v = doc.get(key)
        if v is None:
            continue
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            want = " or ".join({int: "an integer", float: "a number", str: "a string", bool: "true/false",
                                dict: "an object", list: "a list"}[t] for t in types if not (t is int and float in types))
            return f"{where}: key '{key}' is {type(v).__name__} {json.dumps(v)[:40]}, expected {want}"
    return None


def _known(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} - {"extra"}


def _asdict(rec: Any) -> dict[str, Any]:
    """A record as written: known fields that are set, then the unknown keys it was read with."""
    out = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.name != "extra"}
    out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items() if v is not None}
    return {**out, **rec.extra}


# ------------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class ModelInfo:
    """The model the run trained: its source (zoo name or path), where it was read, its config.json."""

    source: str | None = None
    dir: str | None = None
    config: dict | None = None
    parameters: int | None = None


_MODEL_SPEC = {"source": (str,), "dir": (str,), "config": (dict,), "parameters": (int,)}


@dataclass(frozen=True)
class RunManifest:
    """``manifest.json`` (``manifest_resume_<step>.json`` for a resumed run)."""

    recipe: dict                                  # the resolved recipe (porting.train.recipe.recipe_dict)
    model: ModelInfo = field(default_factory=ModelInfo)
    versions: dict = field(default_factory=dict)  # porting.env.versions()
    doctor: dict | None = None                    # porting.diagnostics.doctor.doctor_report()
    data: dict = field(default_factory=dict)      # the data report (path, rows, examples, sha256, ...)
    bucketing: dict = field(default_factory=dict)
    seed: int | None = None
    world_size: int | None = None
    command: tuple[str, ...] = ()
    started: str | None = None                    # ISO 8601, UTC
    resumed_from_step: int | None = None
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)     # keys this version does not know, kept as read

    def to_dict(self) -> dict[str, Any]:
        out = _asdict(self)
        out["model"] = {k: v for k, v in dataclasses.asdict(self.model).items() if v is not None}
        out["resumed_from_step"] = self.resumed_from_step   # null on a fresh run, as documented
        return out

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> RunManifest:
        if not isinstance(doc, dict):
            raise RunDirError(f"{where}: expected a JSON object, found {type(doc).__name__}")
        version = doc.get("format_version", FORMAT_VERSION)   # absent: written before the field existed
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
            raise RunDirError(f"{where}: format_version {json.dumps(version)[:40]} is not one this port reads "
                              f"(1..{FORMAT_VERSION}); read it with the port version that wrote it")
        if not isinstance(doc.get("recipe"), dict):
            raise RunDirError(f"{where}: expected a 'recipe' object (the resolved recipe); found "
                              f"{type(doc.get('recipe')).__name__}; is this a run directory of `port train`?")
        spec = {"model": (dict,), "versions": (dict,), "doctor": (dict,), "data": (dict,), "bucketing": (dict,),
                "seed": (int,), "world_size": (int,), "command": (list,), "started": (str,),
                "resumed_from_step": (int,)}
        problem = _type_problem(doc, spec, where) or _type_problem(doc.get("model") or {}, _MODEL_SPEC,
                                                                   f"{where}: model")
        if problem:
            raise RunDirError(problem + "; fix or remove that key")
        model = doc.get("model") or {}
        known = _known(cls)
        return cls(recipe=doc["recipe"], model=ModelInfo(**{k: model.get(k) for k in _MODEL_SPEC}),
                   versions=doc.get("versions") or {}, doctor=doc.get("doctor"), data=doc.get("data") or {},
                   bucketing=doc.get("bucketing") or {}, seed=doc.get("seed"), world_size=doc.get("world_size"),
                   command=tuple(str(c) for c in doc.get("command") or ()), started=doc.get("started"),
                   resumed_from_step=doc.get("resumed_from_step"), format_version=version,
                   extra={k: v for k, v in doc.items() if k not in known})


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step. Token counts are global (all ranks); times are rank 0's."""

    step: int                           # 1-based
    loss: float | None                  # mean loss per label token; null/NaN when not finite
    epoch: int | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None           # real (non-padding) tokens
    loss_tokens: int | None = None      # tokens the loss is averaged over
    padded_tokens: int | None = None    # tokens including padding
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    padding_fraction: float | None = None
    compile: bool = False               # the step compiled a new graph (a new shape)
    shapes: tuple[int, ...] = ()        # sequence lengths of the micro-batches
    loss_scale: float | None = None
    skipped: bool = False               # dynamic loss scaling skipped the update (overflow)
    host_rss_gib: float | None = None   # host RSS at the end of the step
    host_rss_peak_gib: float | None = None
    device_peak_gib: float | None = None
    comm_wait_s: float | None = None    # rank 0's wait in the timed all-reduce of a sampled step (train/commwait.py)
    comm_wait_ranks_s: tuple[float, ...] | None = None   # every rank's wait on that step, index = rank
    eval_loss: float | None = None      # mean held-out loss (data.eval_split), on the steps it was measured
    eval_perplexity: float | None = None
    eval_tokens: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "loss": self.loss, **_asdict(self)}


_STEP_SPEC: dict[str, tuple[type, ...]] = {
    "step": (int,), "loss": _NUM, "epoch": (int,), "lr": _NUM, "grad_norm": _NUM, "tokens": (int,),
    "loss_tokens": (int,), "padded_tokens": (int,), "tokens_per_s": _NUM, "step_time_s": _NUM,
    "padding_fraction": _NUM, "compile": (bool,), "shapes": (list,), "loss_scale": _NUM, "skipped": (bool,),
    "host_rss_gib": _NUM, "host_rss_peak_gib": _NUM, "device_peak_gib": _NUM, "comm_wait_s": _NUM,
    "comm_wait_ranks_s": (list,), "eval_loss": _NUM, "eval_perplexity": _NUM, "eval_tokens": (int,)}


@dataclass(frozen=True)
class SummaryRecord:
    """The last line of a finished run's metrics (``"event": "summary"``)."""

    steps: int | None = None
    compile_steps: int | None = None
    compile_time_s: float | None = None
    steady_tokens_per_s: float | None = None
    steady_step_time_s: float | None = None
    compiled_graphs: int | None = None
    shapes_seen: int | None = None
    bucket_shapes: int | None = None
    padding_fraction: float | None = None
    final_loss: float | None = None
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"event": "summary", **_asdict(self)}


_SUMMARY_SPEC: dict[str, tuple[type, ...]] = {
    "steps": (int,), "compile_steps": (int,), "compile_time_s": _NUM, "steady_tokens_per_s": _NUM,
    "steady_step_time_s": _NUM, "compiled_graphs": (int,), "shapes_seen": (int,), "bucket_shapes": (int,),
    "padding_fraction": _NUM, "final_loss": _NUM, "format_version": (int,)}


def _step_from(doc: dict, where: str) -> StepRecord:
    for k in ("step", "loss"):
        if k not in doc:
            raise RunDirError(f"{where}: missing key '{k}'")
    problem = _type_problem(doc, _STEP_SPEC, where)
    if problem:
        raise RunDirError(problem)
    if doc["step"] < 1:
        raise RunDirError(f"{where}: step {doc['step']}, expected >= 1")
    shapes = doc.get("shapes") or []
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in shapes):
        raise RunDirError(f"{where}: key 'shapes' must be a list of integers")
    waits = doc.get("comm_wait_ranks_s") or []
    if not all(finite(w) for w in waits):
        raise RunDirError(f"{where}: key 'comm_wait_ranks_s' must be a list of finite numbers (seconds per rank)")
    known = _known(StepRecord)
    vals = {k: doc.get(k) for k in known if k in doc}
    vals["compile"], vals["skipped"] = bool(doc.get("compile", False)), bool(doc.get("skipped", False))
    vals["shapes"] = tuple(shapes)
    vals["comm_wait_ranks_s"] = tuple(float(w) for w in waits) if waits else None
    return StepRecord(**vals, extra={k: v for k, v in doc.items() if k not in known})


def _summary_from(doc: dict, where: str) -> SummaryRecord:
    problem = _type_problem(doc, _SUMMARY_SPEC, where)
    if problem:
        raise RunDirError(problem)
    known = _known(SummaryRecord)
    return SummaryRecord(**{k: doc[k] for k in known if k in doc},
                         extra={k: v for k, v in doc.items() if k not in known | {"event"}})


# ------------------------------------------------------------------------------------------ writer
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


# ------------------------------------------------------------------------------------------ reader
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
                        out.summary = _summary_from(doc, where)
                    elif event is None:
                        rec = _step_from(doc, where)
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
        if manifest is None and plan is None and metrics is None and not (run / "logs").is_dir():
            raise RunDirError(f"{run}: not a run directory (no {MANIFEST_FILE}, {PLAN_FILE}, {METRICS_FILE} or "
                              f"logs/); run `port train RECIPE` first" + (f" ({notes[0]})" if notes else ""))
        metrics = metrics or Metrics(run / METRICS_FILE, [])
    if metrics.warning:
        notes.append(_note(RunDirError(metrics.warning), metrics.path))
    return RunRecords(run, manifest, metrics.steps, metrics.summary, plan, notes)


def _read_plan(run: Path, notes: list[str]) -> dict | None:
    """``plan.json`` (written by `port train` from the dry-run plan); unreadable: a note, not an error."""
    return _tolerant(lambda p: files.read_json_object(p, what="run plan", error=RunDirError), notes, run / PLAN_FILE)


def finite(x: Any) -> bool:
    """A real, finite number (not a bool)."""
    return isinstance(x, _NUM) and not isinstance(x, bool) and math.isfinite(x)
