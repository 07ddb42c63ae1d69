"""The curve-level gate of `port compare` against an imported CUDA log (`port baseline import`).

A log holds the loss every ``logging_steps`` (HF Trainer: the mean of the per-step losses since the last
row), so the run's per-step losses are averaged over the same windows before anything is compared
(:func:`align`). The runs must be like for like first: the same global batch (sequences per optimizer
step) and the same learning-rate schedule, else the comparison is refused with the reason (a curve at
another batch or schedule is expected to differ; no tolerance can tell a bug from that).

The gate follows the three loss-misalignment cases of the Ascend accuracy guide, "首Step Loss差异 /
长稳Loss差异 / 尖刺" (MindSpeed-LLM docs/zh/pytorch/develop/precision_issue.md, "问题场景": the first
steps' mean error over a threshold, the long-run mean error growing over a threshold, and loss or grad
norm spikes more frequent than the baseline's), checked with msprobe's loss comparison in mind
(MindStudio accuracy tools, https://gitee.com/ascend/mstt/tree/master/debug/accuracy_tools/msprobe):

* first steps: mean relative loss error over the first ``first_steps`` steps <= ``rtol``;
* the run: the mean relative error of every window of ``window`` logged points <= ``rtol``; a failing
  window is named by its step range;
* spikes: a point is a spike when it exceeds the median of its ``SPIKE_HALF_WIDTH`` neighbours on each
  side by more than ``spike_k`` x the scaled MAD of those neighbours and by more than 5% of the median;
  counted for loss and grad norm on both sides, the run may not have more than the baseline.

Defaults (DEFAULTS): 1% mean relative error, the first 100 steps, windows of 10 logged points, k = 5.
The guide states the criteria, not numbers; 1% is port's choice: two fp32 runs of the same batches
agree to ~1e-5 (docs/baseline.md "Tolerances"), a bf16 NPU run against a bf16 CUDA run stays well
below 1% on smooth curves, and a real defect (a wrong mask, a mis-scaled loss) moves the mean by more.
"""

from __future__ import annotations

import math
import statistics

from model_zoo.errors import ConfigError
from porting.baseline import effective, gates, port_side
from porting.baseline.comparison import (
    CurveComparison,
    FieldVerdict,
    rows as rows_as_written,
    CurvePoint,
    CurveSource,
    GateResult,
    GlobalBatch,
    Spikes,
    TokensSeen,
    Window,
)
from porting.baseline.document import ImportedBaseline, Settings
from porting.verify.check import Check
from porting.verify.stats import FIELD_GATES, IMPORTED_CURVE_GATE, LR_RTOL, CurveGate, FieldGates

SPIKE_HALF_WIDTH = 5
SPIKE_MIN_REL = 0.05
MAD_SCALE = 1.4826          # MAD of a normal distribution -> its standard deviation
# The gate's numbers (and LR_RTOL, how closely logged learning rates must agree) live with every other
# tolerance of port, in porting/verify/stats.py; Gate and DEFAULTS are their names here.
Gate = CurveGate
DEFAULTS = IMPORTED_CURVE_GATE


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _rel(b: float | None, r: float) -> float:
    if b is None or r is None or not math.isfinite(r) or not math.isfinite(b) or b == 0:
        return math.inf
    return abs(r - b) / abs(b)


def align(base: ImportedBaseline, run_steps: list) -> tuple[list[CurvePoint], list[str]]:
    """Baseline logged points with the run's values over the same steps (mean loss over each logging window)."""
    by_step = {r.step: r for r in run_steps}
    st = base.steps
    interval = base.imported.logging_interval or 1
    points, notes, prev = [], [], None
    for i, s in enumerate(st.step):
        lo = (prev + 1) if prev is not None else max(1, s - interval + 1)
        prev = s
        window = [by_step.get(k) for k in range(lo, s + 1)]
        if any(w is None for w in window):
            continue
        losses = [w.loss for w in window]
        r_loss = _mean(losses) if all(v is not None and math.isfinite(v) for v in losses) else math.nan
        points.append(CurvePoint(steps=(lo, s), step=s, baseline=st.loss[i], run=r_loss,
                                 grad_norm_baseline=st.grad_norm[i], grad_norm_run=window[-1].grad_norm,
                                 lr_baseline=st.lr[i], lr_run=window[-1].lr,
                                 lr_run_next=by_step[s + 1].lr if s + 1 in by_step else None,
                                 rel_diff=_rel(st.loss[i], r_loss)))
    missing = len(st.step) - len(points)
    if missing:
        notes.append(f"{missing} baseline point(s) past the run's last step or with steps the run did not log")
    return points, notes


