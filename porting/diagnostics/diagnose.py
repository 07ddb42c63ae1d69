"""`port diagnose LOGDIR`: find the first rank that stopped progressing in a failed or hung job.

The pipeline, one module per job: ``grammar`` (what a line means), ``scan`` (files, once each, in
bounded chunks, by a process pool), ``ranks`` (files merged into ranks, clock skew corrected),
``verdict`` (cause versus consequence) and ``render`` (text and JSON). This module runs them and
assembles the result that ``--json`` prints.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path

from porting.diagnostics import DiagnosticsError
from porting.diagnostics.grammar import Event, error_table, fmt_ts
from porting.diagnostics.ranks import (RankView, add_missing_ranks, clock_offsets, corrected, merge_ranks,
                                       rank_key, ranks_from_pids, sort_key)
from porting.diagnostics.scan import FileScan
from porting.diagnostics.walk import scan_dir
from porting.diagnostics.evidence import EvidenceContext
from porting.diagnostics.verdict import Scheduler, Verdict, decide, rank_status

MAX_TIMELINE = 40


def _warnings(scans: list[FileScan], walk_problems: list[str]) -> list[str]:
    readable = [sc for sc in scans if not sc.problem]
    warnings = list(walk_problems)
    warnings += [f"{sc.path}: {sc.problem}" for sc in scans if sc.problem and sc.problem != "empty file"]
    warnings += [f"{sc.path}: {sc.note}" for sc in readable if sc.note][:20]
    warnings += [f"{sc.path}: last line has no newline (file truncated or still being written)"
                 for sc in readable if sc.truncated][:20]
    warnings += [f"{sc.path}: NUL bytes removed" for sc in readable if sc.replaced_bytes][:20]
    return warnings


def _explain_codes(readable: list[FileScan]) -> list[dict]:
    codes: Counter = Counter()
    code_ranks: dict[str, set] = {}
    for sc in readable:
        for c, n in sc.codes.items():
            codes[c] += n
            code_ranks.setdefault(c, set()).add(rank_key(sc))
    table = error_table()
    explained = []
    for c, n in codes.most_common():
        entry = table["codes"].get(c)
        if entry is None and c.startswith("ERR"):
            entry = {"meaning": f"torch_npu {table['torch_npu']['submodules'].get(c[3:5], 'UNKNOWN')}: "
                                f"{table['torch_npu']['codes'].get(c[5:], 'unknown')}",
                     "next_step": "read the message on the same line; ERR<submodule><code> is torch_npu's error id"}
        explained.append({"code": c, "count": n, "meaning": (entry or {}).get("meaning", "not in the table"),
                          "next_step": (entry or {}).get("next_step", ""),
                          "ranks": sorted(code_ranks[c], key=sort_key)[:16]})
    return explained


def _rank_rows(views: dict[int | str, RankView], verdict: Verdict) -> list[dict]:
    rows = []
    for v in sorted(views.values(), key=lambda v: sort_key(v.rank)):
        status = rank_status(v, verdict.first_failing_rank)
        fe = v.first_cause if status != "timed out (consequence)" else None
        fe = fe or v.first_error
        rows.append({
            "rank": v.rank, "files": v.files[:8], "lines": v.lines, "status": status,
            "last_step": v.last_step, "last_step_time": fmt_ts(corrected(v.last_step_ts, v.offset)),
            "last_collective": v.last_collective,
            "last_collective_time": fmt_ts(corrected(v.last_collective_ts, v.offset)),
            "last_output_time": fmt_ts(corrected(v.last_ts, v.offset)),
            "first_error": fe.as_dict(v.offset) if fe else None,
            "error_lines": v.error_lines, "clock_offset_s": round(v.offset, 3)})
    return rows


def _timeline(views: dict[int | str, RankView]) -> list[dict]:
    """The first error, consequence and cause of every rank, clock-corrected, in time order."""
    events: list[tuple[float | None, int | str, Event]] = sorted(
        ((corrected(e.ts, views[k].offset), k, e) for k in views
         for e in [views[k].first_error, views[k].first_consequence, views[k].first_cause] if e),
        key=lambda x: (x[0] is None, x[0] or 0.0))
    seen = set()
    out = []
    for t, k, e in events:
        ident = (k, e.source, e.line)
        if ident in seen:
            continue
        seen.add(ident)
        out.append({"time": fmt_ts(t), "rank": k, "kind": e.kind, "role": e.role, "text": e.text[:240],
                    "where": f"{e.source}:{e.line}"})
        if len(out) >= MAX_TIMELINE:
            break
    return out


MAX_ENTITIES = 512


def _entities(views: dict[int | str, RankView]) -> list[dict]:
    """Every entity the kept events name (rank, peer, device, chip, PID, NIC address, host), with the file
    and line it came from, once each."""
    out, seen = [], set()
    for k in sorted(views, key=sort_key):
        for e in views[k].events:
            for x in e.entities:
                key = (x["type"], x["id"], e.source, x["line"])
                if key not in seen and len(out) < MAX_ENTITIES:
                    seen.add(key)
                    out.append({"type": x["type"], "id": x["id"], "source": e.source, "line": x["line"], "rank": k})
    return out


def _apply_offsets(readable: list[FileScan], views: dict[int | str, RankView], warnings: list[str]) -> None:
    for key, off in clock_offsets(readable).items():
        if key in views:
            views[key].offset = off
            warnings.append(f"rank {key}: clock differs by {off:+.1f} s from the reference rank "
                            f"(estimated from steps finished together); times corrected")


def _table_context(rank_table: str | os.PathLike | None
                   ) -> tuple[dict[str, int], tuple[tuple[int, ...], ...], dict[str, str]]:
    """The rank table's address -> rank map, each server's rank ids (server_list order), and device IP -> the
    server it is on (its host_ip, else its server_id): which host a link line's remote address is."""
    if rank_table is None:
        return {}, (), {}
    from porting.cluster import ranktable

    table = ranktable.parse(ranktable.load(rank_table))
    hosts = {d.device_ip: str(s.host_ip or s.server_id) for s in table.server_list for d in s.device if d.device_ip}
    return (table.rank_of_ip(), tuple(tuple(sorted(d.rank_id for d in s.device)) for s in table.server_list),
            hosts)


