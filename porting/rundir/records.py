"""The records of a run directory (format in ``porting/rundir/__init__.py`` and docs/rundir.md): the
manifest, one record per optimizer step and the summary, each a frozen dataclass read from its JSON
object with every known key's type checked ("found X, expected Y") and unknown keys kept as read."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

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


def _asdict(record: Any) -> dict[str, Any]:
    """A record (a dataclass with ``extra``) as written: known fields that are set, then the unknown keys it was
    read with."""
    out = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "extra"}
    out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items() if v is not None}
    return {**out, **record.extra}


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
    job: str | None = None                        # the job document the ranks ran: "RUN/job.json revision N"
    determinism: dict | None = None               # determinism: bitwise, the switches in force (run/step/deterministic.py)
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
                "resumed_from_step": (int,), "job": (str,), "determinism": (dict,)}
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
                   resumed_from_step=doc.get("resumed_from_step"), job=doc.get("job"),
                   determinism=doc.get("determinism"), format_version=version,
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
    skipped: bool = False               # the update was not applied (see skip_reason)
    skip_reason: str | None = None      # overflow (dynamic loss scale), nonfinite, data window (train/run/nonfinite.py)
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
    "skip_reason": (str,), "host_rss_gib": _NUM, "host_rss_peak_gib": _NUM, "device_peak_gib": _NUM, "comm_wait_s": _NUM,
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
    precompile_s: float | None = None   # compiling every shape before step 1 (porting/train/run/step/precompile.py)
    precompiled_graphs: int | None = None
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"event": "summary", **_asdict(self)}


_SUMMARY_SPEC: dict[str, tuple[type, ...]] = {
    "steps": (int,), "compile_steps": (int,), "compile_time_s": _NUM, "steady_tokens_per_s": _NUM,
    "steady_step_time_s": _NUM, "compiled_graphs": (int,), "shapes_seen": (int,), "bucket_shapes": (int,),
    "padding_fraction": _NUM, "final_loss": _NUM, "precompile_s": _NUM, "precompiled_graphs": (int,),
    "format_version": (int,)}


def step_from(doc: dict, where: str) -> StepRecord:
    for k in ("step", "loss"):
        if k not in doc:
            raise RunDirError(f"{where}: missing key '{k}'")
    problem = _type_problem(doc, _STEP_SPEC, where)
    if problem:
        raise RunDirError(problem)
    if not isinstance(doc["step"], int) or doc["step"] < 1:   # _type_problem lets null through
        raise RunDirError(f"{where}: step {doc['step']}, expected a whole number >= 1")
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


def summary_from(doc: dict, where: str) -> SummaryRecord:
    problem = _type_problem(doc, _SUMMARY_SPEC, where)
    if problem:
        raise RunDirError(problem)
    known = _known(SummaryRecord)
    return SummaryRecord(**{k: doc[k] for k in known if k in doc},
                         extra={k: v for k, v in doc.items() if k not in known | {"event"}})


def finite(x: Any) -> bool:
    """A real, finite number (not a bool)."""
    return isinstance(x, _NUM) and not isinstance(x, bool) and math.isfinite(x)
