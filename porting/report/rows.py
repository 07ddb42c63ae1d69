"""The acceptance rows of `port report`, one small function per area, from a run directory as
:mod:`porting.rundir` reads it plus the optional evidence files beside it.

A row without evidence is ``missing`` and names the command that produces it. Evidence that is
there but malformed (``"passed": "false"``, a string where a number belongs) is shown as invalid,
never as a pass.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from model_zoo import files
from model_zoo.errors import ConfigError, PortingError
from porting.rundir import RunRecords, finite
from porting.rundir.records import PLAN_FILE
from porting.train.plan.make import TrainPlan

PASS, FAIL, INFO, MISSING, WARN = "pass", "fail", "info", "missing", "warn"
STATUSES = (PASS, FAIL, WARN, INFO, MISSING)
PHASE_ORDER = ("weights", "gradients", "optimizer_states", "activations", "activations_recompute", "comm_buffers",
               "workspace")
DEVICES = {"cpu": "CPU", "ascend": "Ascend", "npu": "Ascend", "gpu": "GPU"}


@dataclasses.dataclass(frozen=True)
class Row:
    area: str
    item: str
    status: str       # one of STATUSES
    value: str
    evidence: str     # the file the value comes from, or the command that would produce it


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What the report uses of `port diagnose` on the run's logs."""

    first_failing_rank: int | None
    last_step: int | None
    reason: str
    ranks_seen: int
    rank_last_steps: tuple[int, ...]
    warnings: tuple[str, ...]


def read_plan(run: RunRecords) -> TrainPlan | None:
    """The run's plan.json as the typed plan (``TrainPlan.from_dict``); one it refuses is a note and no plan."""
    if run.plan is None:
        return None
    try:
        return TrainPlan.from_dict(run.plan, PLAN_FILE)
    except ConfigError as e:
        run.notes.append(str(e))
        return None


def _evidence(run: RunRecords, name: str) -> Any:
    """An optional evidence file beside the run (bounded read); unreadable: a note and None."""
    p = run.path / name
    if p.is_symlink():   # a link planted in the run may reach any file: never followed, never shown
        run.notes.append(f"{name}: a symbolic link, not followed (the report reads only the run's own files)")
        return None
    if not p.exists():
        return None
    try:
        return files.read_json(p, what="JSON")
    except PortingError as e:
        run.notes.append(name + str(e)[len(str(p)):] if str(e).startswith(str(p)) else f"{name}: {e}")
        return None


def _rec(run: RunRecords) -> dict:
    return run.manifest.recipe if run.manifest else {}


