"""`port rehearse RECIPE`: the migration's acceptance ladder, run at the recipe's shape scaled to this machine.

The field takes a port up the same ladder every time: a graph compiles and one device trains; the model
matches the reference forward and backward; one node runs the parallel groups the cluster will run; more
than one node does. A rehearsal runs the recipe's architecture (a small model of the same family: its
head grouping, tied embeddings, RoPE and biases, random weights) with the recipe's tensor parallel (up to 2),
data parallel 2, optimizer sharding, recompute and packing, at a fixed global batch of 4 sequences, on
the packaged TinyStories sample, up that ladder:

- ``single``: one device, ``port train``; its first step's compile time is kept apart (metrics.jsonl).
- ``parity``: ``port verify --grads`` of the small model against HF transformers (forward and backward).
- ``node``: one node with the recipe's groups (TP x DP 2) under msrun; each step's loss and gradient norm
  must equal the single device's (global batch the same, accumulation making up the DP).
- ``two-nodes``: the same groups as two msrun node ranks on this machine (loopback master), as a
  multi-node recipe launches them; each step must equal the ``node`` rung's.

Each rung runs ``port`` as a user would, in its own run directory with per-rank logs, under a deadline.
The first rung that fails stops the ladder; its logs are diagnosed (``port diagnose``) and the verdict
is written. ``rehearse.json`` in the rehearsal directory records every rung (status, seconds, compile
seconds, losses, the command), and ``port report`` on that directory fills its stability, communication
and compile rows from it. On a 910C node the same rungs run on the NPU (``cluster.device: ascend``, the
recipe's precision and fused kernels); on a CPU they run in float32 with port's CPU kernels.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from model_zoo.config import LlamaConfig
from model_zoo.errors import DiagnosticsError, PortingError
from model_zoo.files import write_atomic
from porting.cluster.preflight import free_port
from porting.diagnostics.diagnose import diagnose
from porting.launch import lifeline
from porting.launch.children import child_env, stop_group
from porting.rundir import read_run
from porting.train import load_recipe, plan_config, recipe_dict
from porting.verify.stats import LAYOUT_TOLERANCES
from porting.train.recipe.yaml_bounded import parse_value
from porting.train.recipe.schema import Recipe
from porting.rundir.paths import RunDir
from porting.rehearse_compute import group_sizes, tp_sizes
from porting.rehearse_model import SEQ, scaled_config, write_scaled_model  # noqa: F401 (porting.rehearse.*)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"
REHEARSE_FILE = "rehearse.json"
GLOBAL_BATCH = 4
STEPS = 3
# The layout tolerances of port's one table (porting/verify/stats.py): fp32 TP/DP reductions only reorder sums.
LOSS_ATOL = LAYOUT_TOLERANCES["loss_atol"]
GRAD_NORM_RTOL = LAYOUT_TOLERANCES["grad_norm_rtol"]
RUNGS = ("single", "parity", "node", "links", "compute", "two-nodes")


class RehearsalError(PortingError):
    """A rehearsal cannot be set up (output folder, recipe)."""


@dataclasses.dataclass
class Rung:
    name: str
    status: str = "not run"          # pass, fail, skip, not run
    seconds: float = 0.0
    detail: str = ""
    compile_s: float | None = None
    losses: list[float] = dataclasses.field(default_factory=list)
    grad_norms: list[float] = dataclasses.field(default_factory=list)
    layout: str = ""
    run_dir: str = ""
    command: list[str] = dataclasses.field(default_factory=list)
    diagnosis: dict[str, Any] | None = None
    links: dict[str, Any] = dataclasses.field(default_factory=dict)   # the links rung's figures
    calibration: dict[str, Any] = dataclasses.field(default_factory=dict)   # the compute rung's (calibration.json)


def rung_recipe(base: dict[str, Any], model_dir: Path, run_dir: Path, *, tp: int, dp: int, nodes: int,
                port: int, ascend: bool) -> dict[str, Any]:
    """The scaled recipe of one rung: the recipe's parallel choices at TP ``tp`` x DP ``dp`` on ``nodes``."""
    r = json.loads(json.dumps(base))
    prec = r["precision"] if ascend else {"param_dtype": "float32", "compute_dtype": "float32",
                                         "grad_reduce_dtype": "float32", "loss_scale": {"kind": "none"}}
    packing = r["batching"].get("packing", False)
    return {
        "model": {"source": str(model_dir)},
        "data": {"path": str(SAMPLE), "format": "text", "max_seq_length": SEQ, "long_text": "split"},
        "batching": {"micro_batch_size": 1, "grad_accum_steps": GLOBAL_BATCH // dp, "packing": packing,
                     "bucketing": {"enabled": not packing, "max_shapes": 2, "pad_to_multiple_of": 16}},
        "optimizer": r["optimizer"],
        "schedule": {"max_steps": STEPS, "warmup_steps": 0, "decay": "constant"},
        "precision": prec,
        "memory": r["memory"],
        "parallel": {"tensor_parallel": tp, "optimizer_sharding": r["parallel"]["optimizer_sharding"],
                     "zero_stage": r["parallel"]["zero_stage"], "comm_fusion": r["parallel"]["comm_fusion"]},
        "cluster": {"device": "ascend" if ascend else "cpu", "nodes": nodes, "devices_per_node": tp * dp // nodes,
                    "master_addr": "127.0.0.1", "master_port": port,
                    "cluster_time_out": r["cluster"]["cluster_time_out"]},
        "checkpointing": {"every_steps": 0, "export_hf": False},
        "logging": {"every_steps": 1, "progress": "lines"},
        # a rung is an acceptance check: its first non-finite step fails it (a run would skip it, nonfinite.*)
        "nonfinite": {"max_consecutive_skips": 0, "max_total_skips": 0},
        "seed": r["seed"],
        "output_dir": str(run_dir),
    }


