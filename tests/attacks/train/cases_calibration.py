"""`port train --dry-run --calibration REHEARSAL` fed hostile calibration files (issue 51): every piece of
``calibration.json`` and every link figure of ``rehearse.json`` is bounded (porting/train/plan/calibration_bounds.py,
docs/promises.md), so a NaN, negative, zero, boolean, infinite or 1e39 piece, a thread count that is not one, a
collective measured twice at one size or a bandwidth that is a string is one line naming the file and the key, never
a plan ranked by it ("step nan s", negative tokens/s) and never a traceback; a real calibration still plans."""

from __future__ import annotations

import json
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case

PIECES = {"layer_a_s": 0.001, "layer_s_per_flop": 1e-11, "ends_a_s": 0.001, "ends_s_per_flop": 1e-11,
          "update_per_param_s": 1e-9, "update_fixed_s": 0.001, "fused_delta_layer_s": -1e-4,
          "fused_delta_fixed_s": -5e-4}
SHAPE = {"hidden": 64, "heads": 8, "kv_heads": 4, "head_dim": 8, "intermediate": 172, "vocab": 512, "layers": 5,
         "seq": 64, "micro": 4, "tp": 1, "recompute": False, "dtype": "float32"}
GOOD = {"format": "port-calibration/1", "device": "cpu", "load_avg_1min": 0.5, "shape": SHAPE,
        "by_threads": {"1": {**PIECES, "threads": 1, "layer_fb_s": 0.002, "ends_fb_s": 0.001, "points": []},
                       "2": {**PIECES, "threads": 2, "layer_fb_s": 0.002, "ends_fb_s": 0.001, "points": []}},
        "collectives": {"AllReduce": {"ranks": 2, "points_bytes_ms": [[1024, 0.05], [4194304, 2.0]],
                                      "latency_ms": 0.05, "graph_mode": True}}}
LINKS = {"world AllReduce": {"ranks": 2, "ms": 2.0, "bytes_per_rank": 4194304, "bus_gb_s": 2.1, "latency_ms": 0.05}}
TWO = ("--set", "cluster.devices_per_node=2")   # two workers: the plan has collectives to time


def _cal(name: str, edit, *expect: str, links: dict | None = None, refusal: bool = True, check=None):
    def gen(d: Path) -> list[str]:
        doc = json.loads(json.dumps(GOOD))
        edit(doc)
        (d / "cal").mkdir()
        (d / "cal" / "calibration.json").write_text(json.dumps(doc))   # NaN and Infinity as Python writes them
        reh = {"rungs": [{"name": "links", "status": "pass", "links": {"measured": links or LINKS}}]}
        (d / "cal" / "rehearse.json").write_text(json.dumps(reh))
        return ["train", str(I.recipe(d)), "--dry-run", "--calibration", str(d / "cal"), *TWO]
    gen.__name__ = name
    globals()[name] = case(*expect, timeout=60, refusal=refusal, check=check, dest="out")(gen)


def _piece(t: str, k: str, v):
    return lambda doc: doc["by_threads"][t].__setitem__(k, v)


def _planned(out: str, d: Path) -> None:
    """The real calibration plans: a finite step, a positive throughput."""
    assert "estimated step (calibrated from" in out and " nan " not in out and "tokens/s per device" in out, out
    assert "throughput: -" not in out, out


_cal("calibration_real_still_plans", lambda doc: None, "estimated step (calibrated", refusal=False, check=_planned)
# -- each piece bounded (Computes wrong and exits 0: "step nan s", negative tokens/s)
for _n, _k, _v, _words in [
    ("nan", "layer_a_s", float("nan"), ("by_threads.2.layer_a_s", "NaN")),
    ("negative", "update_fixed_s", -5.0, ("by_threads.2.update_fixed_s", "-5")),
    ("zero_per_flop", "layer_s_per_flop", 0.0, ("by_threads.2.layer_s_per_flop",)),
    ("boolean", "ends_a_s", True, ("by_threads.2.ends_a_s", "true")),
    ("1e39", "layer_s_per_flop", 1e39, ("by_threads.2.layer_s_per_flop", "1e+39")),
    ("infinite", "update_per_param_s", float("inf"), ("by_threads.2.update_per_param_s", "Infinity")),
    ("string", "fused_delta_layer_s", "fast", ("by_threads.2.fused_delta_layer_s",)),
    ("huge_negative_delta", "fused_delta_fixed_s", -1e30, ("by_threads.2.fused_delta_fixed_s",)),
    ("fb_string_scaled", "layer_fb_s", "slow", ("by_threads.2.layer_fb_s",)),
]:
    _cal(f"calibration_piece_{_n}", _piece("2", _k, _v), "calibration.json", *_words, "port rehearse")