def like_for_like(base: ImportedBaseline, run_settings: Settings, points: list[CurvePoint]) -> list[str]:
    """Why the two runs are not comparable (global batch, schedule); empty when they are."""
    out = []
    gb = base.settings.global_batch
    if gb is None:
        out.append("the imported baseline does not state its global batch; re-import with --global-batch N "
                   "(micro-batch x gradient accumulation x data-parallel ranks of the CUDA run)")
    elif gb != run_settings.global_batch:
        out.append(f"global batch differs: baseline {gb} vs run {run_settings.global_batch} sequences per step "
                   "(set the recipe's batching so micro x accumulation x data parallel matches, `port recipe import` does)")
    for p in points:
        b = p.lr_baseline
        if b is None or p.lr_run is None:
            continue
        # HF Trainer logs the rate after scheduler.step(), i.e. the next step's: either one may match
        cands = [x for x in (p.lr_run, p.lr_run_next) if x is not None]
        if p.lr_run_next is None and not math.isclose(b, p.lr_run, rel_tol=LR_RTOL, abs_tol=1e-12):
            continue   # the run's last step: the rate HF would log after it is not in the run's log
        if not any(math.isclose(b, x, rel_tol=LR_RTOL, abs_tol=1e-12) for x in cands):
            out.append(f"learning-rate schedule differs at step {p.step}: baseline {b:.6g} vs run "
                       f"{' / '.join(f'{x:.6g}' for x in cands)} (check optimizer.lr, schedule.warmup_steps, "
                       "schedule.decay and the total steps)")
            break
    return out


def spikes(xs: list[float | None], k: float) -> list[int]:
    """Indices of upward spikes: above the neighbours' median by > k scaled MADs and > SPIKE_MIN_REL of it."""
    out = []
    for i, x in enumerate(xs):
        if x is None or not math.isfinite(x):
            continue
        nb = [v for j in range(max(0, i - SPIKE_HALF_WIDTH), min(len(xs), i + SPIKE_HALF_WIDTH + 1))
              if j != i and (v := xs[j]) is not None and math.isfinite(v)]
        if len(nb) < 4:
            continue
        med = statistics.median(nb)
        mad = MAD_SCALE * statistics.median(abs(v - med) for v in nb)
        if x - med > k * mad and x - med > SPIKE_MIN_REL * abs(med):
            out.append(i)
    return out


def _spikes(points: list[CurvePoint], g: Gate, failures: list[str]) -> dict[str, Spikes]:
    """Spikes of the loss and the grad norm on both sides; the run may not have more than the baseline."""
    out = {}
    for series, b, r in (("loss", [p.baseline for p in points], [p.run for p in points]),
                         ("grad_norm", [p.grad_norm_baseline for p in points], [p.grad_norm_run for p in points])):
        if all(v is None for v in b) or all(v is None for v in r):
            out[series] = Spikes(available=False)
            continue
        bi, ri = spikes(b, g.spike_k), spikes(r, g.spike_k)
        out[series] = Spikes(available=True, baseline=len(bi), run=len(ri),
                             baseline_steps=tuple(points[i].step for i in bi),
                             run_steps=tuple(points[i].step for i in ri), ok=len(ri) <= len(bi))
        if len(ri) > len(bi):
            extra = [points[i].step for i in ri if i not in bi]
            failures.append(f"{series} spikes: run {len(ri)} vs baseline {len(bi)} (beyond {g.spike_k:g} x MAD), "
                            f"extra at steps {', '.join(map(str, extra[:8]))}")
    return out


def gate(points: list[CurvePoint], g: Gate = DEFAULTS) -> GateResult:
    """The three checks on aligned points; each failure names its steps."""
    failures: list[str] = []
    first = [p for p in points if p.step <= g.first_steps]
    first_mean = _mean([p.rel_diff for p in first]) if first else None
    if first_mean is not None and not first_mean <= g.rtol:
        failures.append(f"first steps: mean relative loss error {first_mean:.2%} > {g.rtol:.2%} over steps "
                        f"{first[0].steps[0]}-{first[-1].step}")
    windows = []
    for i in range(0, len(points), g.window):
        w = points[i:i + g.window]
        m = _mean([p.rel_diff for p in w])
        windows.append(Window(steps=(w[0].steps[0], w[-1].step), mean_rel_diff=m, ok=m <= g.rtol))
    bad = [w for w in windows if not w.ok]
    if bad:
        failures.append(f"loss mean relative error over {g.rtol:.2%} in {len(bad)} window(s): "
                        + ", ".join(f"steps {w.steps[0]}-{w.steps[1]} ({w.mean_rel_diff:.2%})" for w in bad[:5]))
    spk = _spikes(points, g, failures)
    finite = [p.rel_diff for p in points if math.isfinite(p.rel_diff)]
    return GateResult(gate=g, points=len(points), first_steps_mean_rel_diff=first_mean,
                      run_mean_rel_diff=_mean(finite) if finite else None, max_rel_diff=max(finite, default=None),
                      windows=tuple(windows), spikes=spk, failures=tuple(failures), ok=bool(points) and not failures)


