"""`port compare`: the port's training run against a baseline file.

Order of the verdict: settings that differ first (a comparison across batch, sequence length or data
is not like for like), then the loss curve per step, the probe-batch logits, throughput and memory.
Tolerances depend on the precision both sides trained in (the training-curve tolerances of port's one
table, :data:`porting.verify.stats.TRAINING_CURVE_TOLERANCES`, documented in docs/baseline.md); throughput
and memory are reported as ratios and only fail when a bound is asked for. The verdict is a list of
:class:`porting.verify.check.Check` rows (``checks``), the row every verification prints.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Callable

import numpy as np

from model_zoo.errors import ConfigError
from porting.baseline import arrays, schema
from porting.rundir import RunRecords
from porting.verify.check import Check, table
from porting.verify.stats import CurveTolerances, compare as difference, curve_tolerances


MODEL_KEYS = ("model_type", "num_parameters", "model_config_sha256")


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return not math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b))
    return a != b


def settings_diff(base: dict[str, Any], run: dict[str, Any]) -> list[dict[str, Any]]:
    """Settings whose values differ, the key ones (batch, sequence, precision, data, seed) first."""
    out = []
    for key in schema.KEY_SETTINGS + schema.OTHER_SETTINGS:
        if key in base and key in run and _differs(base[key], run[key]):
            out.append({"key": key, "baseline": base[key], "run": run[key], "key_setting": key in schema.KEY_SETTINGS})
    return out


def model_mismatch(base: dict[str, Any], run: dict[str, Any]) -> list[str]:
    return [f"{k} {base[k]!r} vs {run[k]!r}" for k in MODEL_KEYS
            if k in base and k in run and _differs(base[k], run[k])]


def loss_curve(base_doc: dict, run: RunRecords, tol: CurveTolerances) -> dict[str, Any]:
    base = dict(zip(base_doc["steps"]["step"], base_doc["steps"]["loss"]))
    base_gn = dict(zip(base_doc["steps"]["step"], base_doc["steps"]["grad_norm"]))
    rows, fails = [], []
    for rec in run.steps:
        s = rec.step
        if s not in base:
            continue
        # a non-finite loss is stored as null in the baseline: it compares as NaN, i.e. fails
        b = float(base[s]) if base[s] is not None else math.nan
        r = float(rec.loss) if rec.loss is not None else math.nan
        d = abs(r - b)
        ok = math.isfinite(r) and d <= tol.loss_atol + tol.loss_rtol * abs(b)
        gn_b, gn_r = base_gn.get(s), rec.grad_norm
        rows.append({"step": s, "baseline": b, "run": r, "abs_diff": d, "rel_diff": d / abs(b) if b and math.isfinite(b) else None,
                     "grad_norm_baseline": gn_b, "grad_norm_run": gn_r,
                     "grad_norm_rel_diff": (abs(gn_r - gn_b) / abs(gn_b)) if gn_b and gn_r is not None else None,
                     "ok": ok})
        if not ok:
            fails.append(s)
    missing = sorted(set(base) - {r["step"] for r in rows})
    finite = [r for r in rows if math.isfinite(r["abs_diff"])]
    return {"steps_compared": len(rows), "baseline_steps": len(base), "steps_missing_in_run": missing,
            "max_abs_diff": max((r["abs_diff"] for r in finite), default=None),
            "max_rel_diff": max((r["rel_diff"] for r in finite if r["rel_diff"] is not None), default=None),
            "max_grad_norm_rel_diff": max((r["grad_norm_rel_diff"] for r in rows
                                           if r["grad_norm_rel_diff"] is not None), default=None),
            "failing_steps": fails, "per_step": rows,
            "ok": bool(rows) and not fails}


def probe(base_doc: dict, port_logits: np.ndarray | None, reason: str | None, tol: CurveTolerances) -> dict[str, Any]:
    out: dict[str, Any] = {"after_step": base_doc["probe"].get("after_step"), "tolerance_max_abs": tol.logits_atol}
    if port_logits is None:
        return {**out, "available": False, "reason": reason, "ok": None}
    ref = arrays.decode(base_doc["probe"]["logits_final"], "probe.logits_final")
    if ref.shape != port_logits.shape:
        return {**out, "available": False, "ok": False,
                "reason": f"probe logits shape {tuple(port_logits.shape)} vs baseline {tuple(ref.shape)}"}
    d = difference(port_logits, ref)
    agree = float((port_logits.argmax(-1) == ref.argmax(-1)).mean())
    return {**out, "available": True, "source": reason, "max_abs_diff": d.max_abs, "mean_abs_diff": d.mean_abs,
            "argmax_agreement": agree, "ok": bool(np.isfinite(d.max_abs) and d.max_abs <= tol.logits_atol)}


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


def throughput_and_memory(base_doc: dict, run: RunRecords, tol: CurveTolerances) -> dict[str, Any]:
    b_tps = base_doc["timing"].get("steady_tokens_per_s")
    r_tps = run.summary.steady_tokens_per_s if run.summary else None
    if r_tps is None:
        steady = [r for r in run.steps if not r.compile and r.tokens and r.step_time_s]
        if steady:
            r_tps = sum(r.tokens for r in steady) / sum(r.step_time_s for r in steady)
    tps_ratio = _ratio(r_tps, b_tps)
    b_mem = max((x for v in base_doc["steps"]["peak_memory_gib"].values() for x in v
                 if x is not None and math.isfinite(x)), default=None)
    r_mem, r_kind = run_memory(run)
    mem_ratio = _ratio(r_mem, b_mem)
    t_ok = None if tol.min_throughput_ratio is None else (tps_ratio is not None and tps_ratio >= tol.min_throughput_ratio)
    m_ok = None if tol.max_memory_ratio is None else (mem_ratio is not None and mem_ratio <= tol.max_memory_ratio)
    return {
        "throughput": {"baseline_tokens_per_s": b_tps, "run_tokens_per_s": r_tps, "ratio_run_over_baseline": tps_ratio,
                       "baseline_device": base_doc["device"].get("name"), "min_ratio": tol.min_throughput_ratio, "ok": t_ok},
        "memory": {"baseline_peak_gib": b_mem, "baseline_kind": base_doc["memory"].get("kind"),
                   "baseline_peak_by_phase_gib": base_doc["memory"].get("peak_gib"),
                   "run_peak_gib": r_mem, "run_kind": r_kind, "ratio_run_over_baseline": mem_ratio,
                   "same_kind": _same_memory_kind(base_doc["memory"].get("kind"), r_kind),
                   "max_ratio": tol.max_memory_ratio, "ok": m_ok},
    }


def _same_memory_kind(base_kind: str | None, run_kind: str | None) -> bool:
    host = {"host_rss_hwm", "host_rss_process_peak", "host_rss"}  # "host_rss": sampled at step end, not a peak
    return (base_kind in host) == (run_kind in host) if base_kind and run_kind else False


def compare(base_doc: dict, base_settings: dict, run: RunRecords, run_settings: dict, tol: CurveTolerances,
            run_logits: Callable[[], tuple[np.ndarray | None, str]], allow_settings_mismatch: bool = False
            ) -> dict[str, Any]:
    """The full comparison; ``run_logits()`` gives the run's probe logits (or None) and where they came from."""
    diff = settings_diff(base_settings, run_settings)
    key_diff = [d for d in diff if d["key_setting"]]
    if key_diff and not allow_settings_mismatch:
        listed = ", ".join(f"{d['key']} {d['baseline']!r} (baseline) vs {d['run']!r} (run)" for d in key_diff)
        raise ConfigError(f"{run.path}: settings differ from the baseline: {listed}; re-run one side with the "
                          "other's settings, or pass --allow-settings-mismatch to compare anyway")
    loss = loss_curve(base_doc, run, tol)
    logits, reason = run_logits()
    pr = probe(base_doc, logits, reason, tol)
    tm = throughput_and_memory(base_doc, run, tol)
    failures = []
    if key_diff:
        failures.append("settings differ: " + ", ".join(d["key"] for d in key_diff))
    if not loss["ok"]:
        failures.append(f"loss outside tolerance at steps {loss['failing_steps'][:10]}" if loss["failing_steps"]
                        else "no common step between baseline and run")
    if pr["ok"] is False:
        failures.append(f"probe logits: {pr.get('reason') or 'max abs diff %.3g > %.3g' % (pr['max_abs_diff'], tol.logits_atol)}")
    for part in ("throughput", "memory"):
        if tm[part]["ok"] is False:
            failures.append(f"{part} ratio {tm[part]['ratio_run_over_baseline']} outside the bound asked for")
    est = estimator_vs_baseline(base_doc, run)
    checks = _checks(key_diff, loss, pr, tm, tol)
    from porting.baseline.profile import side_by_side

    seq, batching = run_settings.get("seq_length") or 0, (run.manifest.recipe.get("batching", {}) if run.manifest else {})
    run_tokens = batching.get("micro_batch_size", 0) * batching.get("grad_accum_steps", 0) * seq or None
    return {"format": "port-compare", "format_version": 1, "estimator": est, "baseline": base_doc.get("_path"), "run": str(run.path),
            "breakdown": side_by_side(base_doc, run.path, (base_settings.get("global_batch") or 0) * seq or None,
                                      run_tokens),
            "run_notes": list(run.notes),
            "dtype": base_settings.get("dtype"), "tolerances": asdict(tol),
            "settings": {"differ": diff, "like_for_like": not key_diff},
            "loss": loss, "probe": pr, **tm, "checks": [c.to_dict() for c in checks], "failures": failures,
            "ok": not failures}


