"""The bounds of every figure a calibrated plan reads (`port train --dry-run --calibration REHEARSAL`): each piece of
``calibration.json`` and each link figure of ``rehearse.json`` is checked here, once, when the folder is loaded
(porting/train/plan/calibrated.py ``load``), and the prediction only ever sees the checked values.

Why: the plan ranks layouts by these pieces and prints tokens/s and MFU from them; a NaN, a negative time, a zero
time per FLOP, a boolean or a 1e39 gave "step nan s" or negative tokens/s and exited 0, and an empty shape, a thread
count that is no number, a collective measured twice at one size or a bandwidth that is a string was a traceback.

The bounds (docs/promises.md lists them with their tests, tests/attacks/train/cases_calibration.py):

- a fixed time (``layer_a_s``, ``ends_a_s``, ``update_fixed_s``, ``layer_fb_s``, ``ends_fb_s``): 0 to
  :data:`MAX_S` s. ``derive`` keeps each fixed part in [0, t0] (porting/train/plan/calibrated.py ``_affine``), and
  one layer's forward and backward at the rung's micro-batch takes seconds on a CPU, not hours;
- a time per FLOP (``layer_s_per_flop``, ``ends_s_per_flop``): :data:`MIN_S_PER_FLOP` to :data:`MAX_S_PER_FLOP`, i.e.
  from 10 PFLOP/s (above any single device: a 910C package is about 0.8 PFLOP/s bf16, docs ASCEND_FACTS) down to
  1 MFLOP/s; zero is refused (``derive`` gives a positive slope whenever the measured time is positive);
- the update per parameter (``update_per_param_s``): 0 to :data:`MAX_S_PER_PARAM` (1,000 parameters a second);
- the one-graph savings (``fused_delta_layer_s``, ``fused_delta_fixed_s``): signed (a saving is negative), at most
  :data:`MAX_S` either way;
- thread counts (``by_threads`` keys): ASCII decimal 1 to :data:`MAX_THREADS`, at most :data:`MAX_ENTRIES` of them;
- the measured shape: every :data:`SHAPE_INTS` value an integer 1 to :data:`MAX_DIM`, ``recompute`` a boolean,
  ``dtype`` a short name;
- a graph-mode collective (``collectives``): ``ranks`` 1 to :data:`MAX_RANKS`; 1 to :data:`MAX_POINTS` points
  ``[bytes, ms]``, bytes an integer 1 to :data:`MAX_CALL_BYTES` and each size once (``per_call_s`` divides by the
  difference of two sizes), ms finite, above 0 and at most :data:`MAX_MS`;
- a link (``rehearse.json`` rung ``links``): ``ranks`` 1 to :data:`MAX_RANKS`, ``ms`` and ``latency_ms`` finite, 0 to
  :data:`MAX_MS` (or absent), ``bus_gb_s`` above 0 and at most :data:`MAX_BUS_GB_S` (or absent: not measured);
- a synchronisation chain (``collectives.contention``, porting/launch/workers/collectives.py): keyed by a group size
  1 to :data:`MAX_RANKS` with its ``ranks``; 1 to :data:`MAX_CHUNKS` chunks, ``alone_ms`` and ``together_ms`` above 0
  (a compute factor divides by the first; the waits are read against the second), ``with_ms`` 0 or more, all at
  most :data:`MAX_MS`, ``payload_bytes`` an integer 1 to :data:`MAX_CALL_BYTES`; ``workers`` 1 to :data:`MAX_RANKS`
  and ``threads`` 0 to :data:`MAX_THREADS` (or absent);
- ``load_avg_1min``: 0 to :data:`MAX_LOAD` (or absent).
"""

from __future__ import annotations

import math
import re
from typing import Any

from model_zoo.errors import RecipeError

MAX_S = 3600.0                 # one piece of one micro-batch's step
MIN_S_PER_FLOP, MAX_S_PER_FLOP = 1e-16, 1e-6
MAX_S_PER_PARAM = 1e-3
MAX_THREADS, MAX_ENTRIES = 4096, 64
MAX_DIM = 1 << 31              # hidden, vocab, seq, ...: int32 shapes
MAX_RANKS = 1 << 16
MAX_POINTS = 64                # the compute rung measures 2-4 sizes a collective
MAX_CALL_BYTES = 1 << 40
MAX_MS = 3.6e6                 # one collective call: an hour
MAX_BUS_GB_S = 1e5             # 100 TB/s: above any link (a 910C die's HCCS is about 0.4 TB/s, docs ASCEND_FACTS)
MAX_LOAD = 1e6
MAX_CHUNKS = 8                 # the rung times 2 chunk sizes a group size
FIXED = ("layer_a_s", "ends_a_s", "update_fixed_s")
PER_FLOP = ("layer_s_per_flop", "ends_s_per_flop")
DELTAS = ("fused_delta_layer_s", "fused_delta_fixed_s")
PIECES = ("layer_a_s", "layer_s_per_flop", "ends_a_s", "ends_s_per_flop", "update_per_param_s", "update_fixed_s",
          "fused_delta_layer_s", "fused_delta_fixed_s")
