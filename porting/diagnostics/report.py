"""`port report RUNDIR`: the acceptance table of a migrated run, filled from evidence in the run dir.

Rows (correctness, operators, stability, communication, resources, performance, environment) read
the run directory contract (manifest.json, plan.json, metrics.jsonl, logs/, checkpoints/, hf/) and
optional evidence files written next to them by other commands:

* ``parity.json``  -- ``port verify ... --json > RUNDIR/parity.json``
* ``ops_scan.json`` -- ``port ops scan --hf MODEL --out RUNDIR/ops_scan.json``
* ``rank_table.json`` -- the rank table the run used (checked with ``port ranktable check`` rules)

A row without evidence is marked ``missing`` with the command that would produce it. Output:
``report.html`` (inline SVG plots, no network), ``report.md``, ``report.json`` and the SVGs, written
to a temporary directory and renamed into place.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from porting.diagnostics import DiagnosticsError

PASS, FAIL, INFO, MISSING, WARN = "pass", "fail", "info", "missing", "warn"
AREAS = ("correctness", "operators", "stability", "communication", "resources", "performance", "environment")
PHASE_ORDER = ("weights", "gradients", "optimizer_states", "activations", "activations_recompute", "comm_buffers",
               "workspace")


@dataclasses.dataclass
class Row:
    area: str
    item: str
    status: str
    value: str
    evidence: str


@dataclasses.dataclass
class RunData:
    root: Path
    manifest: dict | None
    plan: dict | None
    steps: list[dict]
    summary: dict | None
    problems: list[str]


# ---------------------------------------------------------------------------------------------
# Reading the run directory (every read tolerant: a problem becomes a note, never a traceback).

def _read_json(path: Path, problems: list[str]) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"{path.name}: unreadable ({e})")
    except json.JSONDecodeError as e:
        problems.append(f"{path.name}: invalid JSON at line {e.lineno} ({e.msg})")
    return None


def read_metrics(path: Path, problems: list[str]) -> tuple[list[dict], dict | None]:
    steps: list[dict] = []
    summary = None
    if not path.is_file():
        return steps, summary
    bad = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if not isinstance(rec, dict):
                    bad += 1
                elif rec.get("event") == "summary":
                    summary = rec
                elif isinstance(rec.get("step"), int):
                    steps.append(rec)
                else:
                    bad += 1
    except OSError as e:
        problems.append(f"metrics.jsonl: unreadable ({e.strerror})")
    if bad:
        problems.append(f"metrics.jsonl: {bad} malformed line(s) skipped (truncated write?)")
    return steps, summary


def load_run(root: str | os.PathLike) -> RunData:
    root = Path(root)
    if not root.exists():
        raise DiagnosticsError(f"{root}: no such run directory; pass the output_dir of a `port train` run")
    if not root.is_dir():
        raise DiagnosticsError(f"{root}: is a file; pass the run directory (with manifest.json, metrics.jsonl)")
    problems: list[str] = []
    manifest = _read_json(root / "manifest.json", problems)
    plan = _read_json(root / "plan.json", problems)
    steps, summary = read_metrics(root / "metrics.jsonl", problems)
    if manifest is None and plan is None and not steps and not (root / "logs").is_dir():
        raise DiagnosticsError(f"{root}: not a run directory (no manifest.json, plan.json, metrics.jsonl or "
                               f"logs/); run `port train RECIPE` first" + (f" ({problems[0]})" if problems else ""))
    return RunData(root, manifest if isinstance(manifest, dict) else None, plan if isinstance(plan, dict) else None,
                   steps, summary, problems)


# ---------------------------------------------------------------------------------------------
# Rows, one small function per area.

def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def rows_correctness(run: RunData) -> list[Row]:
    out = []
    parity = _read_json(run.root / "parity.json", run.problems)
    if isinstance(parity, dict):
        passed = parity.get("passed")
        checks = parity.get("checks") or parity.get("rows") or []
        worst = max((c.get("max_abs", 0.0) for c in checks if isinstance(c, dict)), default=None)
        out.append(Row("correctness", "parity with HF (port verify)", PASS if passed else FAIL,
                       f"passed={passed}" + (f", worst max abs {worst:.2e}" if worst is not None else ""),
                       "parity.json"))
    else:
        out.append(Row("correctness", "parity with HF (port verify)", MISSING, "no parity.json",
                       "port verify --hf MODEL --json > RUNDIR/parity.json"))
    losses = [(r["step"], r.get("loss")) for r in run.steps]
    if not losses:
        out.append(Row("correctness", "training loss", MISSING, "no steps in metrics.jsonl", "metrics.jsonl"))
        return out
    nonfinite = [s for s, l in losses if not _finite(l)]
    fin = [(s, l) for s, l in losses if _finite(l)]
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


def rows_operators(run: RunData) -> list[Row]:
    out = []
    scan = _read_json(run.root / "ops_scan.json", run.problems)
    if isinstance(scan, dict) and isinstance(scan.get("ops"), list):
        blocking = scan.get("blocking") or []
        counts = scan.get("counts") or {}
        out.append(Row("operators", "torch_npu coverage (port ops scan)", FAIL if blocking else PASS,
                       (f"{len(blocking)} blocking: {', '.join(blocking[:4])}" if blocking else "no blocking op")
                       + f"; {len(scan['ops'])} overloads ("
                       + ", ".join(f"{k} {v}" for k, v in counts.items() if v) + ")", "ops_scan.json"))
    else:
        out.append(Row("operators", "torch_npu coverage (port ops scan)", MISSING, "no ops_scan.json",
                       "port ops scan --hf MODEL --out RUNDIR/ops_scan.json"))
    kernels = (run.plan or {}).get("kernels") or ((run.manifest or {}).get("model") or {}).get("kernels")
    if isinstance(kernels, dict) and kernels:
        ks = kernels.get("kernels", kernels)
        desc = ", ".join(f"{k}={v.get('impl') if isinstance(v, dict) else v}" for k, v in ks.items())
        out.append(Row("operators", "MindSpore kernel plan", INFO, desc, "plan.json/manifest.json"))
    else:
        derived = _derived_kernel_plan(run)
        out.append(derived or Row("operators", "MindSpore kernel plan", MISSING, "no kernel plan recorded",
                                  "port ops zoo --hf MODEL --device Ascend"))
    return out


DEVICES = {"cpu": "CPU", "ascend": "Ascend", "npu": "Ascend", "gpu": "GPU"}


def _derived_kernel_plan(run: RunData) -> Row | None:
    """The plan `model_zoo.kernels.select_kernels` gives the manifest's model config on the run's
    device and on Ascend (same rule the model used when it was built)."""
    m = run.manifest or {}
    cfg_dict = (m.get("model") or {}).get("config")
    recipe = m.get("recipe") or {}
    if not isinstance(cfg_dict, dict):
        return None
    from model_zoo.config import LlamaConfig
    from model_zoo.errors import PortingError
    from model_zoo.kernels import select_kernels

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


def _cluster(run: RunData) -> tuple[int | None, int | None, int | None]:
    rec = (run.manifest or {}).get("recipe") or {}
    cl = rec.get("cluster") or {}
    nodes = cl.get("nodes")
    per = cl.get("devices_per_node", cl.get("cards_per_node"))
    world = (run.manifest or {}).get("world_size") or (run.plan or {}).get("world_size")
    if world is None and isinstance(nodes, int) and isinstance(per, int):
        world = nodes * per
    return nodes, per, world


def rows_stability(run: RunData, diag: dict | None) -> list[Row]:
    nodes, per, world = _cluster(run)
    scale = None
    if world == 1:
        scale = "1 device"
    elif isinstance(nodes, int) and nodes > 1:
        scale = "multi-node"
    elif isinstance(world, int) and world > 1:
        scale = "single-node multi-device"
    total = (run.plan or {}).get("total_steps")
    done = len(run.steps)
    completed = run.summary is not None
    skipped = sum(1 for r in run.steps if r.get("skipped"))
    out = []
    for label in ("1 device", "single-node multi-device", "multi-node"):
        if scale == label:
            ok = completed and not (diag and diag.get("first_failing_rank") is not None)
            out.append(Row("stability", f"run at {label}", PASS if ok else FAIL,
                           f"{done} step(s)" + (f" of {total}" if total else "") + (", finished" if completed else
                                                                                      ", no summary (did not finish)")
                           + (f", {skipped} skipped (loss scale)" if skipped else ""),
                           "metrics.jsonl, manifest.json"))
        else:
            out.append(Row("stability", f"run at {label}", MISSING,
                           f"this run is {scale or 'of unknown scale'}", "a separate run dir at that scale"))
    ck = sorted(p.name for p in (run.root / "checkpoints").glob("step_*")) if (run.root / "checkpoints").is_dir() else []
    out.append(Row("stability", "checkpoints", PASS if ck else MISSING,
                   f"{len(ck)}: {', '.join(ck[-3:])}" if ck else "none", "checkpoints/"))
    hf = run.root / "hf"
    out.append(Row("stability", "HF export", PASS if (hf / "config.json").is_file() else MISSING,
                   "hf/config.json present" if (hf / "config.json").is_file() else "no hf/ export", "hf/"))
    return out


def rows_communication(run: RunData, diag: dict | None) -> list[Row]:
    out = []
    nodes, per, world = _cluster(run)
    logs = run.root / "logs"
    rank_logs = sorted(logs.glob("rank_*.log")) if logs.is_dir() else []
    if not rank_logs:
        out.append(Row("communication", "per-rank logs", MISSING, "no logs/rank_<r>.log", "logs/"))
    else:
        ranks = sorted(int(p.stem.split("_")[1]) for p in rank_logs if p.stem.split("_")[1].isdigit())
        want = list(range(world)) if isinstance(world, int) else ranks
        miss = sorted(set(want) - set(ranks))
        out.append(Row("communication", "per-rank logs", FAIL if miss else PASS,
                       f"{len(ranks)} rank log(s)" + (f"; missing ranks {miss[:8]}" if miss else ""), "logs/"))
    rt_file = run.root / "rank_table.json"
    if rt_file.is_file():
        from porting.cluster import ranktable

        try:
            probs = ranktable.check(ranktable.load(rt_file), nodes=nodes, cards_per_node=per)
            errs = ranktable.errors_of(probs)
            out.append(Row("communication", "rank map (rank table)", FAIL if errs else PASS,
                           f"{len(errs)} error(s): " + "; ".join(f"{e.where}: {e.message}" for e in errs[:3])
                           if errs else "every documented rule holds",
                           "rank_table.json"))
        except DiagnosticsError as e:
            out.append(Row("communication", "rank map (rank table)", FAIL, str(e), "rank_table.json"))
    elif isinstance(world, int) and world > 1:
        out.append(Row("communication", "rank map (rank table)", MISSING,
                       f"{world} ranks, no rank_table.json (msrun dynamic networking?)", "rank_table.json"))
    elif world == 1:
        out.append(Row("communication", "rank map (rank table)", INFO, "single device: no rank table needed", "-"))
    else:
        out.append(Row("communication", "rank map (rank table)", MISSING, "world size unknown (no manifest.json)",
                       "manifest.json"))
    if diag is None:
        out.append(Row("communication", "log diagnosis (port diagnose)", MISSING, "no logs to diagnose", "logs/"))
    else:
        steps = sorted({r["last_step"] for r in diag["ranks"] if isinstance(r["last_step"], int)})
        if diag["first_failing_rank"] is not None:
            out.append(Row("communication", "log diagnosis (port diagnose)", FAIL,
                           f"rank {diag['first_failing_rank']} failed first at step {diag['last_step']}: "
                           f"{diag['reason'][:160]}", "logs/ (port diagnose)"))
        else:
            out.append(Row("communication", "log diagnosis (port diagnose)", PASS,
                           f"no failure in {diag['ranks_seen']} rank(s); last steps {steps[:4]}",
                           "logs/ (port diagnose)"))
    waits = [r.get("comm_wait_s") for r in run.steps if _finite(r.get("comm_wait_s"))]
    out.append(Row("communication", "communication wait", INFO if waits else MISSING,
                   f"median {sorted(waits)[len(waits) // 2]:.3f} s/step" if waits else "no comm_wait_s in metrics",
                   "metrics.jsonl"))
    return out


def rows_resources(run: RunData) -> list[Row]:
    out = []
    mem = (run.plan or {}).get("memory_gib_by_phase")
    hbm = (run.plan or {}).get("device_hbm_gib")
    if isinstance(mem, dict) and _finite(mem.get("total")):
        fits = _finite(hbm) and mem["total"] <= hbm
        parts = ", ".join(f"{k} {mem[k]:.2f}" for k in PHASE_ORDER if _finite(mem.get(k)))
        out.append(Row("resources", "peak memory by phase (plan estimate)",
                       (PASS if fits else FAIL) if _finite(hbm) else INFO,
                       f"total {mem['total']:.2f} GiB" + (f" of {hbm:.0f} GiB HBM" if _finite(hbm) else "")
                       + f" ({parts})", "plan.json"))
    else:
        out.append(Row("resources", "peak memory by phase (plan estimate)", MISSING, "no memory_gib_by_phase",
                       "plan.json (port train --dry-run)"))
    measured = {}
    for key in ("device_peak_gib", "host_rss_gib"):
        vals = [r[key] for r in run.steps if _finite(r.get(key))]
        if vals:
            measured[key] = max(vals)
    out.append(Row("resources", "measured peak memory", INFO if measured else MISSING,
                   ", ".join(f"{k} {v:.2f}" for k, v in measured.items()) or "no memory fields in metrics",
                   "metrics.jsonl"))
    return out


def rows_performance(run: RunData) -> list[Row]:
    s = run.summary or {}
    out = []
    if _finite(s.get("steady_tokens_per_s")):
        out.append(Row("performance", "throughput (steady)", INFO, f"{s['steady_tokens_per_s']:.1f} tokens/s",
                       "metrics.jsonl summary"))
    else:
        tps = [r["tokens_per_s"] for r in run.steps if _finite(r.get("tokens_per_s")) and not r.get("compile")]
        out.append(Row("performance", "throughput (steady)", INFO if tps else MISSING,
                       f"median {sorted(tps)[len(tps) // 2]:.1f} tokens/s (no summary line)" if tps else "no data",
                       "metrics.jsonl"))
    comp = [r["step_time_s"] for r in run.steps if r.get("compile") and _finite(r.get("step_time_s"))]
    steady = [r["step_time_s"] for r in run.steps if not r.get("compile") and _finite(r.get("step_time_s"))]
    if comp or steady or _finite(s.get("compile_time_s")):
        med = sorted(steady)[len(steady) // 2] if steady else None
        ct = s.get("compile_time_s") if _finite(s.get("compile_time_s")) else (
            sum(max(0.0, c - (med or 0.0)) for c in comp) if comp else None)
        out.append(Row("performance", "compile vs steady", INFO,
                       (f"compile {ct:.2f} s over {len(comp)} step(s)" if ct is not None else "no compile steps")
                       + (f"; steady {med:.3f} s/step" if med is not None else ""), "metrics.jsonl"))
    else:
        out.append(Row("performance", "compile vs steady", MISSING, "no step times", "metrics.jsonl"))
    pads = [r["padding_fraction"] for r in run.steps if _finite(r.get("padding_fraction"))]
    if pads:
        out.append(Row("performance", "padding", INFO, f"mean padding fraction {sum(pads) / len(pads):.3f}",
                       "metrics.jsonl"))
    return out


def rows_environment(run: RunData) -> list[Row]:
    m = run.manifest or {}
    doc = m.get("doctor")
    v = (doc or {}).get("versions") or m.get("versions")
    if not isinstance(v, dict):
        return [Row("environment", "versions (port doctor)", MISSING, "no versions in manifest.json",
                    "manifest.json")]
    pk = v.get("packages") or {}
    desc = ", ".join(f"{k} {pk[k]}" for k in ("mindspore", "torch", "torch_npu", "transformers", "mindspeed")
                     if pk.get(k)) + f"; CANN {v.get('cann') or '-'}; NPU {'yes' if v.get('npu_present') else 'no'}"
    out = [Row("environment", "versions", INFO, f"Python {v.get('python')}; {desc}", "manifest.json")]
    if isinstance(doc, dict):
        fails = [c for c in doc.get("checks", []) if c.get("status") == "fail"]
        out.append(Row("environment", "doctor checks", FAIL if fails else PASS,
                       f"{len(fails)} failing: {fails[0]['check']}" if fails else "no failing check",
                       "manifest.json doctor"))
    else:
        out.append(Row("environment", "doctor checks", MISSING, "manifest has versions only",
                       "porting.diagnostics.doctor.doctor_report() in the manifest"))
    return out


def build_rows(run: RunData) -> tuple[list[Row], dict | None]:
    diag = None
    if (run.root / "logs").is_dir():
        from porting.diagnostics.diagnose import diagnose

        _, _, world = _cluster(run)
        try:
            diag = diagnose(run.root / "logs", jobs=1, world_size=world if isinstance(world, int) else None)
        except DiagnosticsError as e:
            run.problems.append(f"logs/: {e}")
        else:
            run.problems += [f"logs/{w}" for w in diag["warnings"][:8]]
    rows = (rows_correctness(run) + rows_operators(run) + rows_stability(run, diag) + rows_communication(run, diag)
            + rows_resources(run) + rows_performance(run) + rows_environment(run))
    return rows, diag


# ---------------------------------------------------------------------------------------------
# Plots: small inline SVG line and bar charts.

def svg_line(title: str, xs: list[float], ys: list[float], *, ylabel: str, marks: list[int] | None = None,
             w: int = 560, h: int = 260) -> str:
    pad_l, pad_r, pad_t, pad_b = 60, 16, 28, 40
    pts = [(x, y) for x, y in zip(xs, ys) if _finite(x) and _finite(y)]
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'role="img" aria-label="{html.escape(title)}"><rect width="{w}" height="{h}" fill="white"/>'
            f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14" font-family="sans-serif">'
            f'{html.escape(title)}</text>')
    if not pts:
        return head + f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle" font-size="12">no data</text></svg>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + (abs(y0) * 0.1 or 1.0)
    sx = lambda x: pad_l + (x - x0) / (x1 - x0) * (w - pad_l - pad_r)  # noqa: E731
    sy = lambda y: h - pad_b - (y - y0) / (y1 - y0) * (h - pad_t - pad_b)  # noqa: E731
    poly = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    body = [f'<line x1="{pad_l}" y1="{h - pad_b}" x2="{w - pad_r}" y2="{h - pad_b}" stroke="#444"/>',
            f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{h - pad_b}" stroke="#444"/>',
            f'<polyline class="series" fill="none" stroke="#1f77b4" stroke-width="1.6" points="{poly}"/>']
    for frac in (0.0, 0.5, 1.0):
        yv = y0 + frac * (y1 - y0)
        body.append(f'<text x="{pad_l - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end" font-size="10">{yv:.4g}</text>')
        xv = x0 + frac * (x1 - x0)
        body.append(f'<text x="{sx(xv):.1f}" y="{h - pad_b + 14}" text-anchor="middle" font-size="10">{xv:.4g}</text>')
    body.append(f'<text x="{w / 2}" y="{h - 6}" text-anchor="middle" font-size="11">step</text>')
    body.append(f'<text x="12" y="{h / 2}" font-size="11" transform="rotate(-90 12 {h / 2})" '
                f'text-anchor="middle">{html.escape(ylabel)}</text>')
    for i in marks or []:
        if 0 <= i < len(pts):
            x, y = pts[i]
            body.append(f'<circle class="mark" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="#d62728">'
                        f'<title>compile step {x:g}: {y:.4g}</title></circle>')
    return head + "".join(body) + "</svg>"


def svg_bars(title: str, items: list[tuple[str, float]], *, unit: str, limit: float | None = None,
             w: int = 560, h: int = 260) -> str:
    pad_l, pad_r, pad_t, pad_b = 150, 60, 28, 16
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            f'aria-label="{html.escape(title)}"><rect width="{w}" height="{h}" fill="white"/>'
            f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14" font-family="sans-serif">'
            f'{html.escape(title)}</text>')
    items = [(k, v) for k, v in items if _finite(v)]
    if not items:
        return head + f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle" font-size="12">no data</text></svg>'
    top = max([v for _, v in items] + ([limit] if _finite(limit) else [])) or 1.0
    bh = (h - pad_t - pad_b) / len(items)
    body = []
    for i, (k, v) in enumerate(items):
        y = pad_t + i * bh
        bw = v / top * (w - pad_l - pad_r)
        body.append(f'<text x="{pad_l - 6}" y="{y + bh * 0.65:.1f}" text-anchor="end" font-size="11">'
                    f'{html.escape(k)}</text>')
        body.append(f'<rect class="bar" x="{pad_l}" y="{y + 2:.1f}" width="{max(bw, 0.5):.1f}" height="{bh - 4:.1f}" '
                    f'fill="{"#2ca02c" if k != "total" else "#9467bd"}"><title>{html.escape(k)}: {v:.3f} {unit}'
                    f'</title></rect>')
        body.append(f'<text x="{pad_l + bw + 4:.1f}" y="{y + bh * 0.65:.1f}" font-size="10">{v:.2f} {unit}</text>')
    if _finite(limit):
        lx = pad_l + limit / top * (w - pad_l - pad_r)
        body.append(f'<line x1="{lx:.1f}" y1="{pad_t}" x2="{lx:.1f}" y2="{h - pad_b}" stroke="#d62728" '
                    f'stroke-dasharray="4 3"/><text x="{lx:.1f}" y="{pad_t - 2}" font-size="10" '
                    f'text-anchor="middle" fill="#d62728">HBM {limit:.0f}</text>')
    return head + "".join(body) + "</svg>"


def plots(run: RunData) -> dict[str, str]:
    xs = [r["step"] for r in run.steps]
    comp_idx = [i for i, r in enumerate(run.steps) if r.get("compile")]
    mem = (run.plan or {}).get("memory_gib_by_phase") or {}
    bars = [(k, mem[k]) for k in PHASE_ORDER if _finite(mem.get(k))]
    if _finite(mem.get("total")):
        bars.append(("total", mem["total"]))
    for key in ("device_peak_gib", "host_rss_gib"):
        vals = [r[key] for r in run.steps if _finite(r.get(key))]
        if vals:
            bars.append((f"measured {key.replace('_gib', '')}", max(vals)))
    return {
        "loss.svg": svg_line("Loss", xs, [r.get("loss") for r in run.steps], ylabel="loss"),
        "step_time.svg": svg_line("Step time (red: compile steps)", xs, [r.get("step_time_s") for r in run.steps],
                                  ylabel="seconds", marks=comp_idx),
        "memory.svg": svg_bars("Memory by phase (GiB per device)", bars, unit="GiB",
                               limit=(run.plan or {}).get("device_hbm_gib")),
    }


# ---------------------------------------------------------------------------------------------
# Rendering.

STATUS_COLORS = {PASS: "#d4f4d4", FAIL: "#f8d0d0", WARN: "#fbeec0", INFO: "#e4ecf8", MISSING: "#eeeeee"}


def render_html(run: RunData, rows: list[Row], svgs: dict[str, str]) -> str:
    title = f"port report: {run.root.name}"
    counts = {s: sum(r.status == s for r in rows) for s in (PASS, FAIL, WARN, INFO, MISSING)}
    trs = "".join(
        f'<tr class="row {r.status}" data-area="{r.area}"><td>{html.escape(r.area)}</td><td>{html.escape(r.item)}'
        f'</td><td class="status" style="background:{STATUS_COLORS[r.status]}">{r.status}</td>'
        f'<td>{html.escape(r.value)}</td><td><code>{html.escape(r.evidence)}</code></td></tr>' for r in rows)
    notes = "".join(f"<li>{html.escape(p)}</li>" for p in run.problems)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;width:100%}"
            "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;vertical-align:top}th{background:#f4f4f4}"
            ".plots{display:flex;flex-wrap:wrap;gap:12px;margin-top:16px}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p id=\"summary\">"
            + ", ".join(f"{v} {k}" for k, v in counts.items()) + f" &mdash; {len(run.steps)} step(s)</p>"
            "<table id=\"acceptance\"><thead><tr><th>area</th><th>item</th><th>status</th><th>value</th>"
            f"<th>evidence</th></tr></thead><tbody>{trs}</tbody></table>"
            f"<div class=\"plots\">{''.join(svgs.values())}</div>"
            + (f"<h2>Notes</h2><ul id=\"notes\">{notes}</ul>" if notes else "") + "</body></html>")


def render_md(run: RunData, rows: list[Row]) -> str:
    lines = [f"# port report: {run.root.name}", "", "| area | item | status | value | evidence |",
             "|---|---|---|---|---|"]
    for r in rows:
        cells = [r.area, r.item, f"**{r.status}**", r.value, f"`{r.evidence}`"]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    lines += ["", "![loss](loss.svg) ![step time](step_time.svg) ![memory](memory.svg)"]
    if run.problems:
        lines += ["", "## Notes", ""] + [f"- {p}" for p in run.problems]
    return "\n".join(lines) + "\n"


def make_report(rundir: str | os.PathLike, out: str | os.PathLike | None = None) -> dict:
    """Write report.html/.md/.json and the SVG plots into ``out`` (default RUNDIR/report)."""
    run = load_run(rundir)
    rows, diag = build_rows(run)
    svgs = plots(run)
    out = Path(out) if out else run.root / "report"
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    except OSError as e:
        raise DiagnosticsError(f"{out}: cannot write the report there ({e.strerror}); pass --out DIR") from None
    try:
        (tmp / "report.html").write_text(render_html(run, rows, svgs), encoding="utf-8")
        (tmp / "report.md").write_text(render_md(run, rows), encoding="utf-8")
        for name, svg in svgs.items():
            (tmp / name).write_text(svg, encoding="utf-8")
        data = {"rundir": str(run.root), "rows": [dataclasses.asdict(r) for r in rows], "notes": run.problems,
                "steps": len(run.steps), "first_failing_rank": diag.get("first_failing_rank") if diag else None}
        (tmp / "report.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "rows": [dataclasses.asdict(r) for r in rows], "notes": run.problems}


def render_text(res: dict) -> str:
    lines = [f"{'area':<14} {'item':<38} {'status':<8} value"]
    for r in res["rows"]:
        lines.append(f"{r['area']:<14} {r['item']:<38} {r['status']:<8} {r['value'][:110]}")
    lines.append("")
    lines.append(f"wrote {res['out']}/report.html, report.md, report.json, loss.svg, step_time.svg, memory.svg")
    for n in res["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)
