"""The reference: HF ``transformers`` LlamaForCausalLM trained with PyTorch on given micro-batches.

It does what the port's training step does, in PyTorch: for each optimizer step, every micro-batch's
summed token loss is divided by the step's TOTAL real-token count (all micro-batches, all data-parallel
ranks) before backward, so micro-batches of different lengths weigh by their tokens; then the global
gradient norm (before clipping), clipping, the scheduled learning rate and one AdamW step.
Micro-batches are ``porting.train.data.MicroBatch`` (used through ``input_ids``, ``labels``, ``tokens``
and ``real_tokens``), so this module itself does not depend on the recipe.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from model_zoo.labels import IGNORE_INDEX
from porting.baseline.document import Timing
from porting.baseline.memory import PHASES, PhaseMeter

if TYPE_CHECKING:
    from porting.train.data.examples import MicroBatch


@dataclass(frozen=True)
class OptimConfig:
    """AdamW as torch names it; ``lr_at(step)`` is the port's schedule, step counted from 0."""

    lr_at: Callable[[int], float]
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    no_decay: Callable[[str], bool] = field(default=lambda name: False)  # HF param name -> exempt


@dataclass(frozen=True)
class LoopConfig:
    device: str = "cpu"            # "cpu" | "cuda"
    dtype: str = "float32"         # "float32" | "bfloat16" (params and states) | "bf16-mixed" (fp32 master, autocast)
    timing_warmup_steps: int = 1   # first steps timed apart (allocator warm-up, CUDA kernels selection)
    recompute: bool = False        # HF gradient checkpointing
    threads: int | None = None     # torch CPU threads (None: torch's default)
    breakdown_every: int = 0       # torch.profiler on every N-th step (porting/baseline/profile.py); 0: never


@dataclass
class LoopResult:
    loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)        # loss (target) tokens of the step
    real_tokens: list[int] = field(default_factory=list)   # non-padding positions, as `port train` counts tokens/s
    warmup: list[bool] = field(default_factory=list)       # timed apart: first steps and steps with a new shape
    padded_tokens: list[int] = field(default_factory=list)
    step_time_s: list[float] = field(default_factory=list)
    peak_gib: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    weights_gib: float = 0.0
    probe_logits_initial: np.ndarray | None = None
    probe_logits_final: np.ndarray | None = None
    num_parameters: int = 0
    breakdown: list = field(default_factory=list)   # porting.rundir.breakdown.Breakdown of the sampled steps

    def timing(self) -> Timing:
        """Warm-up steps (first ones, first sight of a shape) kept apart from the steady state."""
        idx = [i for i, w in enumerate(self.warmup) if not w]
        steady = [self.step_time_s[i] for i in idx]
        t = sum(steady)

        def rate(xs: list[int]) -> float | None:
            return sum(xs[i] for i in idx) / t if t > 0 else None

        return Timing(warmup_steps=tuple(i + 1 for i, w in enumerate(self.warmup) if w),
                      warmup_step_time_s=tuple(self.step_time_s[i] for i, w in enumerate(self.warmup) if w),
                      steady_steps=len(idx),
                      steady_step_time_s_median=statistics.median(steady) if steady else None,
                      steady_tokens_per_s=rate(self.real_tokens),
                      steady_loss_tokens_per_s=rate(self.tokens),
                      steady_padded_tokens_per_s=rate(self.padded_tokens))


TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "bf16-mixed": "float32"}


def load_model(hf_dir: str, loop: LoopConfig):
    """HF LlamaForCausalLM with the checkpoint's own weights (the port starts from the same file), through
    port's one HF loader; SDPA attention, as a user's CUDA fine-tune runs (porting/verify/pair.py says why
    verification uses eager instead)."""
    from porting.verify.pair import load_reference

    model = load_reference(hf_dir, TORCH_DTYPES[loop.dtype], attention="sdpa")
    if loop.recompute:
        model.gradient_checkpointing_enable()
    return model.to(loop.device)


def _real_tokens(mb) -> int:
    """Non-padding positions: the pipeline's count when it gives one, else positions up to the last label."""
    if hasattr(mb, "real_tokens"):
        return int(mb.real_tokens)
    return int(sum(int(np.nonzero(row != IGNORE_INDEX)[0].max()) + 1 if (row != IGNORE_INDEX).any() else 0
                   for row in mb.labels))


def token_loss_sum(logits, labels):
    """Summed next-token cross-entropy over real tokens (same as model_zoo.loss.shifted_token_loss)."""
    import torch

    lg = logits[:, :-1, :].float()
    tg = labels[:, 1:]
    return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tg.reshape(-1),
                                             ignore_index=IGNORE_INDEX, reduction="sum")


