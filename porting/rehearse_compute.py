"""The ``compute`` rung of `port rehearse`: port's own step cells timed at the recipe's real shapes on one
device, so `port train --dry-run --calibration REHEARSAL` predicts the step from measured pieces
(porting/train/plan/calibrated.py) instead of the roofline at peak.

What it runs, in a child process per tensor-parallel size and thread count (``python -m porting.rehearse_compute
SPEC OUT``): the recipe's architecture at its hidden size, head dimension, sequence length and dtypes, sliced as one
tensor-parallel rank holds it (heads, KV heads, intermediate size and vocabulary divided by TP; Megatron's
column/row split gives each rank exactly that much matmul work) at every TP the plan ranks (:func:`tp_sizes`: the
recipe's, then the others of porting/train/plan/roofline.py ``tp_options``), built with 1 and with :data:`DEEP`
decoder layers and fed micro-batches of the recipe's size and of twice it. For each model and size it times, after a
compile and a warm-up call, the median of :data:`REPEATS` calls (all of them in turn, round by round) of

The plan (``calibrated.derive``) takes a layer as the difference of the depths and the ends (embedding, final norm,
LM head, loss, per-call overheads) as what is left at depth 1, each as a fixed time plus a time per FLOP from the
two micro-batch sizes (a CPU is faster per FLOP on larger matrices); the update's difference over the layers'
parameters is its cost per parameter; the one-graph step's difference from forward+backward+update is what one
graph saves. On a CPU each msrun worker gets ``cpu_count // devices_per_node`` threads
(porting/train/run/step/runtime.py), so the rung measures at every thread count a layout of the recipe's node gives.

Collectives as the step runs them: a recipe with more than one device per node also gets an msrun job of that
many workers (``porting/launch/workers/collectives.py SPEC OUT``) timing, in graph mode, every kind the step runs
(AllReduce, ReduceScatter, AllGather; on the CPU ReduceScatter and a sub-group's AllGather as port emulates them,
named so) on groups of each TP and DP size of the ranked layouts that the node holds, and on the node's whole group
(:func:`group_sizes`), chained in one compiled cell (the per-call cost, not a launch: 8 calls up to 512 KiB, 2 of
4 MiB and 16 MiB), at 1 KiB to 16 MiB per rank: the plan interpolates a call's time at its own size between them
(a CPU's collective is not one latency plus one bandwidth: its cost per byte changes with the size), and
extrapolates a group size the node does not hold from the nearest one it timed (one node of a multi-node recipe:
the sizes are listed in ``collectives.extrapolated``; porting/train/plan/comm_price.py says how). The ``links``
rung's figures are PyNative calls (about 3x slower per call on the CPU, measured here), so the plan takes these
first. The same job times a synchronisation chain on each group size (matmul chunks on every rank with and without a
1 KiB AllReduce after each, and on rank 0 alone): what a worker's compute costs beside the node's others and what
each synchronising call waits (porting/train/plan/comm_price.py ``contention``). The figures go to
``calibration.json`` in the rehearsal folder.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:   # hints only: the rung's own process imports what it runs
    from model_zoo.config import LlamaConfig
    from porting.train.recipe.schema import Recipe

FILE = "calibration.json"
FORMAT = "port-calibration/1"
DEEP = 4
REPEATS = 9


def tp_slice(cfg_hf: dict[str, Any], tp: int) -> dict[str, Any]:
    """config.json of the model one tensor-parallel rank computes (heads, KV heads, intermediate, vocab / tp)."""
    c = dict(cfg_hf)
    heads = int(c["num_attention_heads"])
    c["head_dim"] = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    c["num_attention_heads"] = heads // tp
    c["num_key_value_heads"] = int(c.get("num_key_value_heads") or heads) // tp
    c["intermediate_size"] = int(c["intermediate_size"]) // tp
    c["vocab_size"] = int(c["vocab_size"]) // tp
    return c


def thread_counts(recipe: Recipe) -> list[int]:
    """Threads a worker of this recipe's node gets on this CPU, alone and with the node's workers."""
    n = os.cpu_count() or 1
    return sorted({n, max(1, n // recipe.cluster.devices_per_node)}, reverse=True)


def tp_sizes(recipe: Recipe, cfg: LlamaConfig) -> list[int]:
    """The tensor-parallel sizes the plan ranks (porting/train/plan/roofline.py ``tp_options``), the recipe's first:
    the rung measures one rank's slice at each, so a layout at another TP is priced from its own slice."""
    from porting.train.plan.roofline import tp_options

    mine = recipe.parallel.tensor_parallel
    return [mine] + [t for t in tp_options(recipe, cfg) if t != mine]


