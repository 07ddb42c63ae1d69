"""Merging scanned files into ranks, and correcting clock skew between hosts.

A rank's files (msrun worker log, plogs of the same pid, `port train` rank log) become one
:class:`RankView`. Hosts' clocks differ; in synchronous data parallel every rank finishes a step
together, so the median difference of step times between a rank and the reference rank is its
clock offset.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Iterable

from porting.diagnostics.causes import pick_cause
from porting.diagnostics.grammar import Event
from porting.diagnostics.scan import FileScan

SKEW_MIN_S = 2.0         # offsets below this are clock noise, not skew


@dataclasses.dataclass
class RankView:
    rank: int | str
    files: list[str]
    lines: int
    first_ts: float | None
    last_ts: float | None
    last_step: int | None
    last_step_ts: float | None
    last_collective: str | None
    last_collective_ts: float | None
    first_error: Event | None
    first_cause: Event | None
    first_consequence: Event | None
    error_lines: int
    offset: float = 0.0
    status: str = ""
    events: list[Event] = dataclasses.field(default_factory=list)   # every kept event, in time order
    rank_by_name: bool = False   # the rank comes from a file name (worker_<r>.log), not from a line's text
    unclassified: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)  # (file, line, text), tail.py
    save_part: tuple[int, str, float | None] | None = None   # `port train`: its last save part (step, part, time)



def _process_dir(path: str) -> str:
    """The directory a process's plogs share: CANN writes ``<log>/run/plog`` and ``<log>/debug/plog``
    side by side, so both count as ``<log>``."""
    d = os.path.dirname(path)
    parent, leaf = os.path.split(d)
    if leaf == "plog" and os.path.basename(parent) in ("run", "debug"):
        return os.path.dirname(parent)
    return d


def ranks_from_pids(scans: list[FileScan]) -> None:
    """A process's debug plog rarely names its rank; its run plog (same pid) often does."""
    by_pid: dict[tuple[str, int], int] = {}
    for sc in scans:
        if sc.rank is not None and sc.pid is not None:
            by_pid.setdefault((_process_dir(sc.path), sc.pid), sc.rank)
    for sc in scans:
        if sc.rank is None and sc.pid is not None and sc.kind != "msrun_scheduler":
            sc.rank = by_pid.get((_process_dir(sc.path), sc.pid))


def rank_key(scan: FileScan) -> int | str:
    if scan.rank is not None:
        return scan.rank
    return f"file:{scan.path}"


def merge_ranks(scans: Iterable[FileScan]) -> dict[int | str, RankView]:
    groups: dict[int | str, list[FileScan]] = {}
    for sc in scans:
        if sc.problem or sc.kind == "msrun_scheduler":
            continue
        groups.setdefault(rank_key(sc), []).append(sc)
    views: dict[int | str, RankView] = {}
    for key, items in groups.items():
        events = sorted((e for sc in items for e in sc.events),
                        key=lambda e: (e.ts is None, e.ts or 0.0, e.source, e.line))
        steps = [sc for sc in items if sc.last_step is not None]
        best_step = max(steps, key=lambda sc: (sc.last_step, sc.last_step_ts or 0.0)) if steps else None
        colls = [sc for sc in items if sc.last_collective]
        best_coll = max(colls, key=lambda sc: sc.last_collective_ts or 0.0) if colls else None
        firsts = [sc.first_ts for sc in items if sc.first_ts is not None]
        lasts = [sc.last_ts for sc in items if sc.last_ts is not None]
        views[key] = RankView(
            rank=key, files=sorted(sc.path for sc in items), lines=sum(sc.lines for sc in items),
            first_ts=min(firsts) if firsts else None, last_ts=max(lasts) if lasts else None,
            last_step=best_step.last_step if best_step else None,
            last_step_ts=best_step.last_step_ts if best_step else None,
            last_collective=best_coll.last_collective if best_coll else None,
            last_collective_ts=best_coll.last_collective_ts if best_coll else None,
            first_error=events[0] if events else None,
            first_cause=pick_cause(events),
            first_consequence=next((e for e in events if e.role == "consequence"), None),
            error_lines=sum(sc.error_lines for sc in items), events=events,
            rank_by_name=any(sc.rank_from_name for sc in items),
            unclassified=[(sc.path, ln, text) for sc in items for ln, text in sc.unclassified][:8],
            save_part=next((sc.save_part for sc in items if sc.save_part is not None), None))
    return views


def clock_offsets(scans: Iterable[FileScan]) -> dict[int | str, float]:
    """Per-rank clock offset (seconds ahead of the reference rank), from steps that every rank
    finishes together in synchronous data parallel. Offsets under SKEW_MIN_S are reported as 0."""
    per_rank: dict[int | str, dict[int, float]] = {}
    for sc in scans:
        if sc.problem or not sc.step_samples:
            continue
        per_rank.setdefault(rank_key(sc), {}).update(dict(sc.step_samples))
    if len(per_rank) < 2:
        return {}
    ref_key = min(per_rank, key=lambda k: (isinstance(k, str), str(k) if isinstance(k, str) else k))
    ref = per_rank[ref_key]
    offsets: dict[int | str, float] = {}
    for key, steps in per_rank.items():
        common = [steps[s] - ref[s] for s in steps.keys() & ref.keys()]
        if len(common) < 2:
            continue
        off = statistics.median(common)
        if abs(off) >= SKEW_MIN_S:
            offsets[key] = off
    return offsets


def corrected(ts: float | None, off: float) -> float | None:
    return None if ts is None else ts - off


def sort_key(key: int | str) -> tuple[int, int | str]:
    return (0, key) if isinstance(key, int) else (1, key)



def add_missing_ranks(views: dict[int | str, RankView], world_size: int | None, warnings: list[str]) -> None:
    seen = sorted(k for k in views if isinstance(k, int))
    if world_size is not None:
        extra = [r for r in seen if r >= world_size]
        if extra:
            warnings.append(f"logs name rank(s) {extra[:8]} outside --world-size {world_size}")
        missing = [r for r in range(world_size) if r not in views]
        for r in missing:
            views[r] = RankView(r, [], 0, None, None, None, None, None, None, None, None, None, 0)
        if missing:
            warnings.append(f"no log for rank(s) {missing[:16]} of world size {world_size}")
    elif len(seen) >= 2:
        gaps = sorted(set(range(seen[-1] + 1)) - set(seen))
        if gaps:
            warnings.append(f"no log for rank(s) {gaps[:16]} (ranks 0..{seen[-1]} expected; pass --world-size)")