def make_optimizer(model, opt: OptimConfig, loop: LoopConfig):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if opt.no_decay(name) else decay).append(p)
    groups = [{"params": decay, "weight_decay": opt.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=opt.lr_at(0), betas=opt.betas, eps=opt.eps,
                             fused=(loop.device == "cuda") or None)


def probe_logits(model, ids: np.ndarray, loop: LoopConfig) -> np.ndarray:
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad(), _autocast(loop):
        out = model(input_ids=torch.as_tensor(ids, dtype=torch.long, device=loop.device)).logits
    model.train(was_training)
    return out.float().cpu().numpy()


def _autocast(loop: LoopConfig):
    import torch

    return torch.autocast(loop.device, dtype=torch.bfloat16, enabled=loop.dtype == "bf16-mixed")


class _NoPrints:
    """No fingerprints: the loop's calls do nothing."""

    def begin(self, step: int, micro) -> None:
        pass

    def gradients(self) -> None:
        pass

    def end(self) -> None:
        pass


_NO_PRINTS = _NoPrints()


def train(model, steps: Iterable[Sequence[MicroBatch]], opt: OptimConfig, loop: LoopConfig,
          meter: PhaseMeter, probe_ids: np.ndarray | None = None,
          on_step: Callable[[int, LoopResult], None] | None = None, prints=None) -> LoopResult:
    """Run every optimizer step of ``steps``; per-step loss (token mean), grad norm, lr, time, phase peaks.
    ``prints``: the fingerprint recorder (porting/baseline/fingerprint_torch.py), or None."""
    import torch

    if loop.threads:
        torch.set_num_threads(loop.threads)
    res = LoopResult(num_parameters=sum(p.numel() for p in model.parameters()))
    prints = prints if prints is not None else _NO_PRINTS
    if probe_ids is not None:
        res.probe_logits_initial = probe_logits(model, probe_ids, loop)
    model.train()
    optimizer = make_optimizer(model, opt, loop)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    res.weights_gib = meter.current_gib()
    sync = torch.cuda.synchronize if loop.device == "cuda" else (lambda: None)
    shapes_seen: set[tuple[int, ...]] = set()
    from porting.baseline.profile import TorchSampler

    sampler = TorchSampler(loop.breakdown_every, loop.device, loop.timing_warmup_steps,
                           getattr(getattr(model, "model", None), "layers", None))
    for step, micro in enumerate(steps):
        total = sum(mb.tokens for mb in micro)
        if total == 0:
            raise ValueError(f"step {step}: no real target tokens in its {len(micro)} micro-batches")
        peaks = dict.fromkeys(PHASES, 0.0)
        sync()
        profiled = sampler.begin(step)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=loop.device)
        prints.begin(step, micro)
        for mb in micro:
            ids = torch.as_tensor(mb.input_ids, dtype=torch.long, device=loop.device)
            labels = torch.as_tensor(mb.labels, dtype=torch.long, device=loop.device)
            meter.reset()
            with sampler.phase("forward"), _autocast(loop):
                logits = model(input_ids=ids).logits
                part = token_loss_sum(logits, labels)
            peaks["forward"] = max(peaks["forward"], meter.peak_gib())
            meter.reset()
            with sampler.phase("backward"):
                (part / total).backward()
            del logits
            peaks["backward"] = max(peaks["backward"], meter.peak_gib())
            loss_sum += part.detach().double()
        meter.reset()
        lr = opt.lr_at(step)
        for g in optimizer.param_groups:
            g["lr"] = lr
        max_norm = opt.grad_clip if opt.grad_clip else float("inf")
        prints.gradients()
        with sampler.phase("optimizer"):
            gnorm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        prints.end()
        peaks["optimizer"] = meter.peak_gib()
        loss = float(loss_sum.item()) / total
        sync()
        res.step_time_s.append(time.perf_counter() - t0)
        if profiled:   # the profiler's overhead is in this step's time: kept apart from the steady state
            res.breakdown.append(sampler.end(step))
        res.loss.append(loss)
        res.grad_norm.append(float(gnorm))
        res.lr.append(lr)
        res.tokens.append(total)
        res.real_tokens.append(int(sum(_real_tokens(mb) for mb in micro)))
        shapes = {tuple(mb.input_ids.shape) for mb in micro}
        res.warmup.append(step < loop.timing_warmup_steps or not shapes <= shapes_seen or profiled)
        shapes_seen |= shapes
        res.padded_tokens.append(int(sum(mb.input_ids.size for mb in micro)))
        for p in PHASES:
            res.peak_gib[p].append(peaks[p])
        if on_step:
            on_step(step, res)
    if probe_ids is not None:
        res.probe_logits_final = probe_logits(model, probe_ids, loop)
    return res
