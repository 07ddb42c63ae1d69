"""`port compare`: the port's training run against a baseline file.

Order of the verdict: settings that differ first (a comparison across batch, sequence length or data
is not like for like), then the loss curve per step, the probe-batch logits, throughput and memory.
Tolerances depend on the precision both sides trained in (the training-curve tolerances of port's one
table, :data:`porting.verify.stats.TRAINING_CURVE_TOLERANCES`, documented in docs/baseline.md); throughput
and memory are reported as ratios and only fail when a bound is asked for. The result is a
:class:`porting.baseline.comparison.Comparison` (a :class:`~porting.baseline.comparison.CurveComparison` against an
imported log, :mod:`porting.baseline.curve`); its verdict is a list of :class:`porting.verify.check.Check` rows
(``checks``), the row every verification prints. :mod:`porting.baseline.render` prints it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from model_zoo.errors import ConfigError
from porting.baseline import comparison, document, effective, gates, port_side
from porting.baseline.comparison import (
    AnyComparison,
    Comparison,
    LossCheck,
    MemoryCheck,
    ProbeCheck,
    SettingDiff,
    SettingsCheck,
    StepDiff,
    ThroughputCheck,
)
from porting.baseline.document import (
    KEY_SETTINGS,
    OTHER_SETTINGS,
    ImportedBaseline,
    MeasuredBaseline,
    Probe,
    Settings,
    Steps,
)
from porting.baseline.profile import side_by_side
from porting.rundir import RunRecords, StepRecord
from porting.verify.check import Check
from porting.verify.stats import FIELD_GATES, CurveGate, CurveTolerances, FieldGates, compare as difference, \
    curve_tolerances


MODEL_KEYS = ("model_type", "num_parameters", "model_config_sha256")


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return not math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b))
    return a != b


def _plain(v: Any) -> Any:
    """A setting's value as the file has it (a list, not a tuple), for the JSON and the message."""
    return list(v) if isinstance(v, tuple) else v


def settings_diff(base: Settings, run: Settings) -> tuple[SettingDiff, ...]:
    """Settings whose values differ, the key ones (batch, sequence, precision, data, seed) first. Both sides are
    measured settings (settings.from_recipe): every field is compared, null included."""
    return tuple(SettingDiff(key, _plain(getattr(base, key)), _plain(getattr(run, key)), key in KEY_SETTINGS)
                 for key in KEY_SETTINGS + OTHER_SETTINGS if _differs(getattr(base, key), getattr(run, key)))


def model_mismatch(base: Settings, run: Settings) -> list[str]:
    """The architecture facts that differ (a field an imported baseline does not state is not compared)."""
    pairs = ((k, getattr(base, k), getattr(run, k)) for k in MODEL_KEYS)
    return [f"{k} {b!r} vs {r!r}" for k, b, r in pairs if b is not None and r is not None and _differs(b, r)]


def _step_diff(s: int, base: float | None, base_gn: float | None, rec: StepRecord, tol: CurveTolerances) -> StepDiff:
    # a non-finite loss is stored as null in the baseline: it compares as NaN, i.e. fails
    b = float(base) if base is not None else math.nan
    r = float(rec.loss) if rec.loss is not None else math.nan
    d = abs(r - b)
    gn_r = rec.grad_norm
    return StepDiff(step=s, baseline=b, run=r, abs_diff=d, rel_diff=d / abs(b) if b and math.isfinite(b) else None,
                    grad_norm_baseline=base_gn, grad_norm_run=gn_r,
                    grad_norm_rel_diff=(abs(gn_r - base_gn) / abs(base_gn)) if base_gn and gn_r is not None else None,
                    ok=math.isfinite(r) and d <= tol.loss_atol + tol.loss_rtol * abs(b))


def loss_curve(steps: Steps, run: RunRecords, tol: CurveTolerances) -> LossCheck:
    """The run's loss at every step the baseline recorded, within ``loss_atol + loss_rtol x |baseline|``."""
    base = dict(zip(steps.step, steps.loss))
    base_gn = dict(zip(steps.step, steps.grad_norm))
    rows = tuple(_step_diff(r.step, base[r.step], base_gn.get(r.step), r, tol) for r in run.steps if r.step in base)
    fails = tuple(r.step for r in rows if not r.ok)
    finite = [r for r in rows if math.isfinite(r.abs_diff)]
    return LossCheck(steps_compared=len(rows), baseline_steps=len(base),
                     steps_missing_in_run=tuple(sorted(set(base) - {r.step for r in rows})),
                     max_abs_diff=max((r.abs_diff for r in finite), default=None),
                     max_rel_diff=max((r.rel_diff for r in finite if r.rel_diff is not None), default=None),
                     max_grad_norm_rel_diff=max((r.grad_norm_rel_diff for r in rows
                                                 if r.grad_norm_rel_diff is not None), default=None),
                     failing_steps=fails, per_step=rows, ok=bool(rows) and not fails)


