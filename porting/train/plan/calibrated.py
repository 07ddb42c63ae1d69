"""The step time predicted from measured pieces (`port train --dry-run --calibration REHEARSAL`), and the
throughput and MFU every estimate is shown with.

The pieces come from a `port rehearse` folder: ``calibration.json`` (its ``compute`` rung,
porting/rehearse_compute.py: port's own step cells timed on one device at the recipe's shapes, one
tensor-parallel rank's slice, at 1 and 3 layers, at each thread count a worker of the node gets) and
``rehearse.json``'s ``links`` rung (each group's collective at a bandwidth-measuring and at a latency-measuring
size). For a recipe and layout::

    forward_backward = L x (layer_a + layer_per_flop x F_layer)  +  ends_a + ends_per_flop x F_ends
    update           = update_fixed + update_per_param x parameters this rank updates (its ZeRO shard)
    communication    = sum over the plan's collectives (porting/train/plan/sharding.py) of count x the measured
                       time of one call of its size (the compute rung's graph-mode calls, interpolated)
    sync waits       = each synchronising call x the wait the compute rung's synchronisation chain measured at its
                       group size and chunk of compute (comm_price.py; a node of several workers only)
    step             = grad_accum_steps x forward_backward + update + communication + sync waits  (no overlap:
                       the rehearsal times compute and collectives apart; comm.EXPOSED_SOURCE)

with ``grad_accum_steps: 1`` adding to the update what one graph saves against the two cells (measured at both
depths). ``F`` are the FLOPs of that piece for one micro-batch on one rank (matmuls 6 x parameters x tokens,
attention 12 x tokens x seq x heads x head_dim, both / TP, x 4/3 with recompute; the LM head 6 x vocab x hidden x
tokens / TP); the fixed time and the time per FLOP of each piece come from the two micro-batch sizes the rung
measures (:func:`derive`), so a piece at another shape follows its FLOPs without taking a CPU's better efficiency
on larger matrices for none. The text says which figures are measured at this shape, which are carried to
another, and which are peak-based (no measurement: the roofline's, porting/train/plan/roofline.py).

Throughput and MFU: tokens/s per device = global batch x seq / step / world size; MFU = tokens/s per device x
FLOPs per token / the device's peak, with FLOPs per token = 6 N + 12 L H Q T (N the parameters without the
embedding, L layers, H heads, Q head dimension, T the sequence length): PaLM's model FLOPs (Chowdhery et al.
2022, appendix B), as torchtitan computes MFU (torchtitan/tools/utils.py ``get_num_flop_per_token``);
recomputation is not counted (model FLOPs, not hardware FLOPs).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from model_zoo import files
from porting.train.plan import calibration_bounds as bounds, comm_price, roofline, sharding
from porting.train.plan.estimates import CalibratedStep, CommFigure, StepEstimate
from porting.train.plan.layout import Layout
from porting.train.recipe.schema import Recipe

FILE = "calibration.json"
REHEARSE_FILE = "rehearse.json"
MFU_FORMULA = ("MFU = tokens/s per device x (6 N + 12 L H Q T) / peak; N parameters without the embedding, L layers, "
               "H heads, Q head dim, T sequence (PaLM appendix B, as torchtitan)")


# ------------------------------------------------------------------------------------------ FLOPs
def shape_of(recipe: Recipe, cfg: LlamaConfig) -> dict[str, Any]:
    """What one rank's micro-batch computes: the shape the pieces are measured and scaled at."""
    return {"hidden": cfg.hidden_size, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size,
            "layers": cfg.num_hidden_layers, "seq": recipe.data.max_seq_length,
            "micro": recipe.batching.micro_batch_size, "tp": recipe.parallel.tensor_parallel,
            "recompute": recipe.memory.recompute, "dtype": recipe.precision.compute_dtype}


def layer_params(s: dict[str, Any]) -> int:
    """Matmul parameters of one decoder layer (q, k, v, o, gate, up, down), whole (not per TP rank)."""
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    return h * q + 2 * h * kv + q * h + 3 * h * s["intermediate"]


def layer_flops(s: dict[str, Any]) -> float:
    """Forward + backward FLOPs of one layer on one rank for one micro-batch (x 4/3 with recompute)."""
    tokens = s["micro"] * s["seq"]
    f = (6 * layer_params(s) * tokens + 12 * tokens * s["seq"] * s["heads"] * s["head_dim"]) / s["tp"]
    return f * (4 / 3 if s["recompute"] else 1.0)


def ends_flops(s: dict[str, Any]) -> float:
    """Forward + backward FLOPs of the LM head on one rank for one micro-batch."""
    return 6 * s["vocab"] * s["hidden"] * s["micro"] * s["seq"] / s["tp"]


