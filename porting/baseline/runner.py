"""`port baseline`: the recipe's first N optimizer steps on HF transformers + PyTorch, recorded.

The batches come from ``porting.train.data`` (the pipeline `port train` itself uses), so both
frameworks see the same tokens in the same order with the same padding. A data-parallel recipe
(world size W) is reproduced on one device: step i gathers the micro-batches of all W ranks and
normalises by their total token count, which is exactly what the port's all-reduced step computes.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from model_zoo.errors import ConfigError
from model_zoo.files import sha256_file
from porting.baseline import arrays, document, settings as settings_mod
from porting.baseline.document import Memory, MeasuredBaseline, Probe, Steps
from porting.baseline.memory import PHASES, PhaseMeter, meter_for
from porting.baseline.torch_loop import LoopConfig, LoopResult, OptimConfig
from porting.env import cpu_model, require_torch, versions

if TYPE_CHECKING:
    from porting.train.data.batching import BatchSchedule, Step
    from porting.train.data.examples import TokenizedData
    from porting.train.recipe.schema import Recipe

DEVICES = ("cpu", "cuda")
# port precision name -> torch loop dtype
LOOP_DTYPES = {"float32": "float32", "bf16-mixed": "bf16-mixed", "bfloat16": "bfloat16"}
# Bytes of one probe position in the file: float32 logits, initial and final, base64 (4/3), per vocab entry.
PROBE_BYTES_PER_LOGIT = 2 * 4 * 4 / 3


@dataclass(frozen=True)
class BaselineRequest:
    """One `port baseline` invocation, as its options give it."""

    recipe_path: str
    out: str
    device: str = "cpu"
    hf: str | None = None              # model directory; default: the recipe's model.source
    overrides: tuple[str, ...] = ()    # --set key=value, as `port train` takes them
    steps: int | None = None           # default: the recipe's schedule (all steps)
    probe_tokens: int = 32
    timing_warmup_steps: int = 1
    threads: int | None = None
    command: tuple[str, ...] = ()
    breakdown_every: int = 0           # torch.profiler on every N-th step (porting/baseline/profile.py)
    adapter_out: str | None = None     # LoRA: the trained PEFT adapter written here (porting/baseline/lora.py)


@dataclass(frozen=True)
class BaselineResult:
    """What `port baseline` wrote: the file and its document (docs/baseline.md)."""

    path: Path
    document: MeasuredBaseline

    @property
    def losses(self) -> tuple[float | None, ...]:
        return self.document.steps.loss

    @property
    def steady_tokens_per_s(self) -> float | None:
        return self.document.timing.steady_tokens_per_s

    @property
    def peak_gib(self) -> dict[str, float | None]:
        return self.document.memory.peak_gib or {}

    @property
    def memory_kind(self) -> str | None:
        return self.document.memory.kind


def file_digest(path: Path) -> tuple[str, str]:
    """(sha256, how it is known) of a weight file: the digest the HF download recorded where there is one
    (as `port convert` takes it), else the file read whole."""
    from converters.sources import known_sha256

    return known_sha256(path) or (sha256_file(path), "computed")


def weights_fingerprint(hf_dir: Path) -> dict[str, Any]:
    """sha256 of every weight file, and one sha256 over their names, sizes and digests."""
    files = sorted(p for p in hf_dir.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    rows = []
    for p in files:
        digest, how = file_digest(p)
        rows.append({"name": p.name, "bytes": p.stat().st_size, "sha256": digest, "sha256_from": how})
    combined = hashlib.sha256("".join(f"{r['name']}:{r['bytes']}:{r['sha256']};" for r in rows).encode())
    return {"sha256": combined.hexdigest(), "method": "sha256 of every file; combined over name:bytes:sha256;",
            "files": rows, "bytes": sum(r["bytes"] for r in rows)}


def device_info(device: str, threads: int | None) -> dict[str, Any]:
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": props.name, "total_memory_gib": props.total_memory / 2**30,
                "count": torch.cuda.device_count(), "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(), "host_cpu": cpu_model()}
    return {"kind": "cpu", "name": cpu_model(), "cpu_count": os.cpu_count(),
            "torch_threads": threads or torch.get_num_threads()}


def check_device(device: str) -> None:
    import torch

    if device not in DEVICES:
        raise ConfigError(f"--device {device}: expected one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: torch {torch.__version__} sees no CUDA device; run on a CUDA "
                          "machine with a CUDA build of torch, or use --device cpu")


def probe_ids(first_step: Step, data: TokenizedData) -> np.ndarray:
    """The probe batch: the real tokens of the first row of the run's first micro-batch (at most N)."""
    mb = first_step.micro_batches[0]
    length = data.examples[mb.example_ids[0]].length
    return np.asarray(mb.input_ids[:1, :length], dtype=np.int64)


def gathered_steps(plan: BatchSchedule, n_steps: int) -> Iterator[list]:
    """Step i: the micro-batches of every rank (rank-major), as the all-reduced port step sees them."""
    cache: dict = {}
    for i in range(n_steps):
        yield [mb for r in range(plan.world_size) for mb in plan.step(i, r, cache).micro_batches]