MEASURED = ("layer_fb_s", "ends_fb_s")   # what the rung measured at its own shape (shown, scaled with the threads)
BOUNDS: dict[str, tuple[float, float, bool]] = {   # key -> (low, high, low included)
    **{k: (0.0, MAX_S, True) for k in FIXED + MEASURED},
    **{k: (MIN_S_PER_FLOP, MAX_S_PER_FLOP, True) for k in PER_FLOP},
    "update_per_param_s": (0.0, MAX_S_PER_PARAM, True),
    **{k: (-MAX_S, MAX_S, True) for k in DELTAS},
}
SHAPE_INTS = ("hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "seq", "micro", "tp")
_THREADS = re.compile(r"[1-9][0-9]{0,3}")


def _shown(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return repr(v)[:40]


def number(v: Any, low: float, high: float, where: str, what: str, low_included: bool = True) -> float:
    """``v`` as a float when it is a real number (not a boolean) in the bound; else one RecipeError naming ``where``."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
        and (low <= v if low_included else low < v) and v <= high
    if not ok:
        raise RecipeError(f"{where}: found {_shown(v)}, expected {what} ({'from' if low_included else 'above'} "
                          f"{low:g} to {high:g}); re-run `port rehearse` to measure it again")
    return float(v)


def pieces(by_threads: Any, where: str, label: str = "by_threads") -> dict[str, dict[str, float]]:
    """``by_threads`` checked: {thread count: {piece: seconds}} with only the pieces a prediction reads."""
    if not isinstance(by_threads, dict) or not by_threads or len(by_threads) > MAX_ENTRIES:
        raise RecipeError(f"{where}: {label} must map 1 to {MAX_ENTRIES} thread counts to their pieces; re-run "
                          "`port rehearse` to write it")
    out = {}
    for t, v in by_threads.items():
        if not _THREADS.fullmatch(t) or int(t) > MAX_THREADS:
            raise RecipeError(f"{where}: {label} key {t[:20]!r} is not a thread count (ASCII digits, 1 to "
                              f"{MAX_THREADS}); re-run `port rehearse` to write it")
        if not isinstance(v, dict) or not all(k in v for k in PIECES):
            raise RecipeError(f"{where}: {label}.{t} lacks one of {', '.join(PIECES)} (numbers); re-run "
                              "`port rehearse`")
        out[t] = {k: number(v[k], *BOUNDS[k][:2], f"{where}: {label}.{t}.{k}", _unit(k), BOUNDS[k][2])
                  for k in PIECES + tuple(m for m in MEASURED if m in v)}
    return out


def _unit(k: str) -> str:
    return ("seconds per FLOP" if k.endswith("_per_flop") else "seconds per parameter" if k.endswith("_param_s")
            else "seconds (signed)" if k in DELTAS else "seconds")


def shape(value: Any, where: str) -> dict[str, Any]:
    """The measured shape: :data:`SHAPE_INTS` integers in bound, ``recompute`` a boolean, the rest short scalars."""
    if not isinstance(value, dict) or len(value) > 64 or not all(k in value for k in SHAPE_INTS + ("recompute",)):
        raise RecipeError(f"{where}: shape must hold {', '.join(SHAPE_INTS + ('recompute',))} (numbers, true/false or "
                          "a dtype name), as `port rehearse` writes it; re-run `port rehearse` to write it")
    for k, v in value.items():
        if k in SHAPE_INTS or k == "layers":
            ok, expected = type(v) is int and 1 <= v <= MAX_DIM, f"an integer from 1 to {MAX_DIM:,}"
        elif k == "recompute":
            ok, expected = isinstance(v, bool), "true or false"
        else:
            ok, expected = isinstance(v, (bool, int, str)) and len(str(v)) <= 32, "a number, true/false or a short name"
        if not ok:
            raise RecipeError(f"{where}: shape.{str(k)[:20]}: found {_shown(v)}, expected {expected}; re-run "
                              "`port rehearse` to write it")
    return dict(value)


KINDS = ("AllReduce", "ReduceScatter", "AllGather")
_GROUP_KEY = re.compile(r"(AllReduce|ReduceScatter|AllGather)@([1-9][0-9]{0,5})")


def collectives(value: Any, where: str) -> dict[str, Any]:
    """The compute rung's graph-mode collectives, checked, in the form porting/train/plan/comm_price.py reads:
    ``{"device", "measured": {"OP@N": {ranks, points_bytes_ms, runs, emulated}}, "extrapolated": [N, ...]}``; an
    older file's ``{"OP": {ranks, points_bytes_ms}}`` (timed on its world group) reads as ``OP@ranks``."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise RecipeError(f"{where}: collectives must be an object of at most 16 keys, as `port rehearse` writes it; "
                          "re-run `port rehearse`")
    if "measured" in value:
        entries = value["measured"]
        if not isinstance(entries, dict) or len(entries) > MAX_ENTRIES:
            raise RecipeError(f"{where}: collectives.measured must map at most {MAX_ENTRIES} \"kind@group size\" "
                              "names to their points; re-run `port rehearse`")
    else:   # the older form: one entry per kind, on the world group
        entries = {f"{op}@{g.get('ranks')}" if isinstance(g, dict) else str(op): g for op, g in value.items()}
    out: dict[str, Any] = {}
    for key, g in entries.items():
        at = f"{where}: collectives.{str(key)[:40]}"
        m = _GROUP_KEY.fullmatch(str(key))
        if not m or not isinstance(g, dict):
            raise RecipeError(f"{at}: expected a kind ({', '.join(KINDS)}) @ a group size with ranks and "
                              "points_bytes_ms; re-run `port rehearse`")
        out[str(key)] = _entry(g, at, int(m.group(2)))
    extrapolated = value.get("extrapolated", [])
    if not isinstance(extrapolated, list) or len(extrapolated) > MAX_ENTRIES or not all(
            type(n) is int and 1 <= n <= MAX_RANKS for n in extrapolated):
        raise RecipeError(f"{where}: collectives.extrapolated: expected at most {MAX_ENTRIES} group sizes (integers "
                          f"1 to {MAX_RANKS:,}); re-run `port rehearse`")
    out_doc = {"device": name(value.get("device"), where, "collectives.device"), "measured": out,
               "extrapolated": list(extrapolated), "contention": contention(value.get("contention"), where)}
    for key, high in (("workers", MAX_RANKS), ("threads", MAX_THREADS)):
        v = value.get(key)
        if v is not None and (type(v) is not int or not 0 <= v <= high):
            raise RecipeError(f"{where}: collectives.{key}: found {_shown(v)}, expected an integer from 0 to "
                              f"{high:,}; re-run `port rehearse`")
        out_doc[key] = v
    return out_doc


def contention(value: Any, where: str) -> dict[str, Any]:
    """The synchronisation chain's timings per group size (module docstring), checked; {} when absent (a file from
    before the chain)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
        raise RecipeError(f"{where}: collectives.contention must map at most {MAX_ENTRIES} group sizes to their "
                          "chunks; re-run `port rehearse`")
    out: dict[str, Any] = {}
    for n, g in value.items():
        at = f"{where}: collectives.contention.{str(n)[:20]}"
        size = int(n) if re.fullmatch(r"[1-9][0-9]{0,5}", str(n)) else 0
        chunks = g.get("chunks") if isinstance(g, dict) else None
        if not isinstance(g, dict) or not 1 <= size <= MAX_RANKS or g.get("ranks") != size or not isinstance(chunks, list) \
                or not 1 <= len(chunks) <= MAX_CHUNKS or not all(isinstance(c, dict) for c in chunks):
            raise RecipeError(f"{at}: expected a group size (1 to {MAX_RANKS:,}) mapped to its ranks and 1 to "
                              f"{MAX_CHUNKS} chunks of alone_ms, together_ms, with_ms and payload_bytes; re-run "
                              "`port rehearse`")
        rows = []
        for c in chunks:
            b = c.get("payload_bytes")
            if type(b) is not int or not 1 <= b <= MAX_CALL_BYTES:
                raise RecipeError(f"{at}.payload_bytes: found {_shown(b)}, expected an integer from 1 to "
                                  f"{MAX_CALL_BYTES:,}; re-run `port rehearse`")
            rows.append({"payload_bytes": b, **{k: number(c.get(k), 0.0, MAX_MS, f"{at}.{k}", "milliseconds a chunk",
                                                          low_included=k == "with_ms")
                                                 for k in ("alone_ms", "together_ms", "with_ms")}})
        out[str(size)] = {"ranks": size, "chunks": rows}
    return out


def _entry(g: dict, at: str, size: int) -> dict[str, Any]:
    ranks = g.get("ranks", size)
    if type(ranks) is not int or ranks != size:
        raise RecipeError(f"{at}.ranks: found {_shown(ranks)}, expected {size} (the group size it is keyed by); "
                          "re-run `port rehearse`")
    pts = g.get("points_bytes_ms")
    if not isinstance(pts, list) or not 1 <= len(pts) <= MAX_POINTS or not all(
            isinstance(p, list) and len(p) == 2 for p in pts):
        raise RecipeError(f"{at}.points_bytes_ms: expected 1 to {MAX_POINTS} [bytes, ms] pairs; re-run `port rehearse`")
    checked = [_point(p, f"{at}.points_bytes_ms") for p in pts]
    if len({b for b, _ in checked}) != len(checked):
        raise RecipeError(f"{at}.points_bytes_ms: a call size is measured twice; expected each size once (the time "
                          "between two sizes is interpolated); re-run `port rehearse`")
    runs, emulated = g.get("runs", ""), g.get("emulated", "")
    if not isinstance(runs, str) or not isinstance(emulated, str) or len(runs) > 64 or len(emulated) > 400:
        raise RecipeError(f"{at}: runs and emulated must be short texts (at most 64 and 400 characters); re-run "
                          "`port rehearse`")
    return {"ranks": ranks, "points_bytes_ms": [list(p) for p in checked], "runs": runs, "emulated": emulated}


def by_tp(value: Any, where: str) -> dict[str, dict[str, dict[str, float]]]:
    """The compute rung's pieces of one rank's slice at the other TP sizes the plan ranks: {tp: by_threads}."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ENTRIES:
        raise RecipeError(f"{where}: by_tp must map at most {MAX_ENTRIES} TP sizes to their pieces; re-run "
                          "`port rehearse`")
    for tp in value:
        if not _THREADS.fullmatch(str(tp)):
            raise RecipeError(f"{where}: by_tp key {str(tp)[:20]!r} is not a TP size (ASCII digits); re-run "
                              "`port rehearse`")
    return {str(tp): pieces(v, where, f"by_tp.{tp}") for tp, v in value.items()}


def name(value: Any, where: str, key: str) -> str | None:
    """A short device name (``cpu``, ``ascend``) or absent."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 32:
        raise RecipeError(f"{where}: {key}: found {_shown(value)}, expected a short device name (cpu, ascend); "
                          "re-run `port rehearse`")
    return value


def _point(p: list, where: str) -> tuple[int, float]:
    b, ms = p
    if type(b) is not int or not 1 <= b <= MAX_CALL_BYTES:
        raise RecipeError(f"{where}: a call's bytes found {_shown(b)}, expected an integer from 1 to "
                          f"{MAX_CALL_BYTES:,}; re-run `port rehearse`")
    return b, number(ms, 0.0, MAX_MS, where, "milliseconds a call", low_included=False)


def links(measured: Any, where: str) -> dict[str, dict[str, Any]]:
    """The links rung's figures ({"group Op": {ranks, ms, latency_ms, bus_gb_s}}) checked."""
    if not isinstance(measured, dict) or len(measured) > 64:
        raise RecipeError(f"{where}: links.measured must map at most 64 \"group Op\" names to their figures")
    out = {}
    for k, m in measured.items():
        at = f"{where}: links {str(k)[:40]!r}"
        if not isinstance(m, dict) or type(m.get("ranks")) is not int or not 1 <= m["ranks"] <= MAX_RANKS:
            raise RecipeError(f"{at}: ranks must be an integer from 1 to {MAX_RANKS:,}; re-run `port rehearse`")
        row: dict[str, Any] = {"ranks": m["ranks"]}
        for f, (low, high, low_in) in (("ms", (0.0, MAX_MS, True)), ("latency_ms", (0.0, MAX_MS, True)),
                                       ("bus_gb_s", (0.0, MAX_BUS_GB_S, False))):
            if m.get(f) is not None:
                row[f] = number(m[f], low, high, f"{at} {f}", "a measured figure", low_in)
        out[str(k)] = row
    return out


def load_avg(value: Any, where: str) -> float | None:
    return None if value is None else number(value, 0.0, MAX_LOAD, f"{where}: load_avg_1min", "a load average")
