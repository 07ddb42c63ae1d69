"""The field's gates: the terms a team accepts a migrated fine-tune in (docs/baseline.md "The field's gates").

`port compare` computes them beside port's own per-step and curve checks, on the same compared steps (a measured
baseline: each optimizer step; an imported CUDA log: each logged point against the run's mean over the same steps),
and `port report` shows them first. The numbers and their sources are :class:`porting.verify.stats.FieldGates`.

With ``b_t`` the baseline's loss and ``r_t`` the run's at compared step ``t`` (the steps of the gate's window):

* loss mean relative error (the task pool's "平均误差"): ``MRE = mean_t |r_t - b_t| / |b_t|``;
* loss-weighted per-step relative error (VeOmni#1034's "按 loss 加权的逐步误差"): each step's relative error weighted
  by the baseline's loss, ``LW = sum_t |b_t| * (|r_t - b_t| / |b_t|) / sum_t |b_t| = sum_t |r_t - b_t| / sum_t |b_t|``,
  so the late steps, where the loss is small and a plain relative error is inflated by its denominator, count for
  their share of the loss and no more;
* evaluation loss: ``|e_run - e_base| / |e_base|`` at the last evaluation step both sides logged;
* throughput per device-equivalent: ``(run tokens/s / run devices) / (baseline tokens/s / baseline devices)``, one
  910C die (one device of a run) counting as one A2 card.

A step whose loss is not finite on either side makes the loss gates FAIL (an infinite error), never drops out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from porting.baseline.comparison import FieldVerdict, GateRow
from porting.verify.stats import FieldGates

PASS, FAIL, NA = "PASS", "FAIL", "N/A"
SOURCES = {
    "mean": "community task pool for NPU ports: mean loss error < 5% (verl-project/verl-ascend-recipe #14, #74)",
    "weighted": "loss-weighted per-step relative error < 2% (ByteDance-Seed/VeOmni#1034, Qwen3.5-35B-A3B LoRA, "
                "8 A3 vs 8 H200: 1.063%)",
    "eval": "evaluation within 5% (verl-project/verl-ascend-recipe #74: 下游评测误差5%内), on the held-out loss",
    "throughput": "A2 at least 0.7x an A100 (verl-project/verl-ascend-recipe #74); one 910C die = one A2 card "
                  "(Huawei ModelArts sizing guide, modelarts_llm_train_590604)",
}


@dataclass(frozen=True)
class Throughput:
    """Tokens/s of both sides, all devices together, and each side's device count (None where unknown)."""

    baseline_tokens_per_s: float | None
    baseline_devices: int | None
    baseline_device: str | None
    run_tokens_per_s: float | None
    run_devices: int | None
    run_device: str | None
    note: str = ""            # how the two counts differ (HF counts padded input tokens, port real ones)


def run_devices(run: Any) -> int | None:
    """The devices the run trained on (manifest.json world_size): each a 910C die, one A2-card equivalent."""
    m = run.manifest
    return (m.world_size or None) if m is not None else None


def run_device(run: Any) -> str:
    dev = ((run.manifest.recipe.get("cluster") or {}).get("device") if run.manifest else None) or "?"
    return {"ascend": "Ascend device (a 910C die = one A2 card)", "cpu": "CPU process"}.get(dev, dev)


def run_tokens_per_s(run: Any) -> float | None:
    """The run's steady non-padding tokens/s, all devices (the summary's, else its steady steps' own)."""
    if run.summary is not None and run.summary.steady_tokens_per_s is not None:
        return run.summary.steady_tokens_per_s
    steady = [r for r in run.steps if not r.compile and r.tokens and r.step_time_s]
    return sum(r.tokens for r in steady) / sum(r.step_time_s for r in steady) if steady else None


def run_eval(run: Any) -> list[tuple[int, float]]:
    """The run's held-out losses (metrics.jsonl eval_loss, data.eval_split > 0) by step."""
    return [(r.step, float(r.eval_loss)) for r in run.steps if r.eval_loss is not None and math.isfinite(r.eval_loss)]