_cal("calibration_piece_nan_other_threads", _piece("1", "ends_s_per_flop", float("nan")), "by_threads.1.ends_s_per_flop")
# -- tracebacks before: an empty shape, a thread key that is no count, collectives measured twice or malformed
_cal("calibration_shape_empty", lambda doc: doc.__setitem__("shape", {}), "calibration.json: shape must hold hidden")
_cal("calibration_shape_hidden_zero", lambda doc: doc["shape"].__setitem__("hidden", 0), "shape.hidden")
_cal("calibration_shape_seq_1e18", lambda doc: doc["shape"].__setitem__("seq", 10 ** 18), "shape.seq")
_cal("calibration_thread_key_not_numeric", lambda doc: doc["by_threads"].__setitem__("two", doc["by_threads"].pop("2")),
     "by_threads", "'two'", "a thread count")
_cal("calibration_thread_key_arabic_digit", lambda doc: doc.__setitem__("by_threads", {"\u0662": doc["by_threads"]["2"]}),
     "by_threads", "a thread count")
_cal("calibration_thread_key_zero", lambda doc: doc.__setitem__("by_threads", {"0": doc["by_threads"]["2"]}),
     "by_threads", "a thread count")


def _points(v):
    return lambda doc: doc["collectives"]["AllReduce"].__setitem__("points_bytes_ms", v)


for _n, _v in [("repeated", [[1024, 0.05], [1024, 0.07]]), ("one_number", [[1024]]), ("strings", [["a", "b"]]),
               ("negative_ms", [[1024, -1.0], [4096, 2.0]]), ("nan_ms", [[1024, float("nan")], [4096, 2.0]]),
               ("zero_bytes", [[0, 0.05], [4096, 2.0]]), ("not_a_list", "fast"),
               ("ten_thousand", [[i + 1, 0.1] for i in range(10_000)])]:
    _cal(f"calibration_collective_points_{_n}", _points(_v), "calibration.json", "collectives.AllReduce")
_cal("calibration_collective_ranks_string", lambda doc: doc["collectives"]["AllReduce"].__setitem__("ranks", "2"),
     "collectives.AllReduce@2.ranks: found '2'")
# -- rehearse.json's links rung: a bandwidth that is a string (a traceback before), negative, NaN
for _n, _v in [("string", "fast"), ("negative", -3.0), ("nan", float("nan")), ("1e39", 1e39), ("boolean", True)]:
    _cal(f"calibration_link_bandwidth_{_n}", lambda doc: None, "rehearse.json", "world AllReduce", "bus_gb_s",
         links={"world AllReduce": {**LINKS["world AllReduce"], "bus_gb_s": _v}})
_cal("calibration_link_latency_list", lambda doc: None, "rehearse.json", "latency_ms",
     links={"world AllReduce": {**LINKS["world AllReduce"], "latency_ms": [1]}})
_cal("calibration_link_ranks_zero", lambda doc: None, "rehearse.json", "ranks",
     links={"world AllReduce": {**LINKS["world AllReduce"], "ranks": 0}})
# -- the synchronisation chain (collectives.contention): a zero "alone" (a compute factor divides by it), NaN, a
#    boolean, a group size that is no number, chunks that are no list; a real chain still plans
CHAIN = {"ranks": 2, "chunks": [{"alone_ms": 1.5, "together_ms": 2.0, "with_ms": 4.0, "payload_bytes": 1024},
                                {"alone_ms": 6.0, "together_ms": 8.0, "with_ms": 11.0, "payload_bytes": 1024}]}


def _chain(key: str, value):
    def edit(doc):
        col = {"device": "cpu", "workers": 2, "measured": {"AllReduce@2": {
            "ranks": 2, "points_bytes_ms": [[1024, 0.05], [4194304, 2.0]], "runs": "AllReduce", "emulated": ""}},
            "contention": {"2": json.loads(json.dumps(CHAIN))}}
        if key:
            col["contention"]["2"]["chunks"][0][key] = value
        doc["collectives"] = col
    return edit


_cal("calibration_chain_real_still_plans", _chain("", None), "synchronisation waits", refusal=False, check=_planned)
for _n, _k, _v, _words in [("alone_zero", "alone_ms", 0.0, "alone_ms"), ("with_nan", "with_ms", float("nan"), "NaN"),
                           ("together_boolean", "together_ms", True, "true"),
                           ("payload_string", "payload_bytes", "1k", "payload_bytes")]:
    _cal(f"calibration_chain_{_n}", _chain(_k, _v), "calibration.json", "collectives.contention.2", _words)
_cal("calibration_chain_group_not_a_number",
     lambda doc: doc.__setitem__("collectives", {"measured": {}, "contention": {"two": CHAIN}}),
     "collectives.contention.two", "group size")
_cal("calibration_chain_chunks_not_a_list",
     lambda doc: doc.__setitem__("collectives", {"measured": {}, "contention": {"2": {"ranks": 2, "chunks": "x"}}}),
     "collectives.contention.2", "chunks")
_cal("calibration_chain_workers_negative",
     lambda doc: doc.__setitem__("collectives", {"measured": {}, "workers": -1}), "collectives.workers", "-1")
