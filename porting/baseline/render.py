"""`port compare`'s table: a :class:`~porting.baseline.comparison.Comparison` (settings first, then the loss per step,
the probe, throughput, memory, the memory estimate, the result rows, the verdict) or a
:class:`~porting.baseline.comparison.CurveComparison` (the imported log, the curve gate, the rows, the verdict)."""

from __future__ import annotations

from typing import Any

from porting.baseline import effective, gates
from porting.baseline.comparison import AnyComparison, Comparison, CurveComparison
from porting.baseline.memory import PHASES
from porting.baseline.profile import render_side_by_side
from porting.verify.check import table


def _fmt(x: Any, spec: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.3%}"


def render(rep: AnyComparison, max_rows: int = 20) -> str:
    """The human table of either kind: the settings that differ first (before any loss row), the field's gates, then
    the comparison's own body, its result rows and the verdict."""
    body = render_imported(rep) if isinstance(rep, CurveComparison) else render_measured(rep, max_rows)
    left = "CUDA" if isinstance(rep, CurveComparison) else "baseline"
    head = effective.render(rep.settings_table, left=left) + [""] if rep.settings_table else []
    head += gates.render(rep.field) + [""] if rep.field is not None else []
    return "\n".join([*head, body, "", table(list(rep.checks)), "",
                      "RESULT: " + ("PASS" if rep.ok else "FAIL: " + "; ".join(rep.failures))])