def probe(base: Probe, port_logits: np.ndarray | None, reason: str | None, tol: CurveTolerances) -> ProbeCheck:
    head = {"after_step": base.after_step, "tolerance_max_abs": tol.logits_atol}
    if port_logits is None:
        return ProbeCheck(**head, available=False, reason=reason, ok=None)
    ref = base.final_logits()
    if ref.shape != port_logits.shape:
        return ProbeCheck(**head, available=False, ok=False,
                          reason=f"probe logits shape {tuple(port_logits.shape)} vs baseline {tuple(ref.shape)}")
    d = difference(port_logits, ref)
    agree = float((port_logits.argmax(-1) == ref.argmax(-1)).mean())
    return ProbeCheck(**head, available=True, source=reason, max_abs_diff=d.max_abs, mean_abs_diff=d.mean_abs,
                      argmax_agreement=agree, ok=bool(np.isfinite(d.max_abs) and d.max_abs <= tol.logits_atol))


def _ratio(num: float | None, den: float | None) -> float | None:
    return (num / den) if num is not None and den not in (None, 0) else None


# metrics.jsonl memory fields, best first: a device peak, a host peak (VmHWM), host RSS at step end.
RUN_MEMORY_KEYS = (("device_peak_gib", "device"), ("host_rss_peak_gib", "host_rss_hwm"), ("host_rss_gib", "host_rss"))


def run_memory(run: RunRecords) -> tuple[float | None, str | None]:
    """The run's peak memory from its metrics (device peak preferred), and its kind."""
    for key, kind in RUN_MEMORY_KEYS:
        vals = [float(getattr(r, key)) for r in run.steps if getattr(r, key) is not None]
        if vals:
            return max(vals), kind
    return None, None


def throughput_and_memory(base: MeasuredBaseline, run: RunRecords,
                          tol: CurveTolerances) -> tuple[ThroughputCheck, MemoryCheck]:
    b_tps = base.timing.steady_tokens_per_s
    r_tps = gates.run_tokens_per_s(run)
    tps_ratio = _ratio(r_tps, b_tps)
    b_mem = max((x for v in base.steps.peak_memory_gib.values() for x in v
                 if x is not None and math.isfinite(x)), default=None)
    r_mem, r_kind = run_memory(run)
    mem_ratio = _ratio(r_mem, b_mem)
    t_ok = None if tol.min_throughput_ratio is None else (tps_ratio is not None and tps_ratio >= tol.min_throughput_ratio)
    m_ok = None if tol.max_memory_ratio is None else (mem_ratio is not None and mem_ratio <= tol.max_memory_ratio)
    kind = base.memory.kind
    return (ThroughputCheck(baseline_tokens_per_s=b_tps, run_tokens_per_s=r_tps, ratio_run_over_baseline=tps_ratio,
                            baseline_device=base.device_name, min_ratio=tol.min_throughput_ratio, ok=t_ok),
            MemoryCheck(baseline_peak_gib=b_mem, baseline_kind=kind, baseline_peak_by_phase_gib=base.memory.peak_gib,
                        run_peak_gib=r_mem, run_kind=r_kind, ratio_run_over_baseline=mem_ratio,
                        same_kind=_same_memory_kind(kind, r_kind), max_ratio=tol.max_memory_ratio, ok=m_ok))


def _same_memory_kind(base_kind: str | None, run_kind: str | None) -> bool:
    host = {"host_rss_hwm", "host_rss_process_peak", "host_rss"}  # "host_rss": sampled at step end, not a peak
    return (base_kind in host) == (run_kind in host) if base_kind and run_kind else False