def eval_series(ev: Any) -> list[tuple[int, float]]:
    """A baseline's evaluation record (document.Evaluation) as (step, loss) pairs, the non-finite ones left out."""
    if ev is None:
        return []
    return [(int(s), float(v)) for s, v in zip(ev.step, ev.loss) if v is not None and math.isfinite(v)]


def _window(pairs: list[tuple[int, float, float]], steps: tuple[int, ...] | None) -> list[tuple[int, float, float]]:
    if steps is None:
        return pairs
    lo, hi = steps[0], steps[-1]
    return [p for p in pairs if lo <= p[0] <= hi]


def _span(pairs: list[tuple[int, float, float]]) -> str:
    return f"steps {pairs[0][0]}-{pairs[-1][0]}, {len(pairs)} compared" if pairs else "no compared step"


def _rel(b: float, r: float) -> float:
    if not (math.isfinite(b) and math.isfinite(r)) or b == 0:
        return math.inf
    return abs(r - b) / abs(b)


def mean_relative_error(pairs: list[tuple[int, float, float]]) -> float:
    """``mean_t |r_t - b_t| / |b_t|`` over (step, baseline, run) pairs."""
    return sum(_rel(b, r) for _, b, r in pairs) / len(pairs)


def loss_weighted_error(pairs: list[tuple[int, float, float]]) -> float:
    """``sum_t |r_t - b_t| / sum_t |b_t|``: each step's relative error weighted by the baseline's loss."""
    if any(not (math.isfinite(b) and math.isfinite(r)) for _, b, r in pairs):
        return math.inf
    den = sum(abs(b) for _, b, _ in pairs)
    return sum(abs(r - b) for _, b, r in pairs) / den if den else math.inf


def _status(value: float | None, threshold: float, at_most: bool) -> str:
    if value is None:
        return NA
    ok = math.isfinite(value) and (value <= threshold if at_most else value >= threshold)
    return PASS if ok else FAIL


def _loss_row(name: str, key: str, pairs: list[tuple[int, float, float]], threshold: float,
              steps: tuple[int, ...] | None) -> GateRow:
    chosen = _window(pairs, steps)
    if not chosen:
        where = f"the window {steps[0]}-{steps[-1]}" if steps else "the comparison"
        return GateRow(name, None, threshold, "<=", NA, f"no compared step in {where}", SOURCES[key])
    value = mean_relative_error(chosen) if key == "mean" else loss_weighted_error(chosen)
    b = sum(p[1] for p in chosen) / len(chosen)
    r = sum(p[2] for p in chosen) / len(chosen)
    figures = f"{_span(chosen)}; mean loss baseline {b:.5g}, run {r:.5g}"
    return GateRow(name, value if math.isfinite(value) else None, threshold, "<=",
                   _status(value, threshold, True), figures if math.isfinite(value) else figures + "; a loss is not finite",
                   SOURCES[key])


def eval_row(base: list[tuple[int, float]], run: list[tuple[int, float]], threshold: float) -> GateRow:
    """The evaluation-loss gate at the last step both sides evaluated; N/A where either side has none."""
    name = "evaluation loss relative error"
    if not base or not run:
        missing = " and ".join(s for s, xs in (("the baseline", base), ("the run", run)) if not xs)
        return GateRow(name, None, threshold, "<=", NA, f"{missing} logged no evaluation loss (the run: "
                       "data.eval_split > 0)", SOURCES["eval"])
    rb = dict(run)
    common = [(s, b, rb[s]) for s, b in base if s in rb]
    if not common:
        return GateRow(name, None, threshold, "<=", NA, f"no common evaluation step (baseline {[s for s, _ in base][:4]}"
                       f", run {[s for s, _ in run][:4]})", SOURCES["eval"])
    s, b, r = common[-1]
    v = _rel(b, r)
    return GateRow(name, v if math.isfinite(v) else None, threshold, "<=", _status(v, threshold, True),
                   f"step {s}: baseline {b:.5g}, run {r:.5g}; {len(common)} common evaluation step(s)", SOURCES["eval"])