def optim_config(recipe: Recipe, total_steps: int) -> OptimConfig:
    from porting.baseline import schedules

    o = recipe.optimizer
    return OptimConfig(lr_at=schedules.lr_schedule(recipe, total_steps), betas=tuple(o.betas), eps=o.eps,
                       weight_decay=o.weight_decay, grad_clip=o.grad_clip, no_decay=schedules.no_decay_rule(recipe))


def _finite(xs: list[float]) -> tuple[float | None, ...]:
    return tuple(x if math.isfinite(x) else None for x in xs)


@dataclass(frozen=True)
class BaselineRun:
    """What one baseline run used and measured; its document is written from this."""

    req: BaselineRequest
    recipe: Recipe
    hf_dir: Path
    plan: BatchSchedule
    loop: LoopConfig
    meter: PhaseMeter
    probe: np.ndarray
    result: LoopResult
    started: str
    adapter_sha256: str | None = None   # LoRA: the initial adapter's weights (porting/baseline/lora.py)


def _steps(res: LoopResult) -> Steps:
    return Steps(step=tuple(range(1, len(res.loss) + 1)), loss=_finite(res.loss), grad_norm=_finite(res.grad_norm),
                 lr=tuple(res.lr), tokens=tuple(res.tokens), real_tokens=tuple(res.real_tokens),
                 padded_tokens=tuple(res.padded_tokens), step_time_s=tuple(res.step_time_s), warmup=tuple(res.warmup),
                 peak_memory_gib={p: tuple(res.peak_gib[p]) for p in PHASES})


def baseline_document(run: BaselineRun) -> MeasuredBaseline:
    """The baseline file's content (docs/baseline.md, format ``port-baseline`` v1)."""
    import torch

    from model_zoo.config import LlamaConfig
    from porting.baseline import estimate
    from porting.train.plan.memory import estimate_memory
    from porting.train.recipe.schema import recipe_dict

    req, recipe, hf_dir, plan, loop, res = run.req, run.recipe, run.hf_dir, run.plan, run.loop, run.result
    meter_kind = run.meter.kind
    model = settings_mod.model_info(hf_dir)
    peaks = {p: max(res.peak_gib[p]) for p in PHASES}
    est_check = estimate.check(estimate_memory(LlamaConfig.from_hf(hf_dir), recipe), peaks, recipe.memory.recompute,
                               meter_kind)
    n = len(res.loss)
    ver = versions()
    ver["packages"]["torch"] = torch.__version__
    note = ("torch.cuda.max_memory_allocated, reset before each phase" if meter_kind.startswith("cuda")
            else "host resident set (whole process) high-water mark, reset before each phase")
    return MeasuredBaseline(
        created=run.started, command=tuple(req.command), device=device_info(req.device, req.threads), versions=ver,
        model={"hf_dir": str(hf_dir), **model, "weights": weights_fingerprint(hf_dir)},
        settings=settings_mod.from_recipe(recipe, plan.data.report.sha256, model, n, run.adapter_sha256),
        recipe=recipe_dict(recipe),
        data={**plan.data.report.as_dict(), "batching": plan.describe()}, steps=_steps(res), timing=res.timing(),
        memory=Memory(kind=meter_kind, per_phase=run.meter.per_phase, unit="GiB", weights_gib=res.weights_gib,
                      peak_gib=peaks, estimator_check=est_check, note=note),
        probe=Probe(input_ids=tuple(tuple(r) for r in run.probe.tolist()), after_step=n,
                    source="first row of step 1's first micro-batch",
                    logits_initial=arrays.encode(res.probe_logits_initial),
                    logits_final=arrays.encode(res.probe_logits_final)),
        loop={"dtype": loop.dtype, "timing_warmup_steps": loop.timing_warmup_steps, "recompute": loop.recompute,
              "attention": "sdpa", "optimizer": "torch.optim.AdamW" + (" (fused)" if loop.device == "cuda" else ""),
              "loss": "sum of token cross-entropy / total target tokens of the step (all micro-batches, all ranks)",
              "grad_norm": "global L2 norm before clipping",
              # HF's LlamaForCausalLM applies config.json's attention_dropout in train mode (the settings table's row)
              "attention_dropout": _attention_dropout(hf_dir)},
        breakdown=tuple(b.to_dict() for b in res.breakdown) if res.breakdown else None)


def _attention_dropout(hf_dir: Path) -> float:
    """config.json's attention_dropout, which HF applies in train mode (transformers' LlamaConfig default: 0.0)."""
    from model_zoo.files import read_json

    v = read_json(Path(hf_dir) / "config.json", what="model config").get("attention_dropout", 0.0)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def check_probe_size(probe_tokens: int, vocab_size: int) -> None:
    """Refuse a probe whose logits would make the file larger than `port compare` reads."""
    if probe_tokens < 2:
        raise ConfigError(f"--probe-tokens {probe_tokens}: expected at least 2")
    most = int(document.MAX_BYTES * 0.9 / (vocab_size * PROBE_BYTES_PER_LOGIT))
    if probe_tokens > most:
        raise ConfigError(f"--probe-tokens {probe_tokens}: the probe logits of a {vocab_size:,}-token vocabulary "
                          f"would make the baseline file larger than the {document.MAX_BYTES >> 20} MiB it may have; "
                          f"use at most {most}")