def _group_members(scans: list[FileScan]) -> dict[tuple[str, int], tuple[int, str]]:
    """(group, rank in it) -> (global rank, file that says so), from processes whose global rank is known."""
    out: dict[tuple[str, int], tuple[int, str]] = {}
    for sc in scans:
        if isinstance(sc.rank, int):
            for group, grank, _size in sc.comm_inits:
                out.setdefault((group, grank), (sc.rank, sc.path))
    return out


def explain_failure(log_dir: Path, workers: int) -> str:
    """One line on why an msrun run of ``workers`` failed (the preflight's smoke all-reduce): the first
    failing rank and its reason, or why its logs could not be read."""
    try:
        d = diagnose(log_dir, jobs=1, world_size=workers)
    except DiagnosticsError as e:
        return str(e)
    return f"rank {d['first_failing_rank']}: {d['reason'][:200]}"


KIND_CLASS = {"oom": "memory", "device_error": "device_fault", "operator_error": "operator_error", "config": "config",
              "crash": "process_exit", "worker_exit": "process_exit", "comm_init": "comm_init",
              "exception": None, "lost": "process_exit", "numerical": "numerical"}


def finish(v: Verdict) -> Verdict:
    """Every verdict names its suspect entity and cause class (those decided from ranks alone: the rank)."""
    suspect, cls = v.suspect, v.cause_class
    r = v.first_failing_rank
    if suspect is None and r is not None:
        suspect = ({"entity": "rank", "id": r, "text": f"rank {r}", "via": "rank"} if isinstance(r, int) else
                   {"entity": "peer", "id": r[5:], "text": r, "via": "peer"} if str(r).startswith("peer ") else
                   {"entity": "file", "id": str(r)[5:], "text": "file", "via": "file"})
    if cls is None and v.evidence:
        cls = v.evidence[0].get("cause")
    if cls is None:
        cls = KIND_CLASS.get(v.reason_kind)
    fault = v.fault or ("waiter" if cls == "collective_timeout" else None)
    return dataclasses.replace(v, suspect=suspect, cause_class=cls, fault=fault)