def _checks(key_diff: list[dict], loss: dict, pr: dict, tm: dict, tol: CurveTolerances) -> list[Check]:
    """The verdict as rows: settings, loss per step, and the probe, throughput and memory where they were checked
    (a part with nothing to hold it to, such as throughput without --min-throughput-ratio, has no row)."""
    rows = [Check.claim("settings like for like", not key_diff,
                        "identical key settings" if not key_diff else "differ: " + ", ".join(d["key"] for d in key_diff)),
            Check("loss per step", "steps_failing", len(loss["failing_steps"]), 0, loss["ok"],
                  f"{loss['steps_compared']} step(s) compared, |diff| <= {tol.loss_atol:g} + {tol.loss_rtol:g} x |baseline|"
                  + (f"; first failing {loss['failing_steps'][:5]}" if loss["failing_steps"] else ""))]
    if pr["ok"] is not None:
        rows.append(Check("probe logits", "max_abs", pr.get("max_abs_diff"), tol.logits_atol, pr["ok"],
                          f"mean abs {pr['mean_abs_diff']:.3e}, argmax agreement {pr['argmax_agreement']:.1%}"
                          if pr["available"] else str(pr.get("reason"))))
    for part, key, bound, word in (("throughput", "min_ratio", "run/baseline tokens/s", "at least"),
                                   ("memory", "max_ratio", "run/baseline peak", "at most")):
        t = tm[part]
        if t["ok"] is not None:
            rows.append(Check(part, "ratio", t["ratio_run_over_baseline"], t[key], t["ok"], f"{bound}, {word} {t[key]:g}"))
    return rows