def compare(base: MeasuredBaseline, base_path: str | None, run: RunRecords, run_settings: Settings,
            tol: CurveTolerances, run_logits: Callable[[], tuple[np.ndarray | None, str]],
            allow_settings_mismatch: bool = False, spec: FieldGates = FIELD_GATES) -> Comparison:
    """The full comparison; ``run_logits()`` gives the run's probe logits (or None) and where they came from;
    ``spec``: the field's gates (porting/baseline/gates.py), computed on the same steps."""
    diff = settings_diff(base.settings, run_settings)
    key_diff = [d for d in diff if d.key_setting]
    if key_diff and not allow_settings_mismatch:
        listed = ", ".join(f"{d.key} {d.baseline!r} (baseline) vs {d.run!r} (run)" for d in key_diff)
        raise ConfigError(f"{run.path}: settings differ from the baseline: {listed}; re-run one side with the "
                          "other's settings, or pass --allow-settings-mismatch to compare anyway")
    loss = loss_curve(base.steps, run, tol)
    logits, reason = run_logits()
    pr = probe(base.probe, logits, reason, tol)
    tput, mem = throughput_and_memory(base, run, tol)
    failures = []
    if key_diff:
        failures.append("settings differ: " + ", ".join(d.key for d in key_diff))
    if not loss.ok:
        failures.append(f"loss outside tolerance at steps {list(loss.failing_steps[:10])}" if loss.failing_steps
                        else "no common step between baseline and run")
    if pr.ok is False:
        failures.append(f"probe logits: {pr.reason or 'max abs diff %.3g > %.3g' % (pr.max_abs_diff, tol.logits_atol)}")
    for part, check in (("throughput", tput), ("memory", mem)):
        if check.ok is False:
            failures.append(f"{part} ratio {check.ratio_run_over_baseline} outside the bound asked for")
    field = measured_verdict(base, run, loss, tput, spec)
    failures += gates.failures(field)
    seq, batching = run_settings.seq_length or 0, (run.manifest.recipe.get("batching", {}) if run.manifest else {})
    run_tokens = batching.get("micro_batch_size", 0) * batching.get("grad_accum_steps", 0) * seq or None
    breakdown = side_by_side(base.breakdown, run.path, (base.settings.global_batch or 0) * seq or None, run_tokens)
    return Comparison(estimator=estimator_vs_baseline(base, run), baseline=base_path, run=str(run.path),
                      run_notes=tuple(run.notes), dtype=base.settings.dtype, tolerances=tol,
                      settings=SettingsCheck(diff, not key_diff), loss=loss, probe=pr, throughput=tput, memory=mem,
                      checks=_checks(key_diff, loss, pr, tput, mem, tol), failures=tuple(failures), ok=not failures,
                      breakdown=breakdown, field=field,
                      settings_table=effective.table(port_side.baseline_side(base.recipe, base.loop, str(base_path)),
                                                     port_side.run_side(run)))


def measured_verdict(base: MeasuredBaseline, run: RunRecords, loss: LossCheck, tput: ThroughputCheck,
                     spec: FieldGates) -> comparison.FieldVerdict:
    """The field's gates against a `port baseline` run: its per-step losses, its tokens/s on one device (the torch
    loop runs every rank's micro-batches in one process, porting/baseline/runner.py), no evaluation loss."""
    t = gates.Throughput(base.timing.steady_tokens_per_s, 1, base.device_name, tput.run_tokens_per_s,
                         gates.run_devices(run), gates.run_device(run), "both sides count non-padding tokens")
    return gates.verdict(((r.step, r.baseline, r.run) for r in loss.per_step), spec, t,
                         eval_base=gates.eval_series(base.evaluation), eval_run=gates.run_eval(run))


def _checks(key_diff: list[SettingDiff], loss: LossCheck, pr: ProbeCheck, tput: ThroughputCheck, mem: MemoryCheck,
            tol: CurveTolerances) -> tuple[Check, ...]:
    """The verdict as rows: settings, loss per step, and the probe, throughput and memory where they were checked
    (a part with nothing to hold it to, such as throughput without --min-throughput-ratio, has no row)."""
    rows = [Check.claim("settings like for like", not key_diff,
                        "identical key settings" if not key_diff else "differ: " + ", ".join(d.key for d in key_diff)),
            Check("loss per step", "steps_failing", len(loss.failing_steps), 0, loss.ok,
                  f"{loss.steps_compared} step(s) compared, |diff| <= {tol.loss_atol:g} + {tol.loss_rtol:g} x |baseline|"
                  + (f"; first failing {list(loss.failing_steps[:5])}" if loss.failing_steps else ""))]
    if pr.ok is not None:
        rows.append(Check("probe logits", "max_abs", pr.max_abs_diff, tol.logits_atol, pr.ok,
                          f"mean abs {pr.mean_abs_diff:.3e}, argmax agreement {pr.argmax_agreement:.1%}"
                          if pr.available else str(pr.reason)))
    for part, t, limit, bound, word in (("throughput", tput, tput.min_ratio, "run/baseline tokens/s", "at least"),
                                        ("memory", mem, mem.max_ratio, "run/baseline peak", "at most")):
        if t.ok is not None:
            rows.append(Check(part, "ratio", t.ratio_run_over_baseline, limit, t.ok, f"{bound}, {word} {limit:g}"))
    return comparison.rows(rows)