def _metrics(run_dir: Path) -> tuple[list[float], list[float], float | None]:
    """Per-step loss and gradient norm, and the compile steps' seconds, from the rung's metrics.jsonl."""
    run = read_run(run_dir, strict=False)
    losses = [r.loss for r in run.steps]
    norms = [r.grad_norm for r in run.steps]
    comp = [r.step_time_s for r in run.steps if r.compile]
    if run.summary is not None and run.summary.precompile_s is not None:   # compiled before step 1 (run/step/precompile.py)
        comp.append(run.summary.precompile_s)
    return losses, norms, (round(sum(comp), 3) if comp else None)


def _run(argvs: list[list[str]], log: Path, timeout: float) -> tuple[list[int], str]:
    """Start every argv at once (each in its own process group), wait for all under one deadline; on the
    deadline, stop only those groups. Returns the exit codes (None: killed) and the tail of the output."""
    env = child_env(parent=True)   # each child (a `port train`, the compute rung) dies with this process
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        procs = [lifeline.start(a, env, out) for a in argvs]
        deadline, codes = time.monotonic() + timeout, []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p in procs:
            if p.poll() is None:
                stop_group(p, 30.0, signals=(signal.SIGKILL,), descendants_too=False)
    text = log.read_text(encoding="utf-8", errors="replace")
    return codes, text[-4000:]


def _error_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    return lines[-1][len("error: "):] if lines else (text.strip().splitlines() or ["no output"])[-1][:300]


def _diagnose(run_dir: Path, world: int) -> dict[str, Any] | None:
    """`port diagnose` on a failed rung's logs (None where it left none)."""
    logs = RunDir(run_dir).logs
    if not logs.is_dir():
        return None
    try:
        d = diagnose(logs, jobs=1, world_size=world if world > 1 else None)
    except DiagnosticsError as e:
        return {"first_failing_rank": None, "reason": str(e)}
    return {k: d.get(k) for k in ("first_failing_rank", "last_step", "reason", "confidence")}


def _equal_steps(r: Rung, ref: Rung) -> str:
    """'' when every step's loss and gradient norm match the reference rung's, else what differs."""
    if len(r.losses) != len(ref.losses):
        return f"{len(r.losses)} step(s) logged, {ref.name} logged {len(ref.losses)}"
    for i, (a, b, ga, gb) in enumerate(zip(r.losses, ref.losses, r.grad_norms, ref.grad_norms), start=1):
        if not (math.isfinite(a) and abs(a - b) <= LOSS_ATOL):
            return f"step {i}: loss {a:.6f}, {ref.name} {b:.6f} (tolerance {LOSS_ATOL:g})"
        if not (math.isfinite(ga) and abs(ga - gb) <= GRAD_NORM_RTOL * abs(gb)):
            return f"step {i}: grad norm {ga:.6f}, {ref.name} {gb:.6f} (rtol {GRAD_NORM_RTOL:g})"
    return ""


