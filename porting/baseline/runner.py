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
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from model_zoo.errors import ConfigError
from porting.baseline import arrays, schema, settings as settings_mod
from porting.baseline.memory import meter_for
from porting.baseline.torch_loop import PHASES, LoopConfig, LoopResult, OptimConfig

DEVICES = ("cpu", "cuda")
# port precision name -> torch loop dtype
LOOP_DTYPES = {"float32": "float32", "bf16-mixed": "bf16-mixed", "bfloat16": "bfloat16"}
FULL_HASH_LIMIT = 2 * 2**30   # hash weight files completely below this total size


@dataclass(frozen=True)
class BaselineRequest:
    recipe: str
    out: str
    device: str = "cpu"
    hf: str | None = None              # model directory; default: the recipe's model.source
    overrides: tuple[str, ...] = ()    # --set key=value, as `port train` takes them
    steps: int | None = None           # default: the recipe's schedule (all steps)
    probe_tokens: int = 32
    timing_warmup_steps: int = 1
    threads: int | None = None
    command: tuple[str, ...] = ()


def weights_fingerprint(hf_dir: Path) -> dict[str, Any]:
    """sha256 of the weight files (all bytes up to 2 GiB in total; beyond that size + first/last 16 MiB)."""
    files = sorted(p for p in hf_dir.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    total = sum(p.stat().st_size for p in files)
    full = total <= FULL_HASH_LIMIT
    h = hashlib.sha256()
    chunk = 16 * 2**20
    for p in files:
        h.update(f"{p.name}:{p.stat().st_size};".encode())
        with open(p, "rb") as f:
            if full:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            else:
                h.update(f.read(chunk))
                f.seek(max(0, p.stat().st_size - chunk))
                h.update(f.read(chunk))
    return {"sha256": h.hexdigest(), "method": "full" if full else "size+first/last 16MiB per file",
            "files": [p.name for p in files], "bytes": total}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: str, threads: int | None) -> dict[str, Any]:
    import torch

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "name": props.name, "total_memory_gib": props.total_memory / 2**30,
                "count": torch.cuda.device_count(), "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(), "host_cpu": _cpu_name()}
    return {"kind": "cpu", "name": _cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": threads or torch.get_num_threads()}


def require_torch() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"port baseline needs PyTorch and transformers ({e}); install the torch extra: "
                          "pip install 'port[torch]' (or a CUDA build of torch on a GPU machine)") from None


def check_device(device: str) -> None:
    import torch

    if device not in DEVICES:
        raise ConfigError(f"--device {device}: expected one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device cuda: torch {torch.__version__} sees no CUDA device; run on a CUDA "
                          "machine with a CUDA build of torch, or use --device cpu")


def probe_ids(first_step, data) -> np.ndarray:
    """The probe batch: the real tokens of the first row of the run's first micro-batch (at most N)."""
    mb = first_step.micro_batches[0]
    length = data.examples[mb.example_ids[0]].length
    return np.asarray(mb.input_ids[:1, :length], dtype=np.int64)


def gathered_steps(plan, n_steps: int) -> Iterator[list]:
    """Step i: the micro-batches of every rank (rank-major), as the all-reduced port step sees them."""
    cache: dict = {}
    for i in range(n_steps):
        yield [mb for r in range(plan.world_size) for mb in plan.step(i, r, cache).micro_batches]


def optim_config(recipe, total_steps: int) -> OptimConfig:
    from porting.baseline import schedules

    o = recipe.optimizer
    return OptimConfig(lr_at=schedules.lr_schedule(recipe, total_steps), betas=tuple(o.betas), eps=o.eps,
                       weight_decay=o.weight_decay, grad_clip=o.grad_clip, no_decay=schedules.no_decay_rule(recipe))


def _finite(xs: list[float]) -> list[float | None]:
    return [x if math.isfinite(x) else None for x in xs]


