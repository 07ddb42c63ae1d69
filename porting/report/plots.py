"""Inline SVG plots of a run (loss, with the baseline's on the same axes when there is one; step time
with compile steps marked; memory by phase): plain strings, no scripts, no network; every text taken
from the run is escaped."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from porting.report.rows import PHASE_ORDER
from porting.rundir import RunRecords, finite
from porting.train.plan.make import TrainPlan

if TYPE_CHECKING:
    from porting.baseline.document import Baseline


COLOURS = ("#1f77b4", "#ff7f0e")   # this run, the baseline


def svg_line(title: str, xs: list[float], ys: list[float], *, ylabel: str, marks: list[int] | None = None,
             w: int = 560, h: int = 260) -> str:
    return svg_lines(title, [("", xs, ys)], ylabel=ylabel, marks=marks, w=w, h=h)


def svg_lines(title: str, series: list[tuple[str, list[float], list[float]]], *, ylabel: str,
              marks: list[int] | None = None, w: int = 560, h: int = 260) -> str:
    """One polyline per (label, xs, ys) on shared axes, a legend when there are labels; ``marks``: indices
    of the first series' points to mark (compile steps)."""
    pad_l, pad_r, pad_t, pad_b = 60, 16, 28, 40
    lines = [(label, [(x, y) for x, y in zip(xs, ys) if finite(x) and finite(y)]) for label, xs, ys in series]
    everything = [p for _, pts in lines for p in pts]
    pts = lines[0][1] if lines else []
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'role="img" aria-label="{html.escape(title)}"><rect width="{w}" height="{h}" fill="white"/>'
            f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14" font-family="sans-serif">'
            f'{html.escape(title)}</text>')
    if not everything:
        return head + f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle" font-size="12">no data</text></svg>'
    x0, x1 = min(p[0] for p in everything), max(p[0] for p in everything)
    y0, y1 = min(p[1] for p in everything), max(p[1] for p in everything)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + (abs(y0) * 0.1 or 1.0)
    sx = lambda x: pad_l + (x - x0) / (x1 - x0) * (w - pad_l - pad_r)  # noqa: E731
    sy = lambda y: h - pad_b - (y - y0) / (y1 - y0) * (h - pad_t - pad_b)  # noqa: E731
    body = [f'<line x1="{pad_l}" y1="{h - pad_b}" x2="{w - pad_r}" y2="{h - pad_b}" stroke="#444"/>',
            f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{h - pad_b}" stroke="#444"/>']
    for k, (label, line) in enumerate(lines):
        colour = COLOURS[k % len(COLOURS)]
        poly = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
        dash = ' stroke-dasharray="5 3"' if k else ""
        body.append(f'<polyline class="series" data-label="{html.escape(label)}" fill="none" stroke="{colour}" '
                    f'stroke-width="1.6"{dash} points="{poly}"/>')
        if label:
            ly = pad_t + 6 + 14 * k
            body.append(f'<line x1="{w - pad_r - 150}" y1="{ly}" x2="{w - pad_r - 130}" y2="{ly}" stroke="{colour}" '
                        f'stroke-width="2"{dash}/><text x="{w - pad_r - 126}" y="{ly + 4}" font-size="11">'
                        f'{html.escape(label)}</text>')
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
    items = [(k, v) for k, v in items if finite(v)]
    if not items:
        return head + f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle" font-size="12">no data</text></svg>'
    top = max([v for _, v in items] + ([limit] if finite(limit) else [])) or 1.0
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
    if finite(limit):
        lx = pad_l + limit / top * (w - pad_l - pad_r)
        body.append(f'<line x1="{lx:.1f}" y1="{pad_t}" x2="{lx:.1f}" y2="{h - pad_b}" stroke="#d62728" '
                    f'stroke-dasharray="4 3"/><text x="{lx:.1f}" y="{pad_t - 2}" font-size="10" '
                    f'text-anchor="middle" fill="#d62728">HBM {limit:.0f}</text>')
    return head + "".join(body) + "</svg>"


def loss_series(run: RunRecords, baseline: Baseline | None) -> list[tuple[str, list[float], list[float]]]:
    """The run's loss per step (metrics.jsonl) and, with a baseline document, the baseline's (its
    ``steps.step`` / ``steps.loss`` arrays), labelled for the legend."""
    mine = ("this run (port train)", [r.step for r in run.steps], [r.loss for r in run.steps])
    if baseline is None:
        return [("", mine[1], mine[2])]
    steps = baseline.steps
    return [mine, (f"baseline (PyTorch, {baseline.device_kind or '?'})", list(steps.step), list(steps.loss))]


def plots(run: RunRecords, baseline: Baseline | None = None, plan: TrainPlan | None = None) -> dict[str, str]:
    """The three plots of the report, by file name; ``baseline``: a loaded `port baseline` document; ``plan``: the
    run's plan (porting/report/rows.py ``read_plan``)."""
    xs = [r.step for r in run.steps]
    comp_idx = [i for i, r in enumerate(run.steps) if r.compile]
    mem = plan.memory_gib_by_phase if plan is not None else None
    bars = [(k, mem.term(k)) for k in PHASE_ORDER if finite(mem.term(k))] if mem is not None else []
    if mem is not None and finite(mem.total):
        bars.append(("total", mem.total))
    for key in ("device_peak_gib", "host_rss_gib"):
        vals = [getattr(r, key) for r in run.steps if finite(getattr(r, key))]
        if vals:
            bars.append((f"measured {key.replace('_gib', '')}", max(vals)))
    hbm = plan.device_hbm_gib if plan is not None else None
    return {
        "loss.svg": svg_lines("Loss" if baseline is None else "Loss: this run and the baseline",
                              loss_series(run, baseline), ylabel="loss"),
        "step_time.svg": svg_line("Step time (red: compile steps)", xs, [r.step_time_s for r in run.steps],
                                  ylabel="seconds", marks=comp_idx),
        "memory.svg": svg_bars("Memory by phase (GiB per device)", bars, unit="GiB",
                               limit=hbm if finite(hbm) else None),
    }