def _train_rung(rung: Rung, recipe: dict[str, Any], out: Path, extra: list[str], timeout: float,
                nodes: int) -> None:
    """One `port train` rung (``nodes`` > 1: one `port train --launch-node N` per node, all at once)."""
    run_dir = Path(recipe["output_dir"])
    path = out / "recipes" / f"{rung.name}.yaml"
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, yaml.safe_dump(recipe, sort_keys=False), error=RehearsalError)
    base = [sys.executable, "-m", "porting", "train", str(path), *[a for s in extra for a in ("--set", s)]]
    argvs = [base] if nodes == 1 else [base + ["--launch-node", str(n)] for n in range(nodes)]
    rung.command, rung.run_dir = ["port", *base[3:]] + (["--launch-node", "N"] if nodes > 1 else []), str(run_dir)
    t0 = time.monotonic()
    codes, tail = _run(argvs, out / "logs" / f"{rung.name}.log", timeout)
    rung.seconds = round(time.monotonic() - t0, 2)
    world = recipe["cluster"]["devices_per_node"] * nodes
    if RunDir(run_dir).metrics.is_file():
        rung.losses, rung.grad_norms, rung.compile_s = _metrics(run_dir)
    if any(c != 0 for c in codes):
        rung.status = "fail"
        how = "timed out after %.0f s" % timeout if None in codes else f"exit {[c for c in codes if c][0]}"
        rung.detail = f"{how}: {_error_line(tail)}"
        rung.diagnosis = _diagnose(run_dir, world)
    elif len(rung.losses) != STEPS:
        rung.status, rung.detail = "fail", f"{len(rung.losses)} of {STEPS} steps logged"


def _links_rung(rung: Rung, recipe: dict[str, Any], out: Path, timeout: float) -> None:
    """The node's groups, each collective timed at a bandwidth-measuring size (porting/rehearse_links.py)."""
    from porting.rehearse_links import command_of, measure, recipe_of

    path = out / "recipes" / f"{rung.name}.yaml"
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, yaml.safe_dump(recipe, sort_keys=False), error=RehearsalError)
    rec = recipe_of(path)
    t0 = time.monotonic()
    rung.status, rung.detail, rung.links = measure(rec, timeout)
    rung.command = command_of(rec, timeout, rung.links["elements"])
    rung.seconds = round(time.monotonic() - t0, 2)


def _compute_rung(rung: Rung, rec: Recipe, cfg: LlamaConfig, out: Path, timeout: float) -> None:
    """Port's step cells timed at the recipe's real shapes on one device (porting/rehearse_compute.py)."""
    from porting.rehearse_compute import measure

    t0 = time.monotonic()
    rung.status, rung.detail, rung.calibration = measure(rec, cfg, out, timeout, _run)
    rung.command = ["python", "-m", "porting.rehearse_compute", "SPEC", "OUT"]
    rung.seconds = round(time.monotonic() - t0, 2)


def _parity_rung(rung: Rung, model_dir: Path, out: Path, timeout: float) -> None:
    try:
        import torch  # noqa: F401  (deferred: the HF reference needs the torch extra)
    except ImportError:
        rung.status, rung.detail = "skip", "torch is not installed (pip install 'port[torch]'): no HF reference"
        return
    # at the rungs' own length: a length-dependent RoPE whose small original context they pass is compared there
    argv = [sys.executable, "-m", "porting", "verify", "--hf", str(model_dir), "--grads", "--seq", str(SEQ)]
    rung.command = ["port", *argv[3:]]
    t0 = time.monotonic()
    codes, tail = _run([argv], out / "logs" / "parity.log", timeout)
    rung.seconds = round(time.monotonic() - t0, 2)
    if codes != [0]:
        rung.status = "fail"
        rung.detail = ("timed out" if codes == [None] else f"exit {codes[0]}") + f": {_error_line(tail)}"
    else:
        rung.status, rung.detail = "pass", "logits, loss and gradient norms within port verify's fp32 tolerances"


def _layout(recipe: Recipe) -> tuple[int, int, bool]:
    """The rehearsal's TP (the recipe's, at most 2), DP (2 when the recipe has data parallel, else 1), and
    whether its recipe spans nodes."""
    tp = 2 if recipe.parallel.tensor_parallel > 1 else 1
    dp = 2 if recipe.data_parallel_size > 1 else 1
    return tp, dp, recipe.cluster.nodes > 1


