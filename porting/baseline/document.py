"""The baseline file: one self-describing JSON document (format ``port-baseline``, version 1), as records.

Two kinds of document share the format (docs/baseline.md has every field):

* :class:`MeasuredBaseline` -- `port baseline run`: the PyTorch run of a recipe (:mod:`porting.baseline.runner`),
  with its recipe, data report, probe logits and loop description;
* :class:`ImportedBaseline` -- `port baseline import`: a CUDA run's own loss log
  (:mod:`porting.intake.baseline_import`), with an ``imported`` section saying what the log holds and lacks; it
  never has probe logits or the data hash, so `port compare` checks the curve (:mod:`porting.baseline.curve`).

Each is a frozen dataclass of typed sub-records (:class:`Settings`, :class:`Steps`, :class:`Timing`,
:class:`Memory`, :class:`Probe`, :class:`Imported`) read with :mod:`model_zoo.typed`: :func:`load` (or
:func:`from_json`) checks every key at once and raises one ConfigError naming the file and each bad key; unknown
keys are kept and written back. :func:`save` writes the document whole or not at all (temporary file, then rename),
and only a document this reader reads. A document read and written again is the same file, byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from model_zoo import typed
from model_zoo.errors import ConfigError
from model_zoo.files import read_json, write_atomic
from model_zoo.typed import spec
from porting.baseline import arrays
from porting.baseline.memory import PHASES

FORMAT = "port-baseline"
FORMAT_VERSION = 1
# The probe logits dominate the size (runner.check_probe_size keeps what port writes below this).
MAX_BYTES = 512 << 20

# Settings compared first by `port compare`, in this order: a comparison across any of them is not
# like for like. Fields of Settings.
KEY_SETTINGS = ("global_batch", "seq_length", "micro_batch_size", "grad_accum_steps", "world_size", "dtype",
                "data_sha256", "data_order", "seed", "adapter")
OPTIONAL_KEY_SETTINGS = ("adapter",)   # absent from a document written before LoRA: a full fine-tune
OTHER_SETTINGS = ("steps", "model_type", "num_parameters", "model_config_sha256", "lr", "betas", "eps",
                  "weight_decay", "grad_clip", "schedule", "recompute")
# top-level key -> JSON type expected (both kinds)
TOP_LEVEL: dict[str, type] = {
    "format": str, "format_version": int, "created": str, "command": list, "device": dict, "versions": dict,
    "model": dict, "settings": dict, "steps": dict, "timing": dict, "memory": dict, "probe": dict,
}
STEP_ARRAYS = ("step", "loss", "grad_norm", "lr", "tokens", "step_time_s")
HINT = "re-create it with `port baseline`"
MAX_NAMES, MAX_NAME_CHARS = 64, 200      # imported.contains / lacks
MAX_TOKEN_ID = (1 << 31) - 1


@dataclass(frozen=True)
class Settings:
    """What `port compare` compares (porting.baseline.settings.from_recipe makes both sides')."""

    global_batch: int | None = None          # sequences per optimizer step
    seq_length: int | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    world_size: int | None = None
    dtype: str | None = None                 # porting.baseline.settings.PRECISIONS
    data_sha256: str | None = None
    data_order: dict | None = None
    seed: int | None = None
    steps: int | None = None
    model_type: str | None = None
    num_parameters: int | None = None
    model_config_sha256: str | None = None
    lr: float | None = None
    betas: tuple[float, ...] | None = None
    eps: float | None = None
    weight_decay: float | None = None
    grad_clip: float | None = None           # null: no clipping
    schedule: dict | None = None
    recompute: bool | None = None
    # LoRA (porting/train/recipe/adapter.py): r, alpha, dropout, use_rslora, targets, modules_to_save, bias and
    # the sha256 of the initial adapter's weights; null: a full fine-tune
    adapter: dict | None = spec(omit_none=True)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Steps:
    """Per optimizer step, plain lists of the same length (a logged point each, for an imported log)."""

    step: tuple[int, ...] = spec((), low=0)
    loss: tuple[float | None, ...] = ()                   # null: not finite
    grad_norm: tuple[float | None, ...] = ()
    lr: tuple[float | None, ...] = ()
    tokens: tuple[int | None, ...] = spec((), low=0)       # target tokens
    real_tokens: tuple[int | None, ...] | None = spec(low=0, omit_none=True)
    padded_tokens: tuple[int | None, ...] | None = spec(low=0, omit_none=True)
    step_time_s: tuple[float | None, ...] = ()
    warmup: tuple[bool, ...] | None = spec(omit_none=True)
    peak_memory_gib: dict[str, tuple[float | None, ...]] = spec(factory=dict)   # phase -> per step
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Timing:
    warmup_steps: tuple[int, ...] | None = None
    warmup_step_time_s: tuple[float, ...] | None = None
    steady_steps: int | None = None
    steady_step_time_s_median: float | None = spec(low=0)
    steady_tokens_per_s: float | None = spec(low=0)            # non-padding tokens
    steady_loss_tokens_per_s: float | None = None
    steady_padded_tokens_per_s: float | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Memory:
    kind: str | None = None                  # porting.baseline.memory: cuda_max_memory_allocated, host_rss_hwm, ...
    per_phase: bool | None = None
    unit: str | None = None
    weights_gib: float | None = None
    peak_gib: dict[str, float | None] | None = None    # phase -> max over the steps
    estimator_check: dict | None = None      # porting.baseline.estimate.check
    note: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    input_ids: tuple[tuple[int, ...], ...] | None = spec(
        low=0, high=MAX_TOKEN_ID, want="a list of rows of token ids (whole numbers from 0 to 2**31 - 1)")
    after_step: int | None = spec(want="one of the recorded steps")
    source: str | None = None
    note: str | None = spec(omit_none=True)
    logits_initial: dict | None = None       # porting.baseline.arrays.encode
    logits_final: dict | None = None
    extra: dict = field(default_factory=dict)

    def final_logits(self) -> Any:
        """The logits after ``after_step`` as a NumPy array (the reader checked they decode)."""
        return arrays.decode(self.logits_final, "probe.logits_final")


@dataclass(frozen=True)
class Evaluation:
    """The held-out loss a baseline logged (an imported log's eval rows): steps and losses of the same length."""

    step: tuple[int, ...] = spec((), low=0)
    loss: tuple[float | None, ...] = ()
    source: str | None = spec(omit_none=True)


_NAMES = "a list of names (strings)"


@dataclass(frozen=True)
class Imported:
    """Where an imported curve came from and what its log holds and lacks (porting/intake/baseline_import.py)."""

    from_: str | None = spec(key="from", omit_none=True)
    format: str | None = spec(omit_none=True)
    format_name: str | None = spec(omit_none=True)
    sha256: str | None = spec(omit_none=True)
    contains: tuple[str, ...] = spec((), want=_NAMES)
    lacks: tuple[str, ...] = spec((), want=_NAMES)
    logging_interval: int | None = spec(low=1, high=10 ** 9, want="a whole number from 1 to 10^9")
    loss_is: str | None = spec(omit_none=True)
    skipped_rows: dict | None = spec(omit_none=True)
    recovered_settings: dict | None = spec(omit_none=True)
    stated_settings: dict | None = spec(omit_none=True)
    # the CUDA job's effective settings as intake read them (porting/intake/effective.py; the settings table)
    effective_settings: dict | None = spec(omit_none=True)
    extra: dict = field(default_factory=dict)


class _Document:
    device: dict

    @property
    def device_name(self) -> str | None:
        v = self.device.get("name")
        return v if isinstance(v, str) else None

    @property
    def device_kind(self) -> str | None:
        v = self.device.get("kind")
        return v if isinstance(v, str) else None


@dataclass(frozen=True)
class MeasuredBaseline(_Document):
    """`port baseline run`: every known key of its sub-records is written (null where nothing was measured)."""

    created: str
    command: tuple[str, ...]
    device: dict
    versions: dict
    model: dict
    settings: Settings
    steps: Steps
    timing: Timing
    memory: Memory
    probe: Probe
    recipe: dict | None = None               # the resolved recipe (porting.train.recipe.recipe_dict)
    data: dict | None = None                 # the data report and batching
    loop: dict | None = None                 # how the torch side ran
    breakdown: tuple[dict, ...] | None = None   # sampled steps' breakdowns (porting/baseline/profile.py)
    evaluation: Evaluation | None = spec(omit_none=True)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {**_head(self), "settings": typed.write(self.settings)}
        out.update({k: v for k, v in (("recipe", self.recipe), ("data", self.data)) if v is not None})
        out.update(steps=typed.write(self.steps), timing=typed.write(self.timing), memory=typed.write(self.memory))
        if self.breakdown is not None:
            out["breakdown"] = list(self.breakdown)
        out["probe"] = typed.write(self.probe)
        if self.loop is not None:
            out["loop"] = self.loop
        if self.evaluation is not None:
            out["evaluation"] = typed.write(self.evaluation)
        return {**out, **self.extra}


# What an imported document writes even when null (everything else: only what is set), and its settings' order.
_IMPORTED_ALWAYS = {"steps": ("step", "loss", "grad_norm", "lr", "tokens", "step_time_s", "peak_memory_gib"),
                    "timing": ("steady_tokens_per_s",), "memory": ("kind", "peak_gib"), "probe": ("after_step",)}
_IMPORTED_SETTINGS = ("steps", "model_type", "num_parameters", "model_config_sha256", "global_batch", "seq_length",
                      "dtype", "lr")


@dataclass(frozen=True)
class ImportedBaseline(_Document):
    """`port baseline import`: a CUDA run's own log; its settings hold only what the log or the user stated."""

    created: str
    command: tuple[str, ...]
    device: dict
    versions: dict
    model: dict
    settings: Settings
    steps: Steps
    timing: Timing
    memory: Memory
    probe: Probe
    imported: Imported
    evaluation: Evaluation | None = spec(omit_none=True)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        rest = tuple(k for k in (f.name for f in typed.known_fields(Settings)) if k not in _IMPORTED_SETTINGS)
        out = {**_head(self), "settings": typed.write(self.settings, only_set=True,
                                                      order=_IMPORTED_SETTINGS + rest)}
        for key in ("steps", "timing", "memory", "probe"):
            out[key] = typed.write(getattr(self, key), only_set=True, always=_IMPORTED_ALWAYS[key])
        out["imported"] = typed.write(self.imported)
        if self.evaluation is not None:
            out["evaluation"] = typed.write(self.evaluation)
        return {**out, **self.extra}


Baseline = Union[MeasuredBaseline, ImportedBaseline]


def _head(doc: Baseline) -> dict[str, Any]:
    return {"format": doc.format, "format_version": doc.format_version, "created": doc.created,
            "command": list(doc.command), "device": doc.device, "versions": doc.versions, "model": doc.model}


# ------------------------------------------------------------------------------------------ reading
def _shape_problems(doc: Any) -> list[str]:
    """The format, the top-level keys and the lengths of the step arrays: without them nothing else is read."""
    if not isinstance(doc, dict):
        return [f"top level is {type(doc).__name__}, expected an object"]
    out: list[str] = []
    if doc.get("format") != FORMAT:
        out.append(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    if doc.get("format_version") != FORMAT_VERSION:
        out.append(f"format_version is {doc.get('format_version')!r}, this port reads {FORMAT_VERSION}")
    for key, typ in TOP_LEVEL.items():
        if key not in doc:
            out.append(f"missing key {key!r}")
        elif not isinstance(doc[key], typ):
            out.append(f"{key} is {type(doc[key]).__name__}, expected {typ.__name__}")
    if "imported" in doc and not isinstance(doc["imported"], dict):
        out.append("imported is not an object")
    if out:
        return out
    steps = doc["steps"]
    n = len(steps["step"]) if isinstance(steps.get("step"), list) else 0
    for key in STEP_ARRAYS:
        v = steps.get(key)
        if not isinstance(v, list) or len(v) != n:
            out.append(f"steps.{key} must be a list of {n} values")
    peaks = steps.get("peak_memory_gib")
    if not isinstance(peaks, dict) or any(not isinstance(peaks.get(p), list) or len(peaks[p]) != n for p in PHASES):
        out.append(f"steps.peak_memory_gib must hold lists of {n} values for {', '.join(PHASES)}")
    if n == 0:
        out.append("steps.step is empty: the baseline recorded no optimizer step")
    return out


def _missing(doc: dict[str, Any]) -> list[str]:
    """The keys each kind requires beyond the top level."""
    if "imported" in doc:
        out = [f"missing imported.{k}" for k in ("from", "format", "contains", "lacks") if k not in doc["imported"]]
        return out + (["missing settings.steps"] if "steps" not in doc["settings"] else [])
    return ([f"missing settings.{k}" for k in KEY_SETTINGS + ("steps",)
             if k not in doc["settings"] and k not in OPTIONAL_KEY_SETTINGS]
            + [f"missing probe.{k}" for k in ("input_ids", "logits_initial", "logits_final") if k not in doc["probe"]])


def _value_problems(doc: dict[str, Any]) -> list[str]:
    """What the types do not say (read once the types hold): increasing steps, the probe's step and token rows,
    bounded names, probe logits that decode."""
    out: list[str] = []
    steps = doc["steps"]["step"]
    if steps != sorted(set(steps)):
        out.append("steps.step must be increasing whole numbers")
    probe = doc["probe"]
    after = probe.get("after_step")
    if after is not None and after not in steps:
        out.append(f"probe.after_step is {str(after)[:40]!r}, expected one of the recorded steps or null")
    ids = probe.get("input_ids")
    if ids is not None and (not ids or not all(ids)):
        out.append("probe.input_ids must be a list of rows of token ids (whole numbers from 0 to 2**31 - 1)")
    imp = doc.get("imported", {})
    out += [f"imported.{k} is {str(imp[k])[:40]!r}, expected {_NAMES}" for k in ("contains", "lacks")
            if len(imp.get(k, ())) > MAX_NAMES or any(len(x) > MAX_NAME_CHARS for x in imp.get(k, ()))]
    if imp.get("effective_settings") is not None:   # the CUDA side of the settings table (porting/intake/effective.py)
        from porting.baseline.effective import side_from_dict

        try:
            side_from_dict(imp["effective_settings"], "imported.effective_settings")
        except ValueError as e:
            out.append(str(e))
    ev = doc.get("evaluation")
    if isinstance(ev, dict) and len(ev.get("step") or ()) != len(ev.get("loss") or ()):
        out.append("evaluation.step and evaluation.loss must be lists of the same length")
    if "imported" not in doc:
        for key in ("logits_initial", "logits_final"):
            try:
                if key in probe:
                    arrays.decode(probe[key], f"probe.{key}")
            except ValueError as e:
                out.append(str(e))
    return out


def problems(doc: Any) -> list[str]:
    """Every way ``doc`` is not a version-1 baseline of either kind (empty when it is one)."""
    out = _shape_problems(doc)
    if out:
        return out
    typed.problems(ImportedBaseline if "imported" in doc else MeasuredBaseline, doc, "", out)
    return (out or _value_problems(doc)) + _missing(doc)


def from_json(doc: Any, where: str) -> Baseline:
    """The record of a parsed baseline file; one ConfigError naming ``where`` and every problem."""
    bad = problems(doc)
    if bad:
        raise ConfigError(f"{where}: not a {FORMAT} v{FORMAT_VERSION} file: {'; '.join(bad)}; {HINT}")
    return typed.build(ImportedBaseline if "imported" in doc else MeasuredBaseline, doc)


def load(path: str | Path) -> Baseline:
    """A validated baseline; one ConfigError line for a missing, corrupt or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such baseline file; {HINT} (--out {path})")
    return from_json(read_json(path, what="baseline file", max_bytes=MAX_BYTES, error=ConfigError), str(path))


def dumps(doc: Baseline) -> str:
    """The file's text: indented JSON and a final newline."""
    return json.dumps(doc.to_dict(), indent=1) + "\n"


def save(path: str | Path, doc: Baseline) -> Path:
    """Write ``doc`` whole or not at all; what port writes must be what port reads (else a bug: RuntimeError)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ConfigError(f"{path}: folder {path.parent} does not exist; create it or pick another --out")
    text = dumps(doc)
    bad = problems(json.loads(text))
    if bad:
        raise RuntimeError(f"{path}: the baseline port built does not validate: {'; '.join(bad)}")
    write_atomic(path, text, error=ConfigError)
    return path