def flops_per_token(cfg: LlamaConfig, seq: int) -> float:
    """Model FLOPs per trained token (module docstring)."""
    n = cfg.num_parameters() - cfg.vocab_size * cfg.hidden_size   # without the embedding
    return 6 * n + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq


def _affine(t0: float, f0: float, t1: float, f1: float) -> tuple[float, float]:
    """(fixed s, s per FLOP) through two (time, FLOPs) points, kept to 0 <= fixed <= t0 (noise on a shared
    machine can tilt two points the wrong way; then the piece is taken as proportional to its FLOPs)."""
    per = (t1 - t0) / (f1 - f0) if f1 != f0 else 0.0
    fixed = t0 - per * f0
    if per <= 0 or not 0 <= fixed <= t0:
        fixed = min(max(fixed, 0.0), t0) if per > 0 else 0.0
        per = (t0 - fixed) / f0
    return fixed, per


def derive(points: list[dict[str, Any]], shape: dict[str, Any]) -> dict[str, float]:
    """The pieces from the compute rung's timings (porting/rehearse_compute.py): each ``points`` entry is one model
    depth and micro-batch size with its forward_backward_s, update_s, fused_s and parameters."""
    at = {(p["layers"], p["micro"]): p for p in points}
    depths = sorted({p["layers"] for p in points})
    micros = sorted({p["micro"] for p in points})
    lo, hi = depths[0], depths[-1]
    dl = hi - lo

    def piece(m):
        layer = (at[(hi, m)]["forward_backward_s"] - at[(lo, m)]["forward_backward_s"]) / dl
        return layer, at[(lo, m)]["forward_backward_s"] - lo * layer

    (l0, e0), (l1, e1) = piece(micros[0]), piece(micros[-1])
    s0, s1 = {**shape, "micro": micros[0]}, {**shape, "micro": micros[-1]}
    la, lb = _affine(l0, layer_flops(s0), l1, layer_flops(s1))
    ea, eb = _affine(max(e0, 0.0), ends_flops(s0), max(e1, 0.0), ends_flops(s1))
    if eb <= 0:
        # noise on a loaded machine left nothing for the ends (the deeper model's extra layers took all of the
        # shallow one's time): the ends are matmuls too (embedding gather, lm_head, loss), so they take the layer's
        # rate per FLOP rather than a zero the loader refuses (calibration_bounds: a zero time per FLOP)
        ea, eb = 0.0, lb
        e0 = lb * ends_flops(s0)
    e0 = max(e0, 0.0)   # shown as measured: a noisy negative is shown as nothing
    m = micros[0]
    per_param = (at[(hi, m)]["update_s"] - at[(lo, m)]["update_s"]) / (at[(hi, m)]["parameters"] - at[(lo, m)]["parameters"])
    per_param = max(per_param, 0.0)
    fixed = max(statistics.fmean(at[(lo, mm)]["update_s"] for mm in micros) - per_param * at[(lo, m)]["parameters"], 0.0)
    saved = {n: statistics.fmean(at[(n, mm)]["fused_s"] - at[(n, mm)]["forward_backward_s"] - at[(n, mm)]["update_s"]
                                 for mm in micros) for n in (lo, hi)}
    delta_layer = (saved[hi] - saved[lo]) / dl
    return {"layer_fb_s": l0, "ends_fb_s": e0, "layer_a_s": la, "layer_s_per_flop": lb, "ends_a_s": ea,
            "ends_s_per_flop": eb, "update_per_param_s": per_param, "update_fixed_s": fixed,
            "fused_delta_layer_s": delta_layer, "fused_delta_fixed_s": saved[lo] - lo * delta_layer}


# ------------------------------------------------------------------------------------------ the pieces
@dataclass(frozen=True)
class Calibration:
    """A rehearsal folder's measured pieces."""

    where: str
    doc: dict[str, Any]
    links: dict[str, Any]      # "group Op" -> {"ranks", "bus_gb_s", "latency_ms", ...} (the links rung)