def estimator_vs_baseline(base: MeasuredBaseline, run: RunRecords) -> dict[str, Any] | None:
    """The run's dry-run memory estimate (plan.json) against the baseline's measured phase peaks."""
    from porting.baseline import estimate

    from porting.train.plan.make import TrainPlan

    p = run.path / "plan.json"
    if run.plan is None:
        if p.exists():   # present but unreadable: the reader's note says why
            raise ConfigError(f"{p}: unreadable plan ({'; '.join(n for n in run.notes if n.startswith(p.name))}); "
                              "expected the memory_gib_by_phase that `port train` writes")
        return None
    plan = TrainPlan.from_dict(run.plan, str(p))   # one line naming the key when it is not a plan port wrote
    return estimate.check(plan.memory_gib_by_phase, base.memory.peak_gib, plan.recompute, base.memory.kind or "?")


def run_settings(run: RunRecords) -> Settings:
    """The run's comparable settings, from its manifest (resolved recipe, data hash) and its model."""
    from porting.baseline import settings as settings_mod
    from porting.train.recipe.schema import validate_recipe

    assert run.manifest is not None, "read_run(strict=True) reads the manifest"
    # the resolved recipe `port train` wrote, read by the same strict schema (files are not needed here)
    rec = validate_recipe(run.manifest.recipe, f"{run.path / 'manifest.json'}: recipe", check_files=False)
    data = run.manifest.data
    cfg = run.manifest.model.config
    if isinstance(cfg, dict):
        model = settings_mod.model_info(cfg)
    elif (run.path / "hf" / "config.json").is_file():
        model = settings_mod.model_info(run.path / "hf")
    else:
        raise ConfigError(f"{run.path / 'manifest.json'}: no model.config and no hf/config.json; cannot tell "
                          "which model the run trained")
    init = None
    if rec.lora is not None:   # the run's initial adapter (porting/train/run/lora.py), held equal to the baseline's
        from porting.train.recipe.adapter import INIT_DIR
        from model_zoo.files import sha256_file

        path = run.path / INIT_DIR / "adapter_model.safetensors"
        init = sha256_file(path) if path.is_file() else None
    return settings_mod.from_recipe(rec, data.get("sha256"), model, len(run.steps), init)


def run_compare(baseline_path: str, run_dir: str, *, allow_settings_mismatch: bool = False,
                probe: bool = True, gate: CurveGate | None = None, spec: FieldGates = FIELD_GATES,
                cuda_side: effective.Side | None = None, baseline_devices: int | None = None,
                **tol_override: float | None) -> AnyComparison:
    """`port compare BASELINE RUNDIR`: a measured baseline per step, an imported one by the curve gate; both with the
    field's gates (``spec``) and the settings table (``cuda_side``: a CUDA job's settings read by intake, where the
    imported baseline does not carry them; ``baseline_devices``: the CUDA job's device count where it states none)."""
    from porting.baseline import probe_logits
    from porting.rundir import read_run

    base = document.load(baseline_path)
    run = read_run(run_dir)
    rs = run_settings(run)
    mism = model_mismatch(base.settings, rs)
    if mism:
        raise ConfigError(f"{run_dir}: trains another model than baseline {baseline_path} ({'; '.join(mism)}); "
                          "compare a run of the same model")
    if isinstance(base, ImportedBaseline):   # a CUDA run's own log: the curve gate (porting/baseline/curve.py)
        from porting.baseline import curve

        return curve.compare_imported(base, str(baseline_path), run, rs, gate or curve.DEFAULTS,
                                      allow_settings_mismatch, spec=spec, cuda_side=cuda_side,
                                      baseline_devices=baseline_devices)
    tol = curve_tolerances(base.settings.dtype, **tol_override)
    ids = np.asarray(base.probe.input_ids, dtype=np.int64)
    after = int(base.probe.after_step or base.steps.step[-1])

    def probe_fn() -> tuple[np.ndarray | None, str]:
        if not probe:
            return None, "skipped (--no-probe)"
        return probe_logits.run_probe_logits(run, ids, after)

    return compare(base, str(baseline_path), run, rs, tol, probe_fn, allow_settings_mismatch, spec)