def estimator_vs_baseline(base_doc: dict, run: RunRecords) -> dict[str, Any] | None:
    """The run's dry-run memory estimate (plan.json) against the baseline's measured phase peaks."""
    from porting.baseline import estimate

    p = run.path / "plan.json"
    if run.plan is None:
        if p.exists():   # present but unreadable: the reader's note says why
            raise ConfigError(f"{p}: unreadable plan ({'; '.join(n for n in run.notes if n.startswith(p.name))}); "
                              "expected the memory_gib_by_phase that `port train` writes")
        return None
    plan = run.plan
    try:
        est = plan["memory_gib_by_phase"]
        recompute = bool(plan.get("recompute", False))
        return estimate.check(est, base_doc["memory"]["peak_gib"], recompute, base_doc["memory"].get("kind", "?"))
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{p}: unreadable plan ({e!r}); expected the memory_gib_by_phase that `port train` writes") from None


def run_settings(run: RunRecords) -> dict[str, Any]:
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
    return settings_mod.from_recipe(rec, data.get("sha256"), model, len(run.steps))


def run_compare(baseline_path: str, run_dir: str, *, allow_settings_mismatch: bool = False,
                probe: bool = True, gate: Any = None, **tol_override: float | None) -> dict[str, Any]:
    from porting.baseline import probe_logits
    from porting.rundir import read_run

    doc = schema.load(baseline_path)
    doc["_path"] = str(baseline_path)
    run = read_run(run_dir)
    rs = run_settings(run)
    mism = model_mismatch(doc["settings"], rs)
    if mism:
        raise ConfigError(f"{run_dir}: trains another model than baseline {baseline_path} ({'; '.join(mism)}); "
                          "compare a run of the same model")
    if "imported" in doc:   # a CUDA run's own log: the curve gate (porting/baseline/curve.py)
        from porting.baseline import curve

        return curve.compare_imported(doc, run, rs, gate or curve.DEFAULTS, allow_settings_mismatch)
    tol = curve_tolerances(doc["settings"]["dtype"], **tol_override)
    ids = np.asarray(doc["probe"]["input_ids"], dtype=np.int64)
    after = int(doc["probe"].get("after_step") or doc["steps"]["step"][-1])

    def probe_fn():
        if not probe:
            return None, "skipped (--no-probe)"
        return probe_logits.run_probe_logits(run, ids, after)

    return compare(doc, doc["settings"], run, rs, tol, probe_fn, allow_settings_mismatch)