def compare_imported(base: ImportedBaseline, base_path: str | None, run, run_settings: Settings, g: Gate = DEFAULTS,
                     allow_settings_mismatch: bool = False, *, spec: FieldGates = FIELD_GATES,
                     cuda_side: effective.Side | None = None, baseline_devices: int | None = None) -> CurveComparison:
    """`port compare` of a run against an imported baseline: like-for-like first, then the curve gate, the field's
    gates on the same aligned points (``spec``) and the settings table (the CUDA side: ``cuda_side``, else what
    intake stored in the baseline)."""
    points, notes = align(base, run.steps)
    if not points:
        raise ConfigError(f"{run.path}: no baseline step falls inside the run's logged steps (baseline logs steps "
                          f"{base.steps.step[0]}..{base.steps.step[-1]}); run at least as many steps")
    unlike = like_for_like(base, run_settings, points)
    if unlike and not allow_settings_mismatch:
        raise ConfigError(f"{run.path}: not comparable with the imported baseline: {'; '.join(unlike)}; or pass "
                          "--allow-settings-mismatch to compare anyway")
    res = gate(points, g)
    field = imported_verdict(base, run, points, spec, baseline_devices)
    failures = tuple(f"not like for like: {u}" for u in unlike) + res.failures + tuple(gates.failures(field))
    imp = base.imported
    lacking = ("probe logits", "memory") + (() if base.timing.steady_tokens_per_s else ("throughput",))
    return CurveComparison(
        baseline=base_path, run=str(run.path),
        imported=CurveSource(from_=imp.from_, format_name=imp.format_name, contains=imp.contains, lacks=imp.lacks,
                             logging_interval=imp.logging_interval, loss_is=imp.loss_is),
        global_batch=GlobalBatch(base.settings.global_batch, run_settings.global_batch),
        tokens=_tokens(points, base, run), curve=res, per_point=tuple(points), notes=tuple(notes),
        not_available=tuple(f"{x}: not in the imported log" for x in lacking),
        checks=_checks(unlike, res, g), failures=failures, ok=not failures and res.ok and field.ok, field=field,
        settings_table=effective.table(cuda_side if cuda_side is not None else _stored_side(base),
                                       port_side.run_side(run)))


def _stored_side(base: ImportedBaseline) -> dict[str, effective.Fact]:
    """The CUDA side intake stored in the baseline (``imported.effective_settings``); none for a bare log."""
    doc = base.imported.effective_settings   # checked when the document was read (document._value_problems)
    return effective.side_from_dict(doc, "imported.effective_settings") if doc is not None else {}


def imported_verdict(base: ImportedBaseline, run, points: list[CurvePoint], spec: FieldGates,
                     devices: int | None) -> FieldVerdict:
    """The field's gates on the aligned points; the CUDA job's tokens/s as its log states it (all devices)."""
    t = gates.Throughput(base.timing.steady_tokens_per_s, devices or base.settings.world_size, base.device_name,
                         gates.run_tokens_per_s(run), gates.run_devices(run), gates.run_device(run),
                         "the CUDA log counts input tokens (padding included unless include_num_input_tokens_seen: "
                         "non_padding), port counts non-padding tokens")
    return gates.verdict(((p.step, p.baseline, p.run) for p in points), spec, t,
                         eval_base=gates.eval_series(base.evaluation), eval_run=gates.run_eval(run))


def _checks(unlike: list[str], res: GateResult, g: CurveGate) -> tuple[Check, ...]:
    """The gate's verdict as rows: like for like, the first steps, the windows, the spikes of each series."""
    first = res.first_steps_mean_rel_diff
    bad = [w for w in res.windows if not w.ok]
    rows = [Check.claim("like for like", not unlike, "; ".join(unlike) or "same global batch and schedule")]
    if first is not None:
        rows.append(Check.within(f"first {g.first_steps} steps", "mean_rel", first, g.rtol, "mean relative loss error"))
    rows.append(Check("loss windows", "windows_failing", len(bad), 0, bool(res.points) and not bad,
                      f"{len(res.windows)} window(s) of {g.window} logged points, mean relative error <= {g.rtol:g}"))
    for name, sp in res.spikes.items():
        if sp.available:
            rows.append(Check(f"{name} spikes", "spikes_run", sp.run, sp.baseline, sp.ok,
                              f"no more than the baseline's {sp.baseline} (beyond {g.spike_k:g} x MAD)"))
    return rows_as_written(rows)


def _tokens(points: list[CurvePoint], base: ImportedBaseline, run) -> TokensSeen | None:
    """Tokens seen by the last aligned step on both sides (HF counts padded input tokens, port real ones)."""
    tok = dict(zip(base.steps.step, base.steps.tokens))
    last = points[-1].step
    b = tok.get(last)
    r = sum(x.tokens or 0 for x in run.steps if x.step <= last) or None
    if b is None:
        return None
    return TokensSeen(step=last, baseline=b, run=r, ratio_run_over_baseline=r / b if r and b else None)