def ladder(rec: Recipe, only: tuple[str, ...] = RUNGS) -> tuple[list[Rung], dict[str, tuple[int, int, int]]]:
    """The rungs for a validated recipe, each with its layout or the reason it is skipped, and the
    (TP, DP, nodes) of each training rung."""
    tp, dp, multi_node = _layout(rec)
    plan = {"single": (1, 1, 1), "node": (tp, dp, 1), "links": (tp, dp, 1), "two-nodes": (tp, dp, 2)}
    rungs = [Rung(n) for n in RUNGS]
    for r in rungs:
        if r.name not in only:
            r.status, r.detail = "skip", "not asked for (--rungs)"
        elif r.name in ("node", "links") and tp * dp == 1:
            r.status, r.detail = "skip", "the recipe runs on one device: no parallel groups to rehearse"
        elif r.name == "two-nodes" and not multi_node:
            r.status, r.detail = "skip", "the recipe runs on one node"
        elif r.name == "compute" and (rec.cluster.device == "ascend") != _on_npu():
            r.status, r.detail = "skip", (f"the recipe runs on {rec.cluster.device} and this machine is "
                                          f"{'an NPU' if _on_npu() else 'a CPU'}: its step pieces are measured on "
                                          f"the recipe's own device (rehearse there: {_compute_layout(rec)})")
        elif r.name == "compute":
            r.layout = _compute_layout(rec)
        elif r.name in plan:
            t, d, n = plan[r.name]
            r.layout = f"TP {t} x DP {d} on {n} node(s)"
    return rungs, plan


def _compute_layout(rec: Recipe) -> str:
    """What the compute rung times: the TP slices, and the collectives' group sizes (those one node does not hold
    are extrapolated by the plan: porting/train/plan/comm_price.py)."""
    cfg = _full_config(rec)
    out = (f"one device, the recipe's own shapes (one TP rank's slice at TP {', '.join(map(str, tp_sizes(rec, cfg)))}),"
           " port's step cells at 1 and 4 layers")
    if rec.cluster.devices_per_node > 1:
        held, far = group_sizes(rec, cfg)
        out += (f"; every collective kind on groups of {', '.join(map(str, held))} (the node's "
                f"{rec.cluster.devices_per_node} workers)" + (f", groups of {', '.join(map(str, far))} extrapolated "
                                                               "from them by the ring" if far else ""))
    return out


def rehearse(recipe_path: str, out: Path, overrides: list[str] | None = None, *, rung_timeout: float = 600.0,
             only: tuple[str, ...] = RUNGS, extra: list[str] | None = None) -> list[Rung]:
    """Run the ladder for ``recipe_path`` into ``out`` (a new folder); returns the rungs in order.
    ``extra`` are ``--set`` overrides given to every training rung (the rung's own recipe is the scaled
    one; use it to change what the rehearsal cannot infer, or to break a rung on purpose)."""
    from converters.atomic import check_out

    # the converters' rule: a new path or an empty directory (never a user's files, never a link)
    check_out(out, inputs=[recipe_path], force=None, error=RehearsalError)
    for item in extra or []:   # checked before anything runs: a bomb is named here, not in a rung's log
        try:
            parse_value(item.partition("=")[2], f"--rung-set {item.partition('=')[0]!r}")
        except PortingError as e:
            raise RehearsalError(str(e)) from None
    rec = load_recipe(recipe_path, list(overrides or []), check_files=False)
    cfg = _full_config(rec)
    ascend = _on_npu() and rec.cluster.device == "ascend"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RehearsalError(f"{out}: cannot create the rehearsal folder ({e.strerror}); choose another --out") from None
    small = scaled_config(cfg, rec.data.max_seq_length)
    model_dir = out / "model"
    write_scaled_model(small, model_dir, seed=rec.seed)
    base = recipe_dict(rec)
    rungs, plan = ladder(rec, only)
    by = {r.name: r for r in rungs}
    for r in rungs:
        if r.status == "skip":
            continue
        if r.name == "parity":
            _parity_rung(r, model_dir, out, rung_timeout)
        elif r.name == "compute":
            _compute_rung(r, rec, cfg, out, rung_timeout)
        elif r.name == "links":
            t, d, _ = plan[r.name]
            _links_rung(r, rung_recipe(base, model_dir, out / "rungs" / r.name, tp=t, dp=d, nodes=1,
                                       port=free_port(), ascend=ascend), out, rung_timeout)
        else:
            t, d, n = plan[r.name]
            recipe = rung_recipe(base, model_dir, out / "rungs" / r.name, tp=t, dp=d, nodes=n,
                                 port=free_port(), ascend=ascend)
            _train_rung(r, recipe, out, list(extra or []), rung_timeout, n)
            ref = by["node"] if r.name == "two-nodes" and by["node"].status == "pass" else by["single"]
            if r.status == "not run":
                diff = _equal_steps(r, ref) if r.name != "single" and ref.status == "pass" else ""
                r.status, r.detail = ("fail", diff) if diff else ("pass", _pass_detail(r, ref))
        _write(out, recipe_path, overrides, rungs, small)
        if r.status == "fail":
            break
    _write(out, recipe_path, overrides, rungs, small)
    return rungs