def outside_job(v: Verdict, world: int | None) -> Verdict:
    """A verdict whose rank the job does not have (rank 7 of a 2-rank job: another job's log pasted in, a rank
    numbered within a group, a damaged number) is never high: it says so, and what to collect."""
    r = v.first_failing_rank
    if not isinstance(r, int) or world is None or r < world:
        return v
    note = (f"rank {r} is outside the job ({world} rank(s): 0..{world - 1}); the text names a rank this job does not "
            f"have (another job's log, a rank numbered within a communication group, a damaged number)")
    return dataclasses.replace(v, confidence="low", reason=f"{v.reason}; {note}", why=f"{v.why}; not high: {note}",
                               collect_next=tuple(v.collect_next) + (f"the logs of this job's ranks 0..{world - 1}, "
                                                                     f"and which job rank {r} belongs to",))


def _world(readable: list[FileScan], views: dict[int | str, RankView], given: int | None) -> int | None:
    """The job's size: --world-size, else what its own logs say (`port train`'s "rank R of W", HCCL's rankSize of
    the world group)."""
    if given is not None:
        return given
    said = [sc.world for sc in readable if sc.world] + [e.facts["rank_size"] for v in views.values() for e in v.events
                                                         if e.facts.get("rank_size") and not e.facts.get("group")]
    return max(said) if said else None


def diagnose(logdir: str | os.PathLike, jobs: int | None = None, world_size: int | None = None,
             rank_table: str | os.PathLike | None = None) -> dict:
    """Diagnose a job's logs; the returned dict is what ``--json`` prints. With ``world_size``,
    ranks without any log count as silent (no output); with ``rank_table``, peer addresses in
    socket timeouts are mapped to ranks."""
    logdir = Path(logdir)
    rank_of_ip, server_ranks, host_of_ip = _table_context(rank_table)
    scans, walk_problems = scan_dir(logdir, jobs)
    readable = [sc for sc in scans if not sc.problem]
    warnings = _warnings(scans, walk_problems)
    if not readable:
        raise DiagnosticsError(f"{logdir}: none of the {len(scans)} log file(s) could be read "
                               f"({'; '.join(warnings[:3]) or 'all empty'}); check permissions and that "
                               f"these are text logs")
    ranks_from_pids(readable)
    context = EvidenceContext(world_size, rank_of_ip, server_ranks, _group_members(readable), host_of_ip)
    views = merge_ranks(readable)
    add_missing_ranks(views, world_size, warnings)
    _apply_offsets(readable, views, warnings)
    sched_scans = [sc for sc in readable if sc.kind == "msrun_scheduler"]
    sched = Scheduler(tuple(r for sc in sched_scans for r in sc.sched_timed_out),
                      next((sc.sched_first for sc in sched_scans if sc.sched_first is not None), None))
    verdict = outside_job(finish(decide(views, sched, context)), _world(readable, views, world_size))
    return {
        "format": "port-diagnose", "logdir": str(logdir), "files": len(scans), "files_read": len(readable),
        "formats": dict(Counter(sc.kind for sc in readable)), "ranks_seen": len(views),
        **verdict.as_dict(),
        "scheduler": {"timed_out_ranks": sorted(set(sched.timed_out)), "first_timed_out": sched.first}
        if sched_scans else None,
        "ranks": _rank_rows(views, verdict), "error_codes": _explain_codes(readable),
        "timeline": _timeline(views), "entities": _entities(views), "warnings": warnings,
    }
