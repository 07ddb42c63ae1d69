"""The baseline file: one self-describing JSON document (format ``port-baseline``, version 1).

Written by ``port baseline``, read by ``port compare`` and ``port report``. See docs/baseline.md for
every field. Writing is atomic (temporary file, then rename); reading validates everything at once
and raises one ConfigError naming the file and each bad key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from model_zoo.errors import ConfigError
from model_zoo.files import read_json, write_atomic
from porting.baseline import arrays
from porting.baseline.memory import PHASES

FORMAT = "port-baseline"
FORMAT_VERSION = 1
# The probe logits dominate the size (runner.check_probe_size keeps what port writes below this).
MAX_BYTES = 512 << 20

# Settings compared first by `port compare`, in this order: a comparison across any of them is not
# like for like. Keys of the "settings" object.
KEY_SETTINGS = ("global_batch", "seq_length", "micro_batch_size", "grad_accum_steps", "world_size", "dtype",
                "data_sha256", "data_order", "seed")
OTHER_SETTINGS = ("steps", "model_type", "num_parameters", "model_config_sha256", "lr", "betas", "eps",
                  "weight_decay", "grad_clip", "schedule", "recompute")

# top-level key -> JSON type expected
TOP_LEVEL: dict[str, type | tuple[type, ...]] = {
    "format": str, "format_version": int, "created": str, "command": list, "device": dict, "versions": dict,
    "model": dict, "settings": dict, "steps": dict, "timing": dict, "memory": dict, "probe": dict,
}
STEP_ARRAYS = ("step", "loss", "grad_norm", "lr", "tokens", "step_time_s")
TIMING_NUMBERS = ("steady_tokens_per_s", "steady_step_time_s_median")   # the ratios port compare computes


def save(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write the baseline document ``doc`` as indented JSON, whole or not at all."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ConfigError(f"{path}: folder {path.parent} does not exist; create it or pick another --out")
    write_atomic(path, json.dumps(doc, indent=1) + "\n", error=ConfigError)
    return path


def problems(doc: Any) -> list[str]:
    """Every way ``doc`` is not a version-1 baseline (empty when it is one)."""
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
    if out:
        return out
    n = len(doc["steps"].get("step", []))
    for key in STEP_ARRAYS:
        v = doc["steps"].get(key)
        if not isinstance(v, list) or len(v) != n:
            out.append(f"steps.{key} must be a list of {n} values")
    peaks = doc["steps"].get("peak_memory_gib")
    if not isinstance(peaks, dict) or any(not isinstance(peaks.get(p), list) or len(peaks[p]) != n for p in PHASES):
        out.append(f"steps.peak_memory_gib must hold lists of {n} values for {', '.join(PHASES)}")
    if n == 0:
        out.append("steps.step is empty: the baseline recorded no optimizer step")
    if out:
        return out
    out += _number_problems(doc)
    if "imported" in doc:
        # `port baseline import`: a CUDA run's own log (porting/intake/baseline_import.py) has the curve,
        # never probe logits or the data hash; `port compare` checks the curve and names what is missing
        return out + _imported_problems(doc)
    for key in KEY_SETTINGS + ("steps",):
        if key not in doc["settings"]:
            out.append(f"missing settings.{key}")
    for key in ("input_ids", "logits_initial", "logits_final"):
        if key not in doc["probe"]:
            out.append(f"missing probe.{key}")
    for key in ("logits_initial", "logits_final"):
        if key in doc["probe"]:
            try:
                arrays.decode(doc["probe"][key], f"probe.{key}")
            except ValueError as e:
                out.append(str(e))
    return out


def _not_numbers(values: Any, where: str, whole: bool = False, low: float = -math.inf, null: bool = True) -> list[str]:
    """The first value of ``values`` that is not a number (a whole one with ``whole``; at least ``low``)
    or null, as a problem. NaN and infinities are numbers: a run that diverged is compared, not refused."""
    for i, v in enumerate(values):
        if v is None and null:
            continue
        kind = int if whole else (int, float)
        if isinstance(v, bool) or not isinstance(v, kind) or v < low:
            want = "a whole number" if whole else "a number"
            return [f"{where}[{i}] is {str(v)[:40]!r}, expected {want}{f' >= {low:g}' if low > -math.inf else ''}"
                    + (" or null" if null else "")]
    return []


def _number_problems(doc: dict[str, Any]) -> list[str]:
    """Every number `port compare` and `port report` compute with: a string, a list or a bool where a
    number belongs is one problem line, not a TypeError in the middle of a comparison."""
    steps = doc["steps"]
    out = _not_numbers(steps["step"], "steps.step", whole=True, low=0, null=False)
    if not out and steps["step"] != sorted(set(steps["step"])):
        out.append("steps.step must be increasing whole numbers")
    for key in STEP_ARRAYS[1:]:
        out += _not_numbers(steps[key], f"steps.{key}", whole=key == "tokens", low=0 if key == "tokens" else -math.inf)
    for phase in PHASES:
        out += _not_numbers(steps["peak_memory_gib"][phase], f"steps.peak_memory_gib.{phase}")
    out += _not_numbers([doc["timing"].get(k) for k in TIMING_NUMBERS], "timing", low=0)
    peaks = doc["memory"].get("peak_gib") or {}   # an imported log has none
    out += (_not_numbers(list(peaks.values()), "memory.peak_gib") if isinstance(peaks, dict)
            else ["memory.peak_gib must be an object of per-phase numbers or null"])
    after = doc["probe"].get("after_step")
    if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after not in steps["step"]):
        out.append(f"probe.after_step is {str(after)[:40]!r}, expected one of the recorded steps or null")
    ids = doc["probe"].get("input_ids", [[0]])
    if not (isinstance(ids, list) and ids and all(isinstance(r, list) and r and not _not_numbers(r, "", True, 0, False)
                                                  and max(r) < 1 << 31 for r in ids)):
        out.append("probe.input_ids must be a list of rows of token ids (whole numbers from 0 to 2**31 - 1)")
    return out


def _imported_problems(doc: dict[str, Any]) -> list[str]:
    imp = doc["imported"]
    out = [] if isinstance(imp, dict) else ["imported is not an object"]
    if not out:
        out += [f"missing imported.{k}" for k in ("from", "format", "contains", "lacks") if k not in imp]
        out += _imported_field_problems(imp)
    steps = doc["steps"]["step"]
    if any(not isinstance(s, int) or isinstance(s, bool) for s in steps) or steps != sorted(set(steps)):
        out.append("steps.step must be increasing whole numbers")
    if "steps" not in doc["settings"]:
        out.append("missing settings.steps")
    return out


def _imported_field_problems(imp: dict[str, Any]) -> list[str]:
    """The ``imported`` fields `port compare` computes with or prints: typed, as porting/intake writes them."""
    out = []
    iv = imp.get("logging_interval")
    if iv is not None and (isinstance(iv, bool) or not isinstance(iv, int) or not 1 <= iv <= 10 ** 9):
        out.append(f"imported.logging_interval is {str(iv)[:40]!r}, expected a whole number from 1 to 10^9 or null")
    for key in ("contains", "lacks"):
        v = imp.get(key, [])
        if not isinstance(v, list) or len(v) > 64 or not all(isinstance(x, str) and len(x) <= 200 for x in v):
            out.append(f"imported.{key} is {str(v)[:40]!r}, expected a list of names (strings)")
    out += [f"imported.{k} is {str(imp[k])[:40]!r}, expected a string" for k in ("from", "format", "format_name",
                                                                               "loss_is")
            if k in imp and not isinstance(imp[k], str)]
    return out


def load(path: str | Path) -> dict[str, Any]:
    """A validated baseline document; one ConfigError line for a missing, corrupt or foreign file."""
    path = Path(path)
    hint = "re-create it with `port baseline`"
    if not path.is_file():
        raise ConfigError(f"{path}: no such baseline file; {hint} (--out {path})")
    doc = read_json(path, what="baseline file", max_bytes=MAX_BYTES, error=ConfigError)
    bad = problems(doc)
    if bad:
        raise ConfigError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} file: {'; '.join(bad)}; {hint}")
    return doc
