"""The report's step-breakdown rows: each rank's compute / exposed communication / host / idle on the sampled
steps (``RUN/breakdown/``, written with ``logging.breakdown_every``; porting/rundir/breakdown.py defines the
parts), the slowest rank named, and the two shares gated against MindSpeed-LLM's reference ranges.

The gates, from MindSpeed-LLM's FSDP2 performance guide (docs/en/pytorch/tuning/
fsdp2_backend_performance_optimization.md, table "Items to Watch in Time Analysis",
https://gitcode.com/Ascend/MindSpeed-LLM/blob/master/docs/en/pytorch/tuning/fsdp2_backend_performance_optimization.md):
unhidden (exposed) communication has the reference range "<= 10%" of the step ("pay attention when > 20%"),
and Free time, "the period during which the device executes neither computation nor communication",
"should be less than 3%". Above the reference a row warns; it never fails the run, which trained correctly.
"""

from __future__ import annotations

import statistics

from porting.report.rows import INFO, MISSING, PASS, WARN, Row
from porting.rundir import RunRecords
from porting.rundir import breakdown as bd

EXPOSED_COMM_MAX = 0.10      # MindSpeed-LLM: unhidden communication, reference "<= 10%"
EXPOSED_COMM_ATTENTION = 0.20
FREE_MAX = 0.03              # MindSpeed-LLM: Free "should be less than 3%"
SOURCE = "MindSpeed-LLM docs/en/pytorch/tuning/fsdp2_backend_performance_optimization.md"
EVIDENCE = "breakdown/rank_<r>.jsonl"


def _mean(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def per_rank(records: dict[int, list[bd.Breakdown]]) -> dict[int, dict[str, float | None]]:
    """Each rank's mean over the steps sampled on every rank: wall, compute, comm, wait, host, idle (s)."""
    steps = set.intersection(*(set(r.step for r in recs) for recs in records.values())) if records else set()
    by_step = {s: {rank: next(r for r in recs if r.step == s) for rank, recs in records.items()} for s in steps}
    wait = {s: bd.waits(recs) for s, recs in by_step.items()}
    out = {}
    for rank, recs in sorted(records.items()):
        mine = [r for r in recs if r.step in steps] or recs
        out[rank] = {"steps": len(mine), "source": mine[0].source,
                     **{k: _mean([getattr(r, k) for r in mine]) for k in ("wall_s", "compute_s", "comm_s", "host_s",
                                                                          "idle_s")},
                     "wait_s": _mean([wait[r.step].get(rank) for r in mine if r.step in wait])}
    return out


def _pct(x: float | None, wall: float) -> str:
    return "-" if x is None else f"{x:.4f} s ({x / wall:.1%})"


def breakdown_rows(run: RunRecords) -> list[Row]:
    """One row per rank, the slowest rank, and the two gates; a missing-evidence row when nothing was sampled."""
    records = bd.read(run.path, run.notes)
    if not records:
        return [Row("performance", "step breakdown per rank", MISSING, "no sampled steps in breakdown/",
                    "port train with logging.breakdown_every: N (e.g. --set logging.breakdown_every=5)")]
    ranks = per_rank(records)
    rows = []
    for rank, m in ranks.items():
        wall = m["wall_s"] or 1e-12
        wait = f", of which waiting for other ranks {m['wait_s']:.4f} s" if m["wait_s"] is not None else ""
        comm = "not split (timestamps only)" if m["comm_s"] is None else _pct(m["comm_s"], wall) + wait
        rows.append(Row("performance", f"step breakdown rank {rank}", INFO,
                        f"step {wall:.4f} s = compute {_pct(m['compute_s'], wall)} + exposed communication {comm} + "
                        f"host {_pct(m['host_s'], wall)} + idle {_pct(m['idle_s'], wall)}; mean of {m['steps']} "
                        f"sampled step(s), {m['source']}", EVIDENCE.replace("<r>", str(rank))))
    # the slowest rank: the most time of its own (its step less what it waited for the others)
    own = {r: (m["wall_s"] or 0.0) - (m["wait_s"] or 0.0) for r, m in ranks.items()}
    slow = max(own, key=own.get)
    if len(ranks) > 1:
        rows.append(Row("performance", "slowest rank", INFO,
                        f"rank {slow}: {own[slow]:.4f} s of its own per step (the others wait for it); fastest "
                        f"{min(own.values()):.4f} s", EVIDENCE))
    m = ranks[slow]
    wall = m["wall_s"] or 1e-12
    if m["comm_s"] is not None:
        share = max(mm["comm_s"] / (mm["wall_s"] or 1e-12) for mm in ranks.values())
        status = PASS if share <= EXPOSED_COMM_MAX else WARN
        note = " (above the 20% where the guide says to look)" if share > EXPOSED_COMM_ATTENTION else ""
        rows.append(Row("performance", "exposed communication share", status,
                        f"{share:.1%} of the step on the worst rank, reference <= {EXPOSED_COMM_MAX:.0%}{note} "
                        f"[{SOURCE}]", EVIDENCE))
    if m["idle_s"] is not None:
        free = max((mm["host_s"] + mm["idle_s"]) / (mm["wall_s"] or 1e-12) for mm in ranks.values())
        rows.append(Row("performance", "device free share (host + idle)", PASS if free < FREE_MAX else WARN,
                        f"{free:.1%} of the step with no kernel running on the worst rank, reference < "
                        f"{FREE_MAX:.0%} [{SOURCE}]", EVIDENCE))
    return rows