def _fmt(x: Any, spec: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def render(rep: dict[str, Any], max_rows: int = 20) -> str:
    if rep.get("kind") == "imported":
        from porting.baseline.curve import render_imported

        return render_imported(rep)
    """The human table: settings first, then loss per step, probe, throughput, memory, verdict."""
    lines = [f"baseline {rep['baseline']}  vs  run {rep['run']}  (precision {rep['dtype']})", ""]
    differ = rep["settings"]["differ"]
    if differ:
        lines.append("SETTINGS THAT DIFFER" + ("" if rep["settings"]["like_for_like"] else " (not like for like)"))
        for d in differ:
            lines.append(f"  {'*' if d['key_setting'] else ' '} {d['key']:<20} baseline {_fmt(d['baseline'])}  run {_fmt(d['run'])}")
    else:
        lines.append("settings: identical")
    loss, tol = rep["loss"], rep["tolerances"]
    lines += ["", f"LOSS per step (tolerance |diff| <= {tol['loss_atol']:g} + {tol['loss_rtol']:g} x |baseline|)",
              f"  {'step':>5} {'baseline':>12} {'run':>12} {'abs diff':>10} {'rel diff':>10} {'gnorm rel':>10}"]
    rows = loss["per_step"]
    shown = rows if len(rows) <= max_rows else rows[:max_rows // 2] + rows[-max_rows // 2:]
    for r in shown:
        lines.append(f"  {r['step']:>5} {r['baseline']:>12.6f} {r['run']:>12.6f} {r['abs_diff']:>10.2e} "
                     f"{_fmt(r['rel_diff'], '.2e'):>10} {_fmt(r['grad_norm_rel_diff'], '.2e'):>10}{'' if r['ok'] else '  FAIL'}")
    if len(rows) > len(shown):
        lines.append(f"  ({len(rows) - len(shown)} middle steps not shown; --json has all)")
    lines.append(f"  steps compared {loss['steps_compared']}/{loss['baseline_steps']}, max abs {_fmt(loss['max_abs_diff'], '.3e')}, "
                 f"max rel {_fmt(loss['max_rel_diff'], '.3e')}, grad-norm max rel {_fmt(loss['max_grad_norm_rel_diff'], '.3e')}")
    pr = rep["probe"]
    lines += ["", f"PROBE logits after step {pr['after_step']} (tolerance max abs <= {pr['tolerance_max_abs']:g})"]
    if pr["available"]:
        lines.append(f"  max abs {pr['max_abs_diff']:.3e}  mean abs {pr['mean_abs_diff']:.3e}  argmax agreement "
                     f"{pr['argmax_agreement']:.1%}  (port weights: {pr['source']})")
    else:
        lines.append(f"  not available: {pr['reason']}")
    t, m = rep["throughput"], rep["memory"]
    lines += ["", "THROUGHPUT (steady state, target tokens/s)",
              f"  baseline {_fmt(t['baseline_tokens_per_s'], '.1f')} on {t['baseline_device']}  run {_fmt(t['run_tokens_per_s'], '.1f')}  "
              f"ratio run/baseline {_fmt(t['ratio_run_over_baseline'], '.3f')}",
              "MEMORY (peak)",
              f"  baseline {_fmt(m['baseline_peak_gib'], '.3f')} GiB ({m['baseline_kind']})  run {_fmt(m['run_peak_gib'], '.3f')} GiB "
              f"({m['run_kind'] or 'not logged'})  ratio {_fmt(m['ratio_run_over_baseline'], '.3f')}"
              + ("" if m["same_kind"] else "  [different kinds of memory: not like for like]")]
    est = rep.get("estimator")
    if est:
        note = "" if est["comparable"] else "  [baseline measured host RSS incl. runtime: indicative only]"
        lines += ["", f"MEMORY ESTIMATE (run's plan.json) vs baseline measured peaks ({est['measured_kind']}){note}"]
        for ph in ("forward", "backward", "optimizer"):
            lines.append(f"  {ph:<10} estimate {est['estimate_gib'][ph]:>9.3f} GiB  measured {est['measured_gib'][ph]:>9.3f} GiB  "
                         f"ratio {_fmt(est['ratio_estimate_over_measured'][ph], '.2f')}")
        lines.append(f"  {'total':<10} estimate {est['estimate_total_gib']:>9.3f} GiB  measured max {est['measured_max_gib']:>5.3f} GiB  "
                     f"ratio {_fmt(est['ratio_total_over_measured_max'], '.2f')}")
    from porting.baseline.profile import render_side_by_side

    lines += render_side_by_side(rep.get("breakdown"))
    for note in rep.get("run_notes") or []:
        lines += ["", f"NOTE (run directory): {note}"]
    lines += ["", table([Check.from_dict(c) for c in rep["checks"]])]
    lines += ["", "RESULT: " + ("PASS" if rep["ok"] else "FAIL: " + "; ".join(rep["failures"]))]
    return "\n".join(lines)