def group_sizes(recipe: Recipe, cfg: LlamaConfig) -> tuple[list[int], list[int]]:
    """(sizes timed, sizes extrapolated): every TP and DP group size of the layouts the plan ranks, timed where
    the node holds a group of it (a size that divides its workers: the world is cut into groups of neighbours,
    porting/launch/workers/collectives.py), the node's whole group always (the largest, which the plan
    extrapolates the others from: porting/train/plan/comm_price.py); the rest is extrapolated."""
    n, world = recipe.cluster.devices_per_node, recipe.world_size
    wanted = {s for t in tp_sizes(recipe, cfg) for s in (t, world // t) if s >= 2}
    held = sorted({s for s in wanted if s <= n and n % s == 0} | ({n} if n >= 2 else set()))
    return held, sorted(wanted - set(held))


def spec_for(recipe: Recipe, cfg: LlamaConfig, threads: int, tp: int | None = None) -> dict[str, Any]:
    p, o = recipe.precision, recipe.optimizer
    m = recipe.batching.micro_batch_size
    tp = recipe.parallel.tensor_parallel if tp is None else tp
    return {"config": tp_slice(cfg.to_hf(), tp), "layers": [1, DEEP], "tp": tp,
            "micros": [m, 2 * m], "seq": recipe.data.max_seq_length,
            "param_dtype": p.param_dtype, "compute_dtype": p.compute_dtype, "device": recipe.cluster.device,
            "threads": threads, "repeats": REPEATS, "grad_clip": o.grad_clip, "betas": list(o.betas), "eps": o.eps,
            "weight_decay": o.weight_decay, "seed": recipe.seed, "recompute": recipe.memory.recompute}


def _pieces(recipe: Recipe, cfg: LlamaConfig, out: Path, timeout: float, run: Callable, tp: int,
            shape: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """{threads: pieces} of one TP rank's slice at every thread count (one child each), or '' and why it failed."""
    from porting.train.plan.calibrated import derive

    table: dict[str, Any] = {}
    for threads in thread_counts(recipe):
        spec = out / "compute" / f"spec_tp{tp}_t{threads}.json"
        res = out / "compute" / f"result_tp{tp}_t{threads}.json"
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(json.dumps(spec_for(recipe, cfg, threads, tp)), encoding="utf-8")
        argv = [sys.executable, "-m", "porting.rehearse_compute", str(spec), str(res)]
        codes, tail = run([argv], out / "logs" / f"compute_tp{tp}_t{threads}.log", timeout)
        if codes != [0] or not res.is_file():
            why = "timed out" if codes == [None] else f"exit {codes[0]}"
            last = tail.strip().splitlines()[-1][:300] if tail.strip() else ""
            return table, f"TP {tp}, {threads} thread(s): {why}: {last}"
        raw = json.loads(res.read_text(encoding="utf-8"))
        table[str(threads)] = {**derive(raw["points"], {**shape, "tp": tp}), "threads": threads, "points": raw["points"]}
    return table, ""


def measure(recipe: Recipe, cfg: LlamaConfig, out: Path, timeout: float, run: Callable) -> tuple[str, str, dict[str, Any]]:
    """(status, detail, calibration) of the rung; ``run(argvs, log, timeout)`` is rehearse.py's process runner."""
    from model_zoo.files import write_atomic
    from porting.env import cpu_model
    from porting.train.plan.calibrated import shape_of

    doc: dict[str, Any] = {"format": FORMAT, "device": recipe.cluster.device, "cpu": cpu_model(),
                           "load_avg_1min": round(os.getloadavg()[0], 2), "shape": shape_of(recipe, cfg),
                           "by_threads": {}, "by_tp": {}}
    for tp in tp_sizes(recipe, cfg):
        table, why = _pieces(recipe, cfg, out, timeout, run, tp, doc["shape"])
        if why:
            return "fail", why, doc
        if tp == recipe.parallel.tensor_parallel:
            doc["by_threads"] = table
        else:
            doc["by_tp"][str(tp)] = table
    note = ""   # collectives' detail: why they failed, or what a pass adds
    if recipe.cluster.devices_per_node > 1:
        status, note, doc["collectives"] = collectives(recipe, out, timeout, cfg)
        if status != "pass":
            return status, note, doc
    write_atomic(out / FILE, json.dumps(doc, indent=1))
    return "pass", _detail(doc, note), doc


def _detail(doc: dict[str, Any], note: str) -> str:
    """The rung's one line: the pieces at the recipe's TP, the other TPs measured, each collective timed."""
    parts = "; ".join(f"{t} thread(s): layer forward+backward {v['layer_fb_s'] * 1e3:.1f} ms ({v['layer_a_s'] * 1e3:.1f} ms "
                      f"+ {v['layer_s_per_flop'] * 1e12:.1f} ms per TFLOP), ends {v['ends_fb_s'] * 1e3:.1f} ms, update "
                      f"{v['update_per_param_s'] * 1e9:.2f} ns/parameter" for t, v in doc["by_threads"].items())
    others = f"; also one rank's slice at TP {', '.join(doc['by_tp'])}" if doc["by_tp"] else ""
    col = doc.get("collectives") or {}
    colls = "; ".join(f"{k} ({v['runs']}" + (", emulated" if v.get("emulated") else "") + "): "
                      + ", ".join(f"{b >> 10} KiB {t:.2f} ms" for b, t in v["points_bytes_ms"][::2]) + " per call"
                      for k, v in (col.get("measured") or {}).items())
    extra = f"; group sizes {', '.join(map(str, col['extrapolated']))} not held by one node: the plan extrapolates " \
            "them (porting/train/plan/comm_price.py)" if col.get("extrapolated") else ""
    return (f"{parts} (micro {doc['shape']['micro']} x seq {doc['shape']['seq']}, TP {doc['shape']['tp']}){others}"
            + (f"; graph mode: {colls}" if colls else "") + extra + (f" ({note})" if note else "") + f"; {FILE}")


def collectives(recipe: Recipe, out: Path, timeout: float, cfg: LlamaConfig | None = None,
                elements: tuple[int, ...] = (), repeats: int = 0, chunks: tuple[tuple[int, int], ...] = (),
                sync_calls: int = 0) -> tuple[str, str, dict[str, Any]]:
    """Graph-mode AllReduce, ReduceScatter and AllGather on groups of the recipe's TP and DP sizes that the node's
    workers hold, and the synchronisation chain, under msrun (module docstring); ``elements`` / ``repeats`` /
    ``chunks`` / ``sync_calls``: other float32 counts per call, timed calls, chain chunk shapes and chunks a timing
    than the worker's (a quicker look)."""
    from porting.cluster.preflight import free_port
    from porting.launch.jobs import WORKERS, MsrunJob, MsrunNotFound
    from porting.train.plan.launch import MsrunSpec

    n = recipe.cluster.devices_per_node
    held, extrapolated = group_sizes(recipe, cfg) if cfg is not None else ([n], [])
    res = out / "compute" / "collectives.json"
    spec = out / "compute" / "collectives_spec.json"
    spec.write_text(json.dumps({"device": recipe.cluster.device, "threads": max(1, (os.cpu_count() or 1) // n),
                                "sizes": held, "elements": list(elements), "repeats": repeats,
                                "chunks": [list(c) for c in chunks], "sync_calls": sync_calls}), encoding="utf-8")
    job = MsrunJob.make("rehearsal collectives", MsrunSpec(
        worker_num=n, local_worker_num=n, master_port=free_port(), log_dir=out / "compute" / "msrun",
        script=WORKERS / "collectives.py", args=(str(spec), str(res))))
    res.unlink(missing_ok=True)   # only this launch's points count (port rehearse's --out is new: check_out)
    try:
        ended = job.run(timeout_s=timeout, output=out / "logs" / "compute_collectives.log")
    except MsrunNotFound:
        return "fail", "msrun not found (it comes with MindSpore): no collectives measured", {}
    how = "timed out" if ended.timed_out else f"exit {ended.code}"
    try:   # rank 0 writes it after the last collective, which every rank ran (porting/launch/workers/collectives.py)
        points = json.loads(res.read_text(encoding="utf-8")) if res.is_file() else None
    except (OSError, ValueError):
        points = None
    if not isinstance(points, dict):
        return "fail", f"collectives under msrun: {how}", {}
    points["extrapolated"] = extrapolated
    # measured: a worker's exit seen late by msrun's scheduler does not undo it (porting/launch/outcome.py's rule)
    return "pass", "" if ended.code == 0 else f"msrun {how} after rank 0 wrote every measurement", points


# ------------------------------------------------------------------------------------------ the child
def _calls(spec: dict[str, Any], layers: int) -> tuple[dict[tuple[str, int], Callable[[], Any]], int]:
    """The timed calls of port's step cells at ``layers`` layers, for each micro-batch size of the spec (one graph
    per input shape), and the model's parameter count."""
    import mindspore as ms
    import numpy as np
    from mindspore import ParameterTuple

    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build
    from porting.train.run.step import cells as S

    cfg = LlamaConfig.from_hf({**spec["config"], "num_hidden_layers": layers})
    model = build(cfg, param_dtype=spec["param_dtype"], compute_dtype=spec["compute_dtype"], seed=spec["seed"])
    if spec["recompute"]:
        for layer in model.model.layers:
            layer.recompute()
    params = list(model.trainable_params())
    hyper = dict(betas=tuple(spec["betas"]), eps=spec["eps"], weight_decay=spec["weight_decay"])
    opt = S.AdamW(params, **hyper)
    buffers = S.accumulation_buffers(ParameterTuple(params))
    accumulate = S.AccumGradStep(model, opt.params, buffers)
    apply = S.ApplyStep(opt, buffers, 1, spec["grad_clip"])
    fused = S.FusedTrainStep(model, S.AdamW(params, **hyper), 1, spec["grad_clip"])
    rng = np.random.default_rng(0)
    f32 = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
    one, lr, bc = f32(1.0), f32(1e-5), f32(0.5)
    sums: list = []
    calls: dict[tuple[str, int], Callable[[], Any]] = {}
    for micro in spec["micros"]:
        ids = rng.integers(3, cfg.vocab_size, (micro, spec["seq"]), dtype=np.int32)
        scale = f32(1.0 / ids.size)

        def forward_backward(ids=ids, scale=scale):   # as Trainer._step_cells: the batch to tensors, the cell
            sums[:] = accumulate(ms.Tensor(ids), ms.Tensor(ids), scale)
            sums[0].asnumpy()

        def update():   # as Trainer: the sums read on the host (one micro-batch: nothing to add), the update
            local = ms.ops.stack(list(sums)).asnumpy()
            for o in apply(ms.Tensor(local[0]), ms.Tensor(local[1]), one, lr, bc, bc):
                o.asnumpy()

        def fused_step(ids=ids, scale=scale):   # grad_accum_steps 1: the one-graph step
            for o in fused(ms.Tensor(ids), ms.Tensor(ids), scale, one, lr, bc, bc):
                o.asnumpy()

        calls.update({("forward_backward", micro): forward_backward, ("update", micro): update,
                      ("fused", micro): fused_step})
    for fn in calls.values():   # compile, then warm up (each update after the forward_backward of its size)
        fn()
        fn()
    return calls, int(sum(int(np.prod(p.shape)) for p in params))


def _timed(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Median seconds of each call at each depth and micro-batch size, every call of every model taken in turn
    round by round, so that a machine whose load drifts weighs on all of them alike."""
    built = {n: _calls(spec, n) for n in spec["layers"]}
    times: dict[tuple[int, str, int], list[float]] = {}
    for _ in range(spec["repeats"]):
        for n, (calls, _params) in built.items():
            for (name, micro), fn in calls.items():
                t0 = time.perf_counter()
                fn()
                times.setdefault((n, name, micro), []).append(time.perf_counter() - t0)
    return [{"layers": n, "micro": m, "parameters": params,
             **{f"{name}_s": statistics.median(times[(n, name, m)]) for name in ("forward_backward", "update", "fused")}}
            for n, (_unused, params) in built.items() for m in spec["micros"]]


def child(spec_path: str, out_path: str) -> None:
    import mindspore as ms

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device({"cpu": "CPU", "ascend": "Ascend"}[spec["device"]])
    if spec["device"] == "cpu":
        from mindspore.device_context.cpu.op_tuning import threads_num

        threads_num(int(spec["threads"]))
    out = {"threads": spec["threads"], "points": _timed(spec)}
    Path(out_path).write_text(json.dumps(out, indent=1), encoding="utf-8")


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