def rows_correctness(run: RunRecords) -> list[Row]:
    out = [_parity_row(_evidence(run, "parity.json"))]
    losses = [(r.step, r.loss) for r in run.steps]
    if not losses:
        out.append(Row("correctness", "training loss", MISSING, "no steps in metrics.jsonl", "metrics.jsonl"))
        return out
    nonfinite = [s for s, l in losses if not finite(l)]
    fin = [(s, l) for s, l in losses if finite(l)]
    if nonfinite:
        out.append(Row("correctness", "training loss", FAIL, f"non-finite loss at step(s) {nonfinite[:5]}",
                       "metrics.jsonl"))
    elif len(fin) >= 2:
        k = max(1, len(fin) // 10)
        first = sum(l for _, l in fin[:k]) / k
        last = sum(l for _, l in fin[-k:]) / k
        out.append(Row("correctness", "training loss", PASS if last < first else WARN,
                       f"{first:.4f} -> {last:.4f} over {len(fin)} steps (mean of first/last {k})",
                       "metrics.jsonl"))
    else:
        out.append(Row("correctness", "training loss", INFO, f"{fin[0][1]:.4f} (one step)", "metrics.jsonl"))
    return out


def _parity_row(parity: Any) -> Row:
    """The verdict of `port verify --json` and its rows (porting.verify.check.Check): every failed row, or
    the row closest to its tolerance."""
    from porting.verify.check import Check, brief

    item = "parity with HF (port verify)"
    if parity is None:
        return Row("correctness", item, MISSING, "no parity.json", "port verify --hf MODEL --json > RUNDIR/parity.json")
    passed = parity.get("passed") if isinstance(parity, dict) else None
    if not isinstance(passed, bool):   # "false", 1, null: not a verdict port verify writes
        return Row("correctness", item, FAIL, f"invalid parity.json: 'passed' is {str(passed)[:40]!r} "
                   f"({type(passed).__name__}), expected true or false as `port verify --json` writes",
                   "parity.json")
    try:
        checks = [Check.from_dict(c) for c in (parity.get("checks") or [])]
    except ValueError as e:
        return Row("correctness", item, FAIL, f"invalid parity.json: {e}; write it with port verify --json",
                   "parity.json")
    failed = [c for c in checks if not c.passed]
    measured = [c for c in checks if c.value is not None and c.tolerance and math.isfinite(c.value)]
    closest = max(measured, key=lambda c: c.value / c.tolerance, default=None)
    shown = failed[:3] if failed else ([closest] if closest else [])
    return Row("correctness", item, PASS if passed and not failed else FAIL,
               f"passed={passed}, {len(checks)} check(s)" + "".join(f"; {brief(c)}" for c in shown), "parity.json")


def rows_operators(run: RunRecords) -> list[Row]:
    out = []
    scan = _evidence(run, "ops_scan.json")
    if isinstance(scan, dict) and isinstance(scan.get("ops"), list):
        blocking = [str(b) for b in scan.get("blocking") or []] if isinstance(scan.get("blocking"), list) else []
        counts = scan.get("counts") if isinstance(scan.get("counts"), dict) else {}
        out.append(Row("operators", "torch_npu coverage (port ops scan)", FAIL if blocking else PASS,
                       (f"{len(blocking)} blocking: {', '.join(blocking[:4])}" if blocking else "no blocking op")
                       + f"; {len(scan['ops'])} overloads ("
                       + ", ".join(f"{k} {v}" for k, v in counts.items() if v) + ")", "ops_scan.json"))
    else:
        out.append(Row("operators", "torch_npu coverage (port ops scan)", MISSING, "no ops_scan.json",
                       "port ops scan --hf MODEL --out RUNDIR/ops_scan.json"))
    out.append(_row_script_scan(run))
    out.append(_derived_kernel_plan(run) or Row("operators", "MindSpore kernel plan", MISSING,
                                                "no kernel plan recorded", "port ops zoo --hf MODEL --device Ascend"))
    return out


def _derived_kernel_plan(run: RunRecords) -> Row | None:
    """The plan `model_zoo.kernels.select_kernels` gives the manifest's model config on the run's
    device and on Ascend (same rule the model used when it was built)."""
    cfg_dict = run.manifest.model.config if run.manifest else None
    if not isinstance(cfg_dict, dict):
        return None
    from model_zoo.config import LlamaConfig
    from model_zoo.kernels import select_kernels

    recipe = _rec(run)
    device = DEVICES.get(str((recipe.get("cluster") or {}).get("device", "")).lower())
    dtype = str((recipe.get("precision") or {}).get("compute_dtype") or "bfloat16")
    try:
        cfg = LlamaConfig.from_hf(cfg_dict)
        parts = []
        for dev, dt in ((device, dtype), ("Ascend", "bfloat16")):
            if dev is None or (parts and dev == device and dt == dtype):
                continue
            plan = select_kernels(cfg, device=dev, compute_dtype=dt)
            parts.append(f"on {dev} ({dt}): " + ", ".join(f"{c.kernel}={c.impl}" for c in plan.choices()))
    except (PortingError, TypeError, ValueError, KeyError) as e:
        return Row("operators", "MindSpore kernel plan", MISSING, f"model config not usable: {e}", "manifest.json")
    return Row("operators", "MindSpore kernel plan", INFO, "; ".join(parts),
               "manifest.json model.config + recipe (model_zoo.kernels.select_kernels)")


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def cluster(run: RunRecords, plan: TrainPlan | None) -> tuple[int | None, int | None, int | None]:
    """(nodes, devices per node, world size) from the manifest (or the plan)."""
    cl = _rec(run).get("cluster") or {}
    nodes = _int(cl.get("nodes"))
    per = _int(cl.get("devices_per_node", cl.get("cards_per_node")))
    world = (run.manifest.world_size if run.manifest else None) or (plan.world_size if plan else None)
    if world is None and nodes is not None and per is not None:
        world = nodes * per
    return nodes, per, world


def rows_stability(run: RunRecords, diag: Diagnosis | None, plan: TrainPlan | None) -> list[Row]:
    nodes, per, world = cluster(run, plan)
    scale = None
    if world == 1:
        scale = "1 device"
    elif nodes is not None and nodes > 1:
        scale = "multi-node"
    elif world is not None and world > 1:
        scale = "single-node multi-device"
    done = len(run.steps)
    completed = run.summary is not None
    reasons = [r.skip_reason or "loss scale" for r in run.steps if r.skipped]   # porting/train/run/step/nonfinite.py
    skipped = f"{len(reasons)} skipped (" + ", ".join(f"{reasons.count(k)} {k}" for k in sorted(set(reasons))) + ")"
    out = []
    for label in ("1 device", "single-node multi-device", "multi-node"):
        if scale == label:
            ok = completed and not (diag and diag.first_failing_rank is not None)
            out.append(Row("stability", f"run at {label}", PASS if ok else FAIL,
                           f"{done} step(s)" + (", finished" if completed else ", no summary (did not finish)")
                           + (f", {skipped}" if reasons else ""),
                           "metrics.jsonl, manifest.json"))
        else:
            out.append(Row("stability", f"run at {label}", MISSING,
                           f"this run is {scale or 'of unknown scale'}", "a separate run dir at that scale"))
    ckdir = run.dir.checkpoints
    ck = sorted(p.name for p in ckdir.glob("step_*")) if ckdir.is_dir() else []
    out.append(Row("stability", "checkpoints", PASS if ck else MISSING,
                   f"{len(ck)}: {', '.join(ck[-3:])}" if ck else "none", "checkpoints/"))
    hf = run.dir.hf / "config.json"
    out.append(Row("stability", "HF export", PASS if hf.is_file() else MISSING,
                   "hf/config.json present" if hf.is_file() else "no hf/ export", "hf/"))
    return out


def _rank_table_row(path: Path, nodes: int | None, per: int | None) -> Row:
    from porting.cluster import ranktable
    from porting.diagnostics import DiagnosticsError

    try:
        errs = ranktable.errors_of(ranktable.check(ranktable.load(path), nodes=nodes, cards_per_node=per))
    except DiagnosticsError as e:
        return Row("communication", "rank map (rank table)", FAIL, str(e), "rank_table.json")
    return Row("communication", "rank map (rank table)", FAIL if errs else PASS,
               f"{len(errs)} error(s): " + "; ".join(f"{e.where}: {e.message}" for e in errs[:3])
               if errs else "every documented rule holds", "rank_table.json")


def rows_communication(run: RunRecords, diag: Diagnosis | None, plan: TrainPlan | None) -> list[Row]:
    out = []
    nodes, per, world = cluster(run, plan)
    logs = run.dir.logs
    rank_logs = sorted(logs.glob("rank_*.log")) if logs.is_dir() else []
    if not rank_logs:
        out.append(Row("communication", "per-rank logs", MISSING, "no logs/rank_<r>.log", "logs/"))
    else:
        ranks = sorted(int(p.stem.split("_")[1]) for p in rank_logs if p.stem.split("_")[1].isdigit())
        want = list(range(world)) if world is not None else ranks
        miss = sorted(set(want) - set(ranks))
        out.append(Row("communication", "per-rank logs", FAIL if miss else PASS,
                       f"{len(ranks)} rank log(s)" + (f"; missing ranks {miss[:8]}" if miss else ""), "logs/"))
    rt_file = run.dir.rank_table
    if rt_file.is_file():
        out.append(_rank_table_row(rt_file, nodes, per))
    elif world is not None and world > 1:
        out.append(Row("communication", "rank map (rank table)", MISSING,
                       f"{world} ranks, no rank_table.json (msrun dynamic networking?)", "rank_table.json"))
    elif world == 1:
        out.append(Row("communication", "rank map (rank table)", INFO, "single device: no rank table needed", "-"))
    else:
        out.append(Row("communication", "rank map (rank table)", MISSING, "world size unknown (no manifest.json)",
                       "manifest.json"))
    item = "log diagnosis (port diagnose)"
    if diag is None:
        out.append(Row("communication", item, MISSING, "no logs to diagnose", "logs/"))
    elif diag.first_failing_rank is not None:
        out.append(Row("communication", item, FAIL, f"rank {diag.first_failing_rank} failed first at step "
                       f"{diag.last_step}: {diag.reason[:160]}", "logs/ (port diagnose)"))
    else:
        out.append(Row("communication", item, PASS, f"no failure in {diag.ranks_seen} rank(s); last steps "
                       f"{sorted(set(diag.rank_last_steps))[:4]}", "logs/ (port diagnose)"))
    out.append(comm_wait_row(run, world))
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2


def comm_wait_row(run: RunRecords, world: int | None) -> Row:
    """Per-rank wait in the timed all-reduce of sampled steps (porting/train/run/step/commwait.py): median and
    max per rank, and the rank the others wait for (the one last to arrive, whose own wait is least)."""
    item = "communication wait"
    if world == 1:
        return Row("communication", item, INFO, "single process: no collectives", "-")
    sampled = [r for r in run.steps if r.comm_wait_ranks_s]
    if not sampled:
        waits = [r.comm_wait_s for r in run.steps if finite(r.comm_wait_s)]
        if waits:   # rank 0's value only (a writer without the per-rank list)
            return Row("communication", item, INFO, f"rank 0: median {_median(waits):.4f} s, max {max(waits):.4f} s "
                       f"over {len(waits)} sampled step(s)", "metrics.jsonl comm_wait_s")
        return Row("communication", item, MISSING, "no comm_wait_s in metrics",
                   "port train with logging.comm_sample_every > 0 on more than one rank")
    n = max(len(r.comm_wait_ranks_s) for r in sampled)
    per = [[r.comm_wait_ranks_s[k] for r in sampled if k < len(r.comm_wait_ranks_s)] for k in range(n)]
    desc = "; ".join(f"rank {k} median {_median(w):.4f} s max {max(w):.4f} s" for k, w in enumerate(per))
    step_times = [r.step_time_s for r in sampled if finite(r.step_time_s) and not r.compile]
    # Noise floor: the all-reduce's own latency and scheduling jitter; a gap below it names no rank.
    floor = max(0.005, 0.05 * _median(step_times)) if step_times else 0.005
    last: dict[int, int] = {}
    for r in sampled:
        w = r.comm_wait_ranks_s
        if max(w) - min(w) > floor:
            k = min(range(len(w)), key=lambda i: w[i])
            last[k] = last.get(k, 0) + 1
    where = f"metrics.jsonl comm_wait_ranks_s ({len(sampled)} sampled step(s))"
    if not last:
        return Row("communication", item, INFO, f"{desc}; balanced: no rank keeps the others waiting more than "
                   f"{floor:.3f} s", where)
    slow = max(last, key=lambda k: (last[k], -k))
    others = [_median(w) for k, w in enumerate(per) if k != slow]
    return Row("communication", item, WARN, f"{desc}; the others wait for rank {slow} (last to arrive on "
               f"{last[slow]} of {len(sampled)} sampled step(s); others' median wait {_median(others):.4f} s)", where)


def rows_resources(run: RunRecords, plan: TrainPlan | None) -> list[Row]:
    out = []
    if plan is not None and finite(plan.memory_gib_by_phase.total):
        mem, hbm = plan.memory_gib_by_phase, plan.device_hbm_gib
        fits = finite(hbm) and mem.total <= hbm
        parts = ", ".join(f"{k} {mem.term(k):.2f}" for k in PHASE_ORDER if finite(mem.term(k)))
        out.append(Row("resources", "peak memory by phase (plan estimate)",
                       (PASS if fits else FAIL) if finite(hbm) else INFO,
                       f"total {mem.total:.2f} GiB" + (f" of {hbm:.0f} GiB HBM" if finite(hbm) else "")
                       + f" ({parts})", "plan.json"))
    else:
        out.append(Row("resources", "peak memory by phase (plan estimate)", MISSING, "no memory_gib_by_phase",
                       "plan.json (port train --dry-run)"))
    measured = {}
    for key in ("device_peak_gib", "host_rss_gib"):
        vals = [getattr(r, key) for r in run.steps if finite(getattr(r, key))]
        if vals:
            measured[key] = max(vals)
    out.append(Row("resources", "measured peak memory", INFO if measured else MISSING,
                   ", ".join(f"{k} {v:.2f}" for k, v in measured.items()) or "no memory fields in metrics",
                   "metrics.jsonl"))
    return out


def rows_performance(run: RunRecords) -> list[Row]:
    s = run.summary
    out = []
    if s is not None and finite(s.steady_tokens_per_s):
        out.append(Row("performance", "throughput (steady)", INFO, f"{s.steady_tokens_per_s:.1f} tokens/s",
                       "metrics.jsonl summary"))
    else:
        tps = sorted(r.tokens_per_s for r in run.steps if finite(r.tokens_per_s) and not r.compile)
        out.append(Row("performance", "throughput (steady)", INFO if tps else MISSING,
                       f"median {tps[len(tps) // 2]:.1f} tokens/s (no summary line)" if tps else "no data",
                       "metrics.jsonl"))
    comp = [r.step_time_s for r in run.steps if r.compile and finite(r.step_time_s)]
    steady = sorted(r.step_time_s for r in run.steps if not r.compile and finite(r.step_time_s))
    summary_ct = s.compile_time_s if s is not None and finite(s.compile_time_s) else None
    if comp or steady or summary_ct is not None:
        med = steady[len(steady) // 2] if steady else None
        ct = summary_ct if summary_ct is not None else (
            sum(max(0.0, c - (med or 0.0)) for c in comp) if comp else None)
        where = (f"before step 1 ({s.precompiled_graphs} graphs)" if s is not None and s.precompile_s is not None
                 else f"over {len(comp)} step(s)")   # run/step/precompile.py compiles every shape before step 1
        out.append(Row("performance", "compile vs steady", INFO,
                       (f"compile {ct:.2f} s {where}" if ct is not None else "no compile steps")
                       + (f"; steady {med:.3f} s/step" if med is not None else ""), "metrics.jsonl"))
    else:
        out.append(Row("performance", "compile vs steady", MISSING, "no step times", "metrics.jsonl"))
    pads = [r.padding_fraction for r in run.steps if finite(r.padding_fraction)]
    if pads:
        out.append(Row("performance", "padding", INFO, f"mean padding fraction {sum(pads) / len(pads):.3f}",
                       "metrics.jsonl"))
    return out


def rows_environment(run: RunRecords) -> list[Row]:
    m = run.manifest
    doc = m.doctor if m else None
    v = (doc or {}).get("versions") or (m.versions if m else None)
    if not isinstance(v, dict) or not v:
        return [Row("environment", "versions (port doctor)", MISSING, "no versions in manifest.json",
                    "manifest.json")]
    pk = v.get("packages") if isinstance(v.get("packages"), dict) else {}
    desc = ", ".join(f"{k} {pk[k]}" for k in ("mindspore", "torch", "torch_npu", "transformers", "mindspeed")
                     if pk.get(k)) + f"; CANN {v.get('cann') or '-'}; NPU {'yes' if v.get('npu_present') else 'no'}"
    out = [Row("environment", "versions", INFO, f"Python {v.get('python')}; {desc}", "manifest.json")]
    if isinstance(doc, dict):
        checks = doc.get("checks") if isinstance(doc.get("checks"), list) else []
        fails = [c for c in checks if isinstance(c, dict) and c.get("status") == "fail"]
        out.append(Row("environment", "doctor checks", FAIL if fails else PASS,
                       f"{len(fails)} failing: {fails[0].get('check')}" if fails else "no failing check",
                       "manifest.json doctor"))
        if isinstance(doc.get("untested_pairing"), str):   # a MindSpore in range that no CI tier runs
            out.append(Row("environment", "untested pairing", WARN, doc["untested_pairing"], "manifest.json doctor"))
    else:
        out.append(Row("environment", "doctor checks", MISSING, "manifest has versions only",
                       "porting.diagnostics.doctor.doctor_report() in the manifest"))
    return out


def _field(d: Any, key: str) -> Any:
    """A field of `port diagnose`'s verdict, whether it is a dict or a dataclass."""
    return d.get(key) if isinstance(d, dict) else getattr(d, key, None)


def diagnose_logs(run: RunRecords, plan: TrainPlan | None) -> Diagnosis | None:
    """`port diagnose` on the run's logs/ (None without logs); a refusal becomes a note."""
    if not run.dir.logs.is_dir():
        return None
    from porting.diagnostics import DiagnosticsError
    from porting.diagnostics.diagnose import diagnose

    world = cluster(run, plan)[2]
    try:
        d = diagnose(run.dir.logs, jobs=1, world_size=world)
    except DiagnosticsError as e:
        run.notes.append(f"logs/: {e}")
        return None
    ranks = _field(d, "ranks") or []
    warnings = tuple(str(w) for w in (_field(d, "warnings") or []))
    run.notes.extend(f"logs/{w}" for w in warnings[:8])
    return Diagnosis(first_failing_rank=_field(d, "first_failing_rank"), last_step=_field(d, "last_step"),
                     reason=str(_field(d, "reason") or ""), ranks_seen=int(_field(d, "ranks_seen") or 0),
                     rank_last_steps=tuple(s for s in (_field(r, "last_step") for r in ranks) if isinstance(s, int)),
                     warnings=warnings)


def _row_script_scan(run: RunRecords) -> Row:
    """CUDA habits left in the team's training scripts (`port ops lint ... --out RUNDIR/script_scan.json`)."""
    scan = _evidence(run, "script_scan.json")
    item = "CUDA habits in the training scripts (port ops lint)"
    if not (isinstance(scan, dict) and isinstance(scan.get("findings"), list) and isinstance(scan.get("counts"), dict)):
        return Row("operators", item, MISSING, "no script_scan.json",
                   "port ops lint TRAIN.py --out RUNDIR/script_scan.json")
    n = len(scan["findings"])
    where = ", ".join(f"{f.get('file')}:{f.get('line')} {f.get('rule')}" for f in scan["findings"][:4] if isinstance(f, dict))
    return Row("operators", item, FAIL if n else PASS,
               (f"{n} habit(s) to change: " + ", ".join(f"{k} {v}" for k, v in scan["counts"].items())
                + (f" (first: {where})" if where else "")) if n else "none found", "script_scan.json")


def build_rows(run: RunRecords, plan: TrainPlan | None) -> tuple[list[Row], Diagnosis | None]:
    """The rows of every area; ``plan``: the run's plan.json as :func:`read_plan` gives it."""
    diag = diagnose_logs(run, plan)
    rows = (rows_correctness(run) + rows_operators(run) + rows_stability(run, diag, plan)
            + rows_communication(run, diag, plan) + rows_resources(run, plan) + rows_performance(run)
            + rows_environment(run))
    return rows, diag