def _pass_detail(r: Rung, ref: Rung) -> str:
    what = f"{len(r.losses)} steps, final loss {r.losses[-1]:.4f}" if r.losses else ""
    if r.name != "single" and ref.status == "pass":
        what += f"; every step's loss and grad norm equal {ref.name}'s"
    return what


def _full_config(rec: Recipe) -> LlamaConfig:
    """The recipe model's architecture, from its checkpoint where it is here, else the zoo's copy."""
    cfg, _ = plan_config(rec)
    return cfg


def _on_npu() -> bool:
    return shutil.which("npu-smi") is not None or Path("/dev/davinci0").exists()


def _write(out: Path, recipe_path: str, overrides: list[str] | None, rungs: list[Rung], small: LlamaConfig) -> None:
    doc = {"format": "port-rehearse/1", "recipe": str(recipe_path), "overrides": list(overrides or []),
           "device": "ascend" if _on_npu() else "cpu", "global_batch": GLOBAL_BATCH, "steps": STEPS, "seq": SEQ,
           "model": {"hidden_size": small.hidden_size, "layers": small.num_hidden_layers,
                     "heads": small.num_attention_heads, "kv_heads": small.num_key_value_heads},
           "tolerance": {"loss_atol": LOSS_ATOL, "grad_norm_rtol": GRAD_NORM_RTOL},
           "rungs": [_finite(dataclasses.asdict(r)) for r in rungs]}
    write_atomic(out / REHEARSE_FILE, json.dumps(doc, indent=2, allow_nan=False), error=RehearsalError)


def _finite(x: Any) -> Any:
    """JSON-safe: a non-finite float (a diverged loss) becomes null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def format_rungs(rungs: list[Rung]) -> str:
    lines = [f"{'rung':<10} {'status':<8} {'seconds':>8} {'compile':>8}  detail"]
    for r in rungs:
        comp = f"{r.compile_s:.1f}" if r.compile_s is not None else "-"
        lines.append(f"{r.name:<10} {r.status.upper():<8} {r.seconds:>8.1f} {comp:>8}  "
                     + (f"[{r.layout}] " if r.layout else "") + r.detail)
        if r.diagnosis:
            d = r.diagnosis
            who = f"rank {d['first_failing_rank']}" if d.get("first_failing_rank") is not None else "no rank named"
            lines.append(f"{'':<10} diagnosis: {who}: {d.get('reason')}")
    return "\n".join(lines)


def plan_text(recipe_path: str, overrides: list[str] | None = None, only: tuple[str, ...] = RUNGS) -> str:
    """What a rehearsal of ``recipe_path`` would run (``port rehearse --dry-run``): the small model and each
    rung's layout or why it is skipped. Writes nothing."""
    rec = load_recipe(recipe_path, list(overrides or []), check_files=False)
    small = scaled_config(_full_config(rec), rec.data.max_seq_length)
    rungs, _ = ladder(rec, only)
    where = "the NPU, the recipe's precision" if _on_npu() and rec.cluster.device == "ascend" else "the CPU, float32"
    lines = [f"small model of the family: hidden {small.hidden_size}, {small.num_hidden_layers} layers, "
             f"{small.num_attention_heads} heads / {small.num_key_value_heads} KV heads, vocab {small.vocab_size}; "
             f"global batch {GLOBAL_BATCH}, seq {SEQ}, {STEPS} steps on {where}"]
    for r in rungs:
        what = (f"run: {r.layout}" if r.layout else "run: port verify --grads" if r.status != "skip"
                else f"skip: {r.detail}")
        lines.append(f"  {r.name:<10} {what}")
    return "\n".join(lines)