def document(req: BaselineRequest, recipe, hf_dir: Path, plan, res: LoopResult, loop: LoopConfig,
             meter_kind: str, per_phase: bool, probe: np.ndarray, dev: dict, started: str) -> dict[str, Any]:
    from porting.env import versions
    from porting.train.recipe import recipe_dict

    import torch

    from model_zoo.config import LlamaConfig
    from porting.baseline import estimate
    from porting.train.plan import estimate_memory

    rd = recipe_dict(recipe)
    model = settings_mod.model_info(hf_dir)
    peaks = {p: max(res.peak_gib[p]) for p in PHASES}
    est_check = estimate.check(estimate_memory(LlamaConfig.from_hf(hf_dir), recipe), peaks, recipe.memory.recompute,
                               meter_kind)
    n = len(res.loss)
    ver = versions()
    ver["packages"]["torch"] = torch.__version__
    return {
        "format": schema.FORMAT, "format_version": schema.FORMAT_VERSION, "created": started,
        "command": list(req.command), "device": dev, "versions": ver,
        "model": {"hf_dir": str(hf_dir), **model, "weights": weights_fingerprint(hf_dir)},
        "settings": settings_mod.from_recipe(rd, plan.data.report.sha256, model, n),
        "recipe": rd,
        "data": {**plan.data.report.as_dict(), "batching": plan.describe()},
        "steps": {
            "step": list(range(1, n + 1)), "loss": _finite(res.loss), "grad_norm": _finite(res.grad_norm),
            "lr": res.lr, "tokens": res.tokens, "real_tokens": res.real_tokens, "padded_tokens": res.padded_tokens,
            "step_time_s": res.step_time_s, "warmup": res.warmup,
            "peak_memory_gib": {p: res.peak_gib[p] for p in PHASES},
        },
        "timing": res.timing(),
        "memory": {"kind": meter_kind, "per_phase": per_phase, "unit": "GiB", "weights_gib": res.weights_gib,
                   "peak_gib": peaks, "estimator_check": est_check,
                   "note": ("torch.cuda.max_memory_allocated, reset before each phase" if meter_kind.startswith("cuda")
                            else "host resident set (whole process) high-water mark, reset before each phase")},
        "probe": {"input_ids": probe.tolist(), "after_step": n, "source": "first row of step 1's first micro-batch",
                  "logits_initial": arrays.encode(res.probe_logits_initial),
                  "logits_final": arrays.encode(res.probe_logits_final)},
        "loop": {"dtype": loop.dtype, "timing_warmup_steps": loop.timing_warmup_steps, "recompute": loop.recompute,
                 "attention": "sdpa", "optimizer": "torch.optim.AdamW" + (" (fused)" if loop.device == "cuda" else ""),
                 "loss": "sum of token cross-entropy / total target tokens of the step (all micro-batches, all ranks)",
                 "grad_norm": "global L2 norm before clipping"},
    }


def run(req: BaselineRequest, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the baseline and write ``req.out`` atomically; returns the document written."""
    from porting.sources import resolve_hf
    from porting.train.data import build_plan
    from porting.train.recipe import load_recipe
    from porting.train.tokenizer import load_model_tokenizer

    out = Path(req.out)
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: folder {out.parent} does not exist; create it first")
    recipe = load_recipe(req.recipe, list(req.overrides))
    require_torch()
    check_device(req.device)
    prec = settings_mod.precision(recipe.model_dump(mode="json"))
    if prec not in LOOP_DTYPES:
        raise ConfigError(f"{req.recipe}: precision {prec} is not supported by `port baseline` (supported: "
                          f"{', '.join(LOOP_DTYPES)}); set precision.param_dtype/compute_dtype to one of them")
    hf_dir = resolve_hf(req.hf or recipe.model.source)
    from model_zoo.config import LlamaConfig

    LlamaConfig.from_hf(hf_dir)  # sizes checked before torch allocates a model from config.json
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    tokenizer = load_model_tokenizer(hf_dir)
    plan = build_plan(recipe, tokenizer)
    n = req.steps or plan.total_steps
    if n > plan.total_steps:
        raise ConfigError(f"--steps {n}: the recipe's schedule has only {plan.total_steps} optimizer steps; "
                          "raise schedule.max_steps (--set schedule.max_steps=N) or ask for fewer")
    if req.probe_tokens < 2:
        raise ConfigError(f"--probe-tokens {req.probe_tokens}: expected at least 2")
    loop = LoopConfig(device=req.device, dtype=LOOP_DTYPES[prec], timing_warmup_steps=req.timing_warmup_steps,
                      recompute=recipe.memory.recompute, threads=req.threads)
    from porting.baseline import torch_loop

    import torch

    torch.manual_seed(recipe.seed)
    model = torch_loop.load_model(str(hf_dir), loop)
    first = plan.step(0, 0)
    probe = probe_ids(first, plan.data)[:, :req.probe_tokens]
    meter = meter_for(req.device)

    def on_step(i: int, r: LoopResult) -> None:
        log(f"step {i + 1}/{n} loss {r.loss[-1]:.6f} grad_norm {r.grad_norm[-1]:.4f} lr {r.lr[-1]:.3g} "
            f"{r.step_time_s[-1]:.3f}s peak(fwd/bwd/opt) " + "/".join(f"{r.peak_gib[p][-1]:.3f}" for p in PHASES) + " GiB")

    res = torch_loop.train(model, gathered_steps(plan, n), optim_config(recipe, plan.total_steps), loop, meter,
                           probe_ids=probe, on_step=on_step)
    doc = document(req, recipe, hf_dir, plan, res, loop, meter.kind, meter.per_phase, probe,
                   device_info(req.device, req.threads), started)
    bad = schema.problems(doc)
    if bad:  # our own output must satisfy the reader; a failure here is a bug, not bad input
        raise RuntimeError(f"baseline document does not validate: {bad}")
    schema.write_json_atomic(out, doc)
    return doc