def throughput_row(t: Throughput, threshold: float, judge: bool = True) -> GateRow:
    """Run over baseline tokens/s per device-equivalent; N/A where a side's tokens/s or device count is unknown, or
    (``judge`` False) where the run is not on the target: a CPU run's ratio is shown, not judged."""
    name = "throughput per device-equivalent"
    parts = {"baseline tokens/s": t.baseline_tokens_per_s, "baseline device count": t.baseline_devices,
             "run tokens/s": t.run_tokens_per_s, "run device count": t.run_devices}
    unknown = [k for k, v in parts.items() if not v]
    if unknown:
        return GateRow(name, None, threshold, ">=", NA, f"not known: {', '.join(unknown)}" +
                       (f" ({t.note})" if t.note else ""), SOURCES["throughput"])
    b = t.baseline_tokens_per_s / t.baseline_devices
    r = t.run_tokens_per_s / t.run_devices
    ratio = r / b
    figures = (f"run {r:.4g} tokens/s per device ({t.run_tokens_per_s:.4g} on {t.run_devices} x {t.run_device}), "
               f"baseline {b:.4g} ({t.baseline_tokens_per_s:.4g} on {t.baseline_devices} x {t.baseline_device})")
    if t.baseline_device and "a100" not in t.baseline_device.lower():
        figures += f"; the 0.7x gate is set against an A100, this baseline ran on {t.baseline_device}"
    if not judge:
        figures = ("not judged: a CPU run is not the target, the gate holds an NPU against a GPU (pass "
                   "--throughput-min to judge it); " + figures)
    return GateRow(name, ratio, threshold, ">=", _status(ratio, threshold, False) if judge else NA,
                   figures + (f"; {t.note}" if t.note else ""), SOURCES["throughput"])


def verdict(pairs: Iterable[tuple[int, float | None, float | None]], spec: FieldGates, throughput: Throughput,
            eval_base: list[tuple[int, float]] | None = None,
            eval_run: list[tuple[int, float]] | None = None) -> FieldVerdict:
    """The field's four gates on the compared (step, baseline loss, run loss) pairs (a null loss: NaN)."""
    clean = [(int(s), math.nan if b is None else float(b), math.nan if r is None else float(r)) for s, b, r in pairs]
    rows = (_loss_row("loss mean relative error", "mean", clean, spec.mean_rel_max, spec.mean_rel_steps),
            _loss_row("loss-weighted per-step relative error", "weighted", clean, spec.weighted_max,
                      spec.weighted_steps),
            eval_row(eval_base or [], eval_run or [], spec.eval_max),
            throughput_row(throughput, spec.throughput_min,
                           judge=spec.judge_cpu_throughput or not (throughput.run_device or "").startswith("CPU")))
    measured = any(r.status != NA for r in rows[:2])
    return FieldVerdict(gates=spec, rows=rows, ok=measured and all(r.status != FAIL for r in rows))


def failures(v: FieldVerdict) -> list[str]:
    """The failed gates in words, for a comparison's ``failures``."""
    out = [f"{r.name} {_fmt(r.value)} {'>' if r.bound == '<=' else '<'} {_fmt(r.threshold)} ({r.figures})"
           for r in v.rows if r.status == FAIL]
    if not any(r.status != NA for r in v.rows[:2]):
        out.append("the field's loss gates measured nothing: " + v.rows[0].figures)
    return out


def _fmt(x: float | None) -> str:
    return "not finite" if x is None else f"{x:.3%}" if x < 10 else f"{x:.3g}"


def render(v: FieldVerdict) -> list[str]:
    """The verdict as text lines: one per gate, PASS/FAIL/N/A first, then value, bound and figures."""
    lines = ["THE FIELD'S GATES" + ("" if v.ok else " (FAIL)")]
    for r in v.rows:
        val = "-" if r.value is None else (f"{r.value:.3f}x" if r.bound == ">=" else f"{r.value:.3%}")
        bound = f"{r.threshold:g}x" if r.bound == ">=" else f"{r.threshold:.0%}" if r.threshold >= 0.01 else f"{r.threshold:g}"
        lines.append(f"  {r.status:<4}  {r.name:<40} {val:>9} {r.bound} {bound:<6} {r.figures}")
    return lines