def _loss_lines(rep: Comparison, max_rows: int) -> list[str]:
    loss, tol = rep.loss, rep.tolerances
    lines = [f"LOSS per step (tolerance |diff| <= {tol.loss_atol:g} + {tol.loss_rtol:g} x |baseline|)",
             f"  {'step':>5} {'baseline':>12} {'run':>12} {'abs diff':>10} {'rel diff':>10} {'gnorm rel':>10}"]
    rows = loss.per_step
    shown = rows if len(rows) <= max_rows else rows[:max_rows // 2] + rows[-max_rows // 2:]
    for r in shown:
        lines.append(f"  {r.step:>5} {r.baseline:>12.6f} {r.run:>12.6f} {r.abs_diff:>10.2e} "
                     f"{_fmt(r.rel_diff, '.2e'):>10} {_fmt(r.grad_norm_rel_diff, '.2e'):>10}{'' if r.ok else '  FAIL'}")
    if len(rows) > len(shown):
        lines.append(f"  ({len(rows) - len(shown)} middle steps not shown; --json has all)")
    lines.append(f"  steps compared {loss.steps_compared}/{loss.baseline_steps}, max abs {_fmt(loss.max_abs_diff, '.3e')}, "
                 f"max rel {_fmt(loss.max_rel_diff, '.3e')}, grad-norm max rel {_fmt(loss.max_grad_norm_rel_diff, '.3e')}")
    return lines


def _estimate_lines(est: dict[str, Any]) -> list[str]:
    note = "" if est["comparable"] else "  [baseline measured host RSS incl. runtime: indicative only]"
    lines = ["", f"MEMORY ESTIMATE (run's plan.json) vs baseline measured peaks ({est['measured_kind']}){note}"]
    for ph in PHASES:
        lines.append(f"  {ph:<10} estimate {est['estimate_gib'][ph]:>9.3f} GiB  measured {est['measured_gib'][ph]:>9.3f} GiB  "
                     f"ratio {_fmt(est['ratio_estimate_over_measured'][ph], '.2f')}")
    lines.append(f"  {'total':<10} estimate {est['estimate_total_gib']:>9.3f} GiB  measured max {est['measured_max_gib']:>5.3f} GiB  "
                 f"ratio {_fmt(est['ratio_total_over_measured_max'], '.2f')}")
    return lines


def render_measured(rep: Comparison, max_rows: int = 20) -> str:
    """Settings first, then loss per step, probe, throughput, memory and the memory estimate."""
    lines = [f"baseline {rep.baseline}  vs  run {rep.run}  (precision {rep.dtype})", ""]
    differ = rep.settings.differ
    if differ:
        lines.append("SETTINGS THAT DIFFER" + ("" if rep.settings.like_for_like else " (not like for like)"))
        for d in differ:
            lines.append(f"  {'*' if d.key_setting else ' '} {d.key:<20} baseline {_fmt(d.baseline)}  run {_fmt(d.run)}")
    else:
        lines.append("settings: identical")
    lines += ["", *_loss_lines(rep, max_rows)]
    pr = rep.probe
    lines += ["", f"PROBE logits after step {pr.after_step} (tolerance max abs <= {pr.tolerance_max_abs:g})"]
    if pr.available:
        lines.append(f"  max abs {pr.max_abs_diff:.3e}  mean abs {pr.mean_abs_diff:.3e}  argmax agreement "
                     f"{pr.argmax_agreement:.1%}  (port weights: {pr.source})")
    else:
        lines.append(f"  not available: {pr.reason}")
    t, m = rep.throughput, rep.memory
    lines += ["", "THROUGHPUT (steady state, target tokens/s)",
              f"  baseline {_fmt(t.baseline_tokens_per_s, '.1f')} on {t.baseline_device}  run {_fmt(t.run_tokens_per_s, '.1f')}  "
              f"ratio run/baseline {_fmt(t.ratio_run_over_baseline, '.3f')}",
              "MEMORY (peak)",
              f"  baseline {_fmt(m.baseline_peak_gib, '.3f')} GiB ({m.baseline_kind})  run {_fmt(m.run_peak_gib, '.3f')} GiB "
              f"({m.run_kind or 'not logged'})  ratio {_fmt(m.ratio_run_over_baseline, '.3f')}"
              + ("" if m.same_kind else "  [different kinds of memory: not like for like]")]
    if rep.estimator:
        lines += _estimate_lines(rep.estimator)
    lines += render_side_by_side(rep.breakdown)
    for note in rep.run_notes:
        lines += ["", f"NOTE (run directory): {note}"]
    return "\n".join(lines)


def render_imported(rep: CurveComparison) -> str:
    """The imported log, the global batch, tokens seen, and the curve gate's windows and spikes."""
    c, imp, g = rep.curve, rep.imported, rep.curve.gate
    lines = [f"BASELINE imported from {imp.from_} ({imp.format_name}); its loss is {imp.loss_is}",
             f"  has {', '.join(imp.contains or ())}; lacks {', '.join(imp.lacks or ())}",
             f"GLOBAL BATCH baseline {rep.global_batch.baseline}  run {rep.global_batch.run}"]
    if rep.tokens:
        lines.append(f"TOKENS by step {rep.tokens.step}: baseline {rep.tokens.baseline}  run {rep.tokens.run}")
    lines += ["", f"CURVE GATE (mean relative loss error <= {g.rtol:.2%}: first {g.first_steps} steps and every "
                  f"{g.window} logged points; spikes beyond {g.spike_k:g} x MAD no more than the baseline's)",
              f"  {c.points} aligned points; first steps {_pct(c.first_steps_mean_rel_diff)}, whole run "
              f"{_pct(c.run_mean_rel_diff)}, worst point {_pct(c.max_rel_diff)}"]
    for w in c.windows[:12]:
        lines.append(f"  steps {w.steps[0]:>6}-{w.steps[1]:<6} mean rel {w.mean_rel_diff:.3%}" + ("" if w.ok else "  FAIL"))
    if len(c.windows) > 12:
        lines.append(f"  ({len(c.windows) - 12} more windows; --json has all)")
    for name, s in c.spikes.items():
        lines.append(f"  {name} spikes: " + (f"baseline {s.baseline} at {list(s.baseline_steps or ())[:6]}, run {s.run} at "
                                             f"{list(s.run_steps or ())[:6]}" if s.available else "not logged on both sides"))
    lines += [f"  {n}" for n in rep.notes + rep.not_available]
    return "\n".join(lines)