def load(folder: str | os.PathLike) -> Calibration:
    """The pieces of a `port rehearse` folder, every figure checked against its bound (calibration_bounds.py: a
    prediction only sees checked values); one RecipeError naming the file, the key and what to run otherwise."""
    d = Path(folder)
    p = d / FILE
    if not p.is_file() or p.is_symlink():
        raise RecipeError(f"--calibration {d}: no {FILE} there; run `port rehearse RECIPE --out {d}` (its compute "
                          "rung writes it) or drop --calibration for the roofline estimate")
    doc = files.read_json_object(p, what="calibration file", max_bytes=1 << 20)
    if doc.get("format") != "port-calibration/1" or not isinstance(doc.get("by_threads"), dict) or not doc["by_threads"] \
            or not isinstance(doc.get("shape"), dict):
        raise RecipeError(f"{p}: not a port calibration (format port-calibration/1 with shape and by_threads); "
                          "re-run `port rehearse` to write it")
    where = str(p)
    checked = {"format": doc["format"], "device": bounds.name(doc.get("device"), where, "device"),
               "by_threads": bounds.pieces(doc["by_threads"], where),
               "by_tp": bounds.by_tp(doc.get("by_tp"), where),
               "shape": bounds.shape(doc["shape"], where),
               "load_avg_1min": bounds.load_avg(doc.get("load_avg_1min"), where),
               "collectives": bounds.collectives(doc.get("collectives"), where)}
    links: dict[str, Any] = {}
    r = d / REHEARSE_FILE
    if r.is_file() and not r.is_symlink():
        reh = files.read_json_object(r, what="rehearsal record", max_bytes=16 << 20)
        for rung in reh.get("rungs") if isinstance(reh.get("rungs"), list) else []:
            if isinstance(rung, dict) and rung.get("name") == "links" and rung.get("status") == "pass":
                measured = (rung.get("links") or {}).get("measured") if isinstance(rung.get("links"), dict) else None
                links = bounds.links(measured or {}, str(r))
    return Calibration(str(d), checked, links)


SHAPE_KEYS = bounds.SHAPE_INTS + ("recompute",)   # the measured shape a prediction compares and scales from