def run(req: BaselineRequest, log: Callable[[str], None] = lambda s: None) -> BaselineResult:
    """Run the baseline and write ``req.out`` atomically."""
    from model_zoo.config import LlamaConfig
    from porting.model_paths import resolve_hf
    from porting.train.data.batching import build_plan
    from porting.train.recipe.schema import load_recipe
    from porting.tokenizer import load_tokenizer

    out = Path(req.out)
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: folder {out.parent} does not exist; create it first")
    recipe = load_recipe(req.recipe_path, list(req.overrides))
    from porting.train.run.faults import FaultHookError, active

    plant = active().plant   # a test hook that does not parse is one line before anything runs
    if plant is not None and plant[2] == "collective":
        raise FaultHookError("PORT_TEST_PLANT_DIVERGENCE: phase collective is not observable in a torch baseline "
                             "(one process, no all-reduce); plant it in a data-parallel port train")
    require_torch("port baseline")
    check_device(req.device)
    prec = settings_mod.precision(recipe)
    if prec not in LOOP_DTYPES:
        raise ConfigError(f"{req.recipe_path}: precision {prec} is not supported by `port baseline` (supported: "
                          f"{', '.join(LOOP_DTYPES)}); set precision.param_dtype/compute_dtype to one of them")
    hf_dir = resolve_hf(req.hf or recipe.model.source)
    check_probe_size(req.probe_tokens, LlamaConfig.from_hf(hf_dir).vocab_size)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if recipe.batching.packing:   # the torch loop has no per-example positions or attention masks
        raise ConfigError(f"{req.recipe_path}: batching.packing is not supported by `port baseline`; compare "
                          "against a baseline with bucketing (--set batching.packing=false)")
    tokenizer = load_tokenizer(hf_dir)
    plan = build_plan(recipe, tokenizer)
    n = req.steps or plan.total_steps
    if n > plan.total_steps:
        raise ConfigError(f"--steps {n}: the recipe's schedule has only {plan.total_steps} optimizer steps; "
                          "raise schedule.max_steps (--set schedule.max_steps=N) or ask for fewer")
    loop = LoopConfig(device=req.device, dtype=LOOP_DTYPES[prec], timing_warmup_steps=req.timing_warmup_steps,
                      recompute=recipe.memory.recompute, threads=req.threads, breakdown_every=req.breakdown_every)
    from porting.baseline import torch_loop

    import torch

    torch.manual_seed(recipe.seed)
    model = torch_loop.load_model(str(hf_dir), loop)
    sha = None
    if recipe.lora is not None:   # PEFT over the HF model, from the run's initial adapter
        from porting.baseline.lora import peft_model

        model, sha = peft_model(model, recipe, hf_dir)
    first = plan.step(0, 0)
    probe = probe_ids(first, plan.data)[:, :req.probe_tokens]
    meter = meter_for(req.device)

    def on_step(i: int, r: LoopResult) -> None:
        peak = "/".join(f"{r.peak_gib[p][-1]:.3f}" for p in PHASES)
        log(f"step {i + 1}/{n} loss {r.loss[-1]:.6f} grad_norm {r.grad_norm[-1]:.4f} lr {r.lr[-1]:.3g} "
            f"{r.step_time_s[-1]:.3f}s peak(fwd/bwd/opt) {peak} GiB")

    prints = _fingerprinter(model, plan, recipe, out, loop.dtype, log)
    try:
        res = torch_loop.train(model, gathered_steps(plan, n), optim_config(recipe, plan.total_steps), loop, meter,
                               probe_ids=probe, on_step=on_step, prints=prints)
    finally:
        if prints is not None:
            prints.close()
    doc = baseline_document(BaselineRun(req, recipe, hf_dir, plan, loop, meter, probe, res, started, sha))
    if req.adapter_out and recipe.lora is not None:
        from porting.baseline.lora import save_adapter

        log(f"trained adapter: {save_adapter(model, Path(req.adapter_out))}")
    document.save(out, doc)   # checks that the reader reads what was built (a failure is a bug, not bad input)
    return BaselineResult(out, doc)


def _fingerprinter(model, plan: BatchSchedule, recipe: Recipe, out: Path, dtype: str, log: Callable[[str], None]):
    """The fingerprint recorder when the recipe's ``logging.fingerprint_every`` or the plant hook asks for one
    (porting/baseline/fingerprint_torch.py), else None."""
    from porting.baseline.fingerprint_torch import TorchFingerprinter
    from porting.train.run.faults import active

    every, plant = recipe.logging.fingerprint_every, active().plant
    if not every and plant is None:
        return None
    return TorchFingerprinter(model, plan.data.examples, every, plant, out, dtype, log)