def _threads(recipe: Recipe) -> int:
    """Threads a CPU worker of this recipe runs on (porting/train/run/step/runtime.py)."""
    n = os.cpu_count() or 1
    return max(1, n // recipe.cluster.devices_per_node) if recipe.world_size > 1 else n


def _table(cal: Calibration, tp: int) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(the pieces by thread count, the shape they were measured at, whether at this TP): the compute rung
    measures one TP rank's slice at every TP the plan ranks (``by_tp``) and the recipe's own (``by_threads``)."""
    base = cal.doc["shape"]
    other = (cal.doc.get("by_tp") or {}).get(str(tp))
    if tp != base["tp"] and isinstance(other, dict):
        return other, {**base, "tp": tp}, True
    return cal.doc["by_threads"], base, tp == base["tp"]


def _node_contention(cal: Calibration, recipe: Recipe) -> comm_price.Contention | None:
    """The synchronisation chain's figures when they were measured on a node like the recipe's: the same number of
    workers (and, on a CPU, threads each) as the recipe runs on a node; else None."""
    cont = comm_price.contention(cal.doc)
    if cont is None or recipe.world_size < 2 or cont.workers != recipe.cluster.devices_per_node:
        return None
    if recipe.cluster.device == "cpu" and cont.threads not in (None, 0, _threads(recipe)):
        return None
    return cont


def _rates(cal: Calibration, recipe: Recipe, cont: comm_price.Contention | None
           ) -> tuple[dict[str, float], dict[str, Any], str]:
    """The measured figures for this recipe's workers, the shape they were measured at, and where they come from.
    On a CPU node of several workers each worker computes beside the others: its times x the compute factor the
    synchronisation chain measured on a node like it (every worker computing against one alone; comm_price.py),
    else x threads x workers / cores when they outnumber the cores (its share of them: a scaling, said as such).
    ``cont``: the chain's figures on a node like the recipe's (:func:`_node_contention`), or None."""
    by, base, at_tp = _table(cal, recipe.parallel.tensor_parallel)
    tp_note = f" at TP {base['tp']}" if at_tp else f" at TP {base['tp']} (no slice of TP {recipe.parallel.tensor_parallel} measured)"
    if recipe.cluster.device != "cpu":
        t = next(iter(by))
        return by[t], base, "measured on one device" + tp_note
    want, n = _threads(recipe), os.cpu_count() or 1
    near = want if str(want) in by else min((int(t) for t in by), key=lambda t: abs(t - want))
    f = near / want   # fewer threads: proportionally slower
    busy = want * (recipe.cluster.devices_per_node if recipe.world_size > 1 else 1)
    share = max(1.0, busy / n)
    how = (f"measured at {want} thread(s) per worker" if near == want else
           f"scaled from {near} to {want} thread(s) per worker") + tp_note
    if cont is not None:
        share = cont.compute_factor
        how += (f"; x {share:.2f}: a worker computing beside the node's {cont.workers} against one alone, measured "
                "(the synchronisation chain, comm_price.py)")
    elif share > 1:
        how += f"; x {share:g}: {busy} worker threads share {n} cores"
    rates = by[str(near)]
    return ({k: v * f * share if k.endswith(("_s", "_per_flop")) else v for k, v in rates.items()}, base, how)


def sync_waits(recipe: Recipe, layout: Layout, figures: tuple[CommFigure, ...], compute_s: float,
               cont: comm_price.Contention | None) -> tuple[float, str]:
    """Seconds the step's synchronising calls wait beyond the calls themselves (comm_price.py module docstring):
    every tensor-parallel call after its share of the compute, and the data-parallel gradient reduction (and ZeRO's
    gather after the update) after the whole; (0, why) without a chain measured on a node like the recipe's."""
    if cont is None:
        return 0.0, ""
    calls = [("tp", recipe.parallel.tensor_parallel, sum(f.count for f in figures if f.group == "tp"))]
    calls.append(("dp", recipe.data_parallel_size, (1 + bool(layout.sharded)) if recipe.data_parallel_size > 1 else 0))
    total, said = 0.0, []
    for group, ranks, n in calls:
        w = comm_price.wait_s(cont, ranks, compute_s / n) if n else None
        if w is None:
            continue
        total += n * w
        said.append(f"{group} {n} x {w * 1e3:.2f} ms (group of {ranks}, after {compute_s / n * 1e3:.1f} ms of compute)")
    return total, (f"synchronisation waits measured on a node of {cont.workers} workers: " + "; ".join(said)
                   if said else "")


per_call_s = comm_price.per_call_s   # the interpolation of the compute rung's points (kept here: its tests call it)


def comm_figures(recipe: Recipe, cfg: LlamaConfig, layout: Layout, cal: Calibration) -> tuple[CommFigure, ...]:
    """Every collective of the step priced from the rehearsal (porting/train/plan/comm_price.py), each with where its
    figure comes from; on Ascend a figure nothing measured is the roofline's peak link figure."""
    ascend = recipe.cluster.device == "ascend"
    peak_links = roofline.links(recipe) if ascend else None
    out = []
    for c in sharding.collectives(recipe, cfg, layout=layout):
        peak = None
        if peak_links is not None:
            name = peak_links.inter_node if c.group == "dp" and peak_links.dp_spans_nodes else peak_links.intra_node
            peak = (peak_links.bytes_per_s(c.group), name)
        out.append(comm_price.price(c, cal.doc, cal.links, native_rs=sharding.has_reduce_scatter(recipe.cluster.device),
                                    nodes=recipe.cluster.nodes, peak=peak))
    return tuple(out)


def predict(recipe: Recipe, cfg: LlamaConfig, layout: Layout, cal: Calibration) -> CalibratedStep:
    """The calibrated step of ``recipe`` (module docstring), by part, with the source of each figure."""
    measured_on = cal.doc.get("device")
    if measured_on is not None and measured_on != recipe.cluster.device:
        raise RecipeError(f"--calibration {cal.where}: measured on {measured_on}, the recipe runs on "
                          f"{recipe.cluster.device}; rehearse on the recipe's own device (`port rehearse RECIPE --out "
                          "DIR` there) or drop --calibration for the roofline estimate")
    cont = _node_contention(cal, recipe)
    rates, base, where = _rates(cal, recipe, cont)
    mine = shape_of(recipe, cfg)
    same = all(base.get(k) == mine.get(k) for k in SHAPE_KEYS)
    scaled = "at this shape" if same else \
        f"a fixed time + a time per FLOP, measured at hidden {base['hidden']}, seq {base['seq']}, micro {base['micro']}" \
        f" and {2 * base['micro']}, TP {base['tp']}"
    L, accum = cfg.num_hidden_layers, recipe.batching.grad_accum_steps
    shard = recipe.data_parallel_size if layout.sharded else 1
    fb = (L * (rates["layer_a_s"] + rates["layer_s_per_flop"] * layer_flops(mine))
          + rates["ends_a_s"] + rates["ends_s_per_flop"] * ends_flops(mine))
    update = rates["update_fixed_s"] + rates["update_per_param_s"] * layout.parameters / shard
    if accum == 1:   # one graph: what it saves against the two cells, measured, added to the update
        update = max(update + rates["fused_delta_fixed_s"] + L * rates["fused_delta_layer_s"], 0.0)
        how = f"one-graph step: forward+backward and update {where}, {scaled}; one graph's saving measured"
    else:
        how = f"{accum} x forward+backward {where}, {scaled}; update per parameter {where}"
    compute = accum * fb
    figures = comm_figures(recipe, cfg, layout, cal)
    comm = sum(f.seconds for f in figures)
    sync, sync_how = sync_waits(recipe, layout, figures, compute, cont)
    step = compute + update + comm + sync
    return CalibratedStep(
        kind="calibrated", from_=cal.where, step_s=round(step, 4), compute_s=round(compute, 4),
        memory_s=round(update, 4), comm_s=round(comm, 4), sync_s=round(sync, 4), sync_how=sync_how, how=how,
        comm_sources=tuple(f"{f.op} x{f.count} {f.group} of {f.ranks}: {f.seconds:.4f} s, {f.figure}" for f in figures),
        measured_shape=base, load_avg_at_measurement=cal.doc.get("load_avg_1min"),
        tokens_per_s=round(recipe.global_batch_size * recipe.data.max_seq_length / step, 2) if step else None,
        comm_figures=figures)


def estimate(recipe: Recipe, cfg: LlamaConfig, layout: Layout, cal: Calibration | None) -> StepEstimate | None:
    """The plan's step estimate: calibrated when a rehearsal is given, else the roofline on Ascend (labelled
    as such), else none (a CPU recipe has no peak figures)."""
    if cal is not None:
        return predict(recipe, cfg, layout, cal)
    if recipe.cluster.device != "ascend":
        return None
    return dataclasses.replace(roofline.step_time(recipe, cfg, layout), kind="roofline")


@dataclass(frozen=True)
class Throughput:
    """tokens/s per device and MFU of a step estimate (module docstring; plan.json ``throughput``)."""

    tokens_per_s_per_device: float
    flops_per_token: float
    model_tflops_per_device: float
    mfu: float | None                # None: no peak figure for the device (a CPU)
    peak_tflops: float | None
    peak_source: str
    formula: str


def throughput(recipe: Recipe, cfg: LlamaConfig, est: StepEstimate | None) -> Throughput | None:
    """tokens/s per device and MFU of an estimate (module docstring); None without an estimate."""
    if est is None or not est.step_s:
        return None
    seq = recipe.data.max_seq_length
    per_device = recipe.global_batch_size * seq / est.step_s / recipe.world_size
    fpt = flops_per_token(cfg, seq)
    peak, source = roofline.peak_flops(recipe)
    return Throughput(tokens_per_s_per_device=round(per_device, 1), flops_per_token=fpt,
                      model_tflops_per_device=round(per_device * fpt / 1e12, 3),
                      mfu=round(per_device * fpt / peak, 4) if peak else None,
                      peak_tflops=peak / 1e12 if peak else None, peak_source=source, formula=MFU_FORMULA)


def step_line(e: StepEstimate, links: roofline.Links | None) -> list[str]:
    """The estimate as text lines, saying what kind of figure it is (``links``: the roofline's, on Ascend)."""
    if isinstance(e, CalibratedStep):
        out = [f"estimated step (calibrated from {e.from_}, measured pieces; machine load "
               f"{e.load_avg_at_measurement} when measured): {e.step_s:.4f} s = compute {e.compute_s:.4f} + "
               f"update {e.memory_s:.4f} + communication {e.comm_s:.4f}"
               + (f" + synchronisation waits {e.sync_s:.4f}" if e.sync_s else "") + f" ({e.how})"]
        return out + [f"  {s}" for s in e.comm_sources] + ([f"  {e.sync_how}"] if e.sync_how else [])
    assert links is not None, "a roofline estimate is made with the roofline's links (make_plan, Ascend)"
    return [f"estimated step (roofline at the {links.chip} peak, an estimate, not calibrated: give --calibration "
            f"REHEARSAL for measured figures): {e.step_s:.2f} s = compute {e.compute_s:.2f} + optimizer "
            f"{e.memory_s:.2f} + communication {e.comm_s:.2f} (TP {e.comm_tp_s:.2f} at "
            f"{links.tp_bytes_per_s / 1e9:g} GB/s, {links.intra_node}; DP {e.comm_dp_s:.2f} at "
            f"{links.dp_bytes_per_s / 1e9:g} GB/s, "
            f"{links.inter_node if links.dp_spans_nodes else links.intra_node})"]


def throughput_line(t: Throughput) -> str:
    mfu = (f"MFU {t.mfu:.1%} of {t.peak_tflops:g} TFLOP/s ({t.peak_source})" if t.mfu is not None
           else f"no peak figure for this device ({t.peak_source})")
    return (f"throughput: {t.tokens_per_s_per_device:,.1f} tokens/s per device, {t.model_tflops_per_device:g} "
            f"model TFLOP/s per device, {mfu}; {t.flops_per_token / 1e9:.2f} GFLOP per token; {t.formula}")
