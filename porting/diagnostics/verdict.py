"""The verdict of `port diagnose`: which rank stopped progressing first, its last step, and why.

Deciding cause from consequence follows the HCCL fault-diagnosis guide: a rank whose first error is
a collective timeout waited for someone else (consequence); a rank that raised, ran out of memory or
hit a device error is a cause; when no rank has a cause, the ranks that fell silent without a
timeout of their own (or, when all timed out, the one whose timeout came last) stalled first. The
scheduler's list of timed-out nodes names consequences, not necessarily the stalled rank.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

from porting.diagnostics.causes import WINDOW_S, class_role, codes_in
from porting.diagnostics.grammar import Event, fmt_ts
from porting.diagnostics.evidence import EvidenceContext, from_field_evidence, global_from_local
from porting.diagnostics.heartbeat import from_heartbeat
from porting.diagnostics.ownrun import frozen_saver, scheduler_lost
from porting.diagnostics.outcome import Scheduler, Verdict
from porting.diagnostics.ranks import RankView, corrected, sort_key
from porting.diagnostics.suspect import describe, earned, entity_of

HCCL_CALL_RE = re.compile(r"\bHccl[A-Z]\w+, error code is|HCCL function error")
CAUSE_KINDS = {"oom": "oom", "exception": "exception", "crash": "crash", "device": "device_error",
               "config": "config", "operator": "operator_error", "worker_exit": "worker_exit",
               "comm_init": "comm_init", "numerical": "numerical"}


def _cause_ranks(ranks: list[RankView]) -> list[RankView]:
    """Ranks with a cause-type event that is not preceded by a collective timeout on the same rank."""
    causes = []
    for v in ranks:
        c, q = v.first_cause, v.first_consequence
        if c is None:
            continue
        ct, qt = corrected(c.ts, v.offset), corrected(q.ts, v.offset) if q else None
        if q is not None and c.kind == "error":
            continue  # a generic error line on a rank that also timed out is part of the timeout report
        if q is not None and c.kind == "exception" and HCCL_CALL_RE.search(c.text):
            continue  # torch_npu raises when its HCCL call fails: the rank's own timeout report says why
        if q is not None and qt is not None and ct is not None and qt < ct - 1.0:
            continue  # this rank first timed out waiting; its later error is fallout
        causes.append(v)
    return causes


def _earliest_caused(real: list[RankView]) -> RankView:
    """The rank whose cause event is the most causal of the first incident window, the earliest of those
    (clock-corrected; cause_model.yaml ranks the classes, causes.WINDOW_S bounds the window)."""
    times = [t for v in real if (t := corrected(v.first_cause.ts, v.offset)) is not None]
    t0 = min(times) if times else None

    def key(v: RankView):
        t = corrected(v.first_cause.ts, v.offset)
        return (v.first_cause.tier, t is None, t or 0.0, sort_key(v.rank))
    pool = [v for v in real if (t := corrected(v.first_cause.ts, v.offset)) is None or t0 is None
            or t - t0 <= WINDOW_S]
    return min(pool, key=key)


def _competitors(real: list[RankView], first: RankView) -> list[tuple[RankView, Event]]:
    """Other cause events of the same class tier: other ranks' causes, and this view's other ones."""
    e = first.first_cause
    out = [(v, v.first_cause) for v in real if v is not first and v.first_cause.tier == e.tier]
    t0 = e.ts
    out += [(first, x) for x in first.events if x is not e and x.role == "cause" and x.tier == e.tier
            and (x.ts is None or t0 is None or abs(x.ts - t0) <= WINDOW_S)]
    return out


SPECIFIC = {"file": 0, "host": 1, "device": 2, "rank": 3}


def _sharpest(view: RankView, e: Event, competitors: list[tuple[RankView, Event]]) -> dict:
    """The event's suspect, or a sharper one named by another report of the same fault in the same window (CANN
    prints one failure as several lines: the headline may name no device while the next line says device_id=2,
    or name the chip while another line names the logical device)."""
    s = entity_of(view, e)
    chip_only = s["entity"] == "device" and "chip" in s and s.get("chip") == s["id"]
    for v2, x in competitors:
        if v2 is not view or x.cause != e.cause or (x.fault or e.fault) and x.fault != e.fault:
            continue
        s2 = entity_of(v2, x)
        if SPECIFIC.get(s2["entity"], 0) > SPECIFIC.get(s["entity"], 0) or (
                chip_only and s2["entity"] == "device" and s2.get("chip") != s2["id"]):
            return dict(s2, **{k: s[k] for k in ("chip", "die") if k in s and k not in s2}, via=s2["via"] + " (same fault)")
    return s


def _from_causes(causes: list[RankView], ctx: EvidenceContext = EvidenceContext()) -> Verdict:
    real = [v for v in causes if v.first_cause.kind != "error"] or causes
    first = _earliest_caused(real)
    e = first.first_cause
    kind = CAUSE_KINDS.get(e.kind, "error")
    s = _sharpest(first, e, _competitors(real, first))
    reason = f"{kind}: {e.text} ({e.source}:{e.line})" + _numbers(e, first)
    if e.facts.get("cause_text"):
        reason += f"; its block says: {e.facts['cause_text']}"
    if s.get("op") and str(s["op"]).lower() not in reason.lower():
        reason += f"; the operator: {s['op']}"
    if e.code:
        reason += f" [{e.code}: {e.label}]"
    if e.fix:
        reason += f"; fix: {e.fix}"
    rootf = next((x.facts for x in first.events if "root_cause_rank" in x.facts), None)
    root = rootf["root_cause_rank"] if rootf else None
    rank = root if root is not None else (s["id"] if s["entity"] == "rank" else
                                          first.rank if isinstance(first.rank, int) else e.facts.get("reporter", first.rank))
    if root is not None:
        said, s = _root_cause(rootf)
        reason += f"; {said}"
    elif not isinstance(rank, int) and "local_rank" in e.facts:
        mapped, note = global_from_local(e.facts, ctx)
        rank = mapped if mapped is not None else rank
        reason += note
        if mapped is not None:
            s = {"entity": "rank", "id": mapped, "text": f"rank {mapped}", "via": "local rank"}
        else:   # the first failing local rank of the launch, named as such (its node is not in the log)
            s = {"entity": "local_rank", "id": e.facts["local_rank"], "text": f"local rank {e.facts['local_rank']}",
                 "via": "torchrun exit line"}
    if s["entity"] != "rank" or s["id"] != first.rank:
        reason += f"; suspect: {describe(s)}"
    sure, short, collect = ("high", "", ()) if root is not None else earned(first, e, s, _competitors(real, first))
    signal = s.get("signal") if root is not None else None
    if signal:   # a launcher's signal says how the root cause's process ended, not why
        sure, short = "medium", f"a signal ({signal}) says how rank {root}'s process ended, not why"
        collect = (f"rank {root}'s own stderr just before the signal (the assert or exception that called abort), its "
                   f"core dump, `dmesg` on {s.get('host', 'its host')}",)
    label = e.label if e.label.startswith(("a ", "an ", "the ")) else f"'{e.label}'"
    why = (f"its most causal event in the first incident is {label} ({e.cause or kind}), which no collective "
           f"timeout of its own preceded" + (f"; {len(real) - 1} other rank(s) failed too" if len(real) > 1 else "")
           + (f"; not high: {short}" if short else ""))
    cause, fault = ("process_exit", "signal") if signal else (e.cause, e.fault or None)
    return Verdict(rank, first.last_step, reason, kind, (e.as_dict(first.offset),), sure, why, collect, s, cause, fault)


def _numbers(e: Event, v: RankView) -> str:
    """Where a numerical fault began, as the metric lines say it (tail.py's facts)."""
    f = e.facts
    if e.cause != "numerical" or "metric" not in f:
        return ""
    where = (f" at step {f['step']}" if f.get("step") is not None else "") + (
        f" on rank {v.rank}" if isinstance(v.rank, int) else "")
    if e.fault == "divergence":
        return f"; a divergence spike{where}: loss {f['value']} against a median of {f.get('median_before')} before it"
    lines = f.get("nonfinite_lines", 1)
    return f"; the first non-finite {f['metric']} ({f['value']}){where}, {lines} line(s) with a non-finite {f['metric']}"


def _root_cause(f: dict) -> tuple[str, dict]:
    """What torchrun's failure summary says of its root cause (first observed failure): the sentence, the suspect."""
    r = f["root_cause_rank"]
    s = {"entity": "rank", "id": r, "text": f"rank {r}", "via": "torchrun root cause",
         **{k: f[f"root_cause_{k}"] for k in ("host", "pid") if f"root_cause_{k}" in f}}
    code = f.get("root_cause_exitcode")
    if code is not None and code < 0 and code not in (-9, -15):
        s["signal"] = f.get("root_cause_signal") or f"signal {-code}"
    said = (f"torchrun's root cause (first observed failure) is rank {r}" + (f" on host {s['host']}" if "host" in s else "")
            + (f" (pid {s['pid']})" if "pid" in s else "") + (f": exitcode {code}" if code is not None else "")
            + (f", {s['signal']}" if "signal" in s else ""))
    return said, s


def _timeout_pool(ranks: list[RankView], timed_out: list[RankView], blames: Counter) -> tuple[list[RankView], str]:
    """The ranks the timeouts point at, and why."""
    silent = [v for v in ranks if v.first_error is None]
    if silent:
        # ranks without a timeout of their own stalled; the lowest progress among them first
        return silent, "stalled"
    if blames:
        return ([v for v in ranks if v.rank in blames] or timed_out), "named by the other ranks' collective timeouts"
    # every rank timed out: the late one entered the collective last, so its timeout came last
    late = max(timed_out, key=lambda v: corrected(v.first_consequence.ts, v.offset) or 0.0)
    return [late], "all ranks timed out; its timeout came last, so it reached the collective last"


def _scheduler_note(rank: int | str, sched: Scheduler) -> str:
    if not sched.timed_out:
        return ""
    if rank in sched.timed_out:
        return scheduler_lost(rank, sched)
    return (f"; msrun's scheduler named rank(s) {sorted(set(sched.timed_out))} as timed out"
            + (f" (worker {sched.first} 'first')" if sched.first is not None else "") + ": those are consequences")


def _single_waiter(v: RankView) -> Verdict:
    """One rank's log (or one pasted file) that only waited: the rank it waited for is elsewhere."""
    e = v.first_consequence
    s = entity_of(v, e)
    who = (f"rank {v.rank}" if isinstance(v.rank, int) else
           describe(s) + f" (logging to {v.files[0]})" if s["entity"] != "file" else f"the process logging to {v.files[0]}")
    # the wording: who waited, and that the culprit is elsewhere (the rank that did not arrive)
    reason = (f"waited: {s['text'] if s['entity'] != 'file' else who}; culprit not in this log: {who} timed out in a "
              f"collective ({e.label}) and names no peer; the rank that did not arrive is not in these logs: "
              f"{e.text[:160]}")
    if e.facts.get("cause_text"):
        reason += f"; its block says: {e.facts['cause_text'][:240]}"
    codes = codes_in([x.text + " " + x.facts.get("cause_text", "") for x in v.events])
    if codes:
        reason += f"; codes in this log: {', '.join(codes)}"
    if e.fix:
        reason += f"; fix: {e.fix}"
    return Verdict(v.rank, v.last_step, reason, "comm_timeout", (e.as_dict(v.offset),), "low",
                   "a timeout is a consequence; with only the waiting side's log the cause cannot be named",
                   ("the logs of the other ranks of the job (all worker_<rank>.log / every node's stderr)",
                    "each rank's CANN plog (~/ascend/log/debug/plog)",
                    "HCCL_ENTRY_LOG_ENABLE=1 on a rerun to log every collective's entry per rank"), s, e.cause)


def _from_timeouts(ranks: list[RankView], timed_out: list[RankView], sched: Scheduler) -> Verdict:
    blames = Counter(b for v in ranks if v.first_consequence for b in v.first_consequence.blames)
    if len(ranks) == 1 and not blames and not sched.timed_out:
        return _single_waiter(ranks[0])
    pool, why = _timeout_pool(ranks, timed_out, blames)
    first = min(pool, key=lambda v: (v.last_step if v.last_step is not None else -1, -blames.get(v.rank, 0),
                                     corrected(v.last_step_ts, v.offset) or corrected(v.last_ts, v.offset) or 0.0,
                                     sort_key(v.rank)))
    others = [v for v in timed_out if v is not first]
    ev = [first.first_consequence.as_dict(first.offset)] if first.first_consequence else []
    ev += [v.first_consequence.as_dict(v.offset) for v in others[:3]]
    collect = (f"rank {first.rank}'s full log and CANN plog (~/ascend/log/debug/plog)",
               "HCCL_ENTRY_LOG_ENABLE=1 on a rerun to log every collective's entry per rank")
    if why == "stalled" and not first.files:
        reason = (f"no output: no log for this rank (never started, or its node or logs were lost); "
                  f"{len(others)} other rank(s) timed out in a collective waiting for it")
        return Verdict(first.rank, None, reason, "no_output", tuple(ev), "medium",
                       "the other ranks timed out waiting and this rank left no log at all", collect)
    if why == "stalled":
        at = fmt_ts(corrected(first.last_ts, first.offset))
        step_txt = f"after step {first.last_step}" if first.last_step is not None else "before its first step"
        reason = (f"stalled: no progress {step_txt} and no error of its own (last output {at}); "
                  f"{len(others)} other rank(s) then timed out or were stopped waiting for it")
    else:
        reason = f"{why}: first timeout {first.first_consequence.text[:200]}"
    reason += _scheduler_note(first.rank, sched)
    sure = "medium" if why == "stalled" or blames else "low"
    # msrun's scheduler lost the silent rank's heartbeat: its process stopped, the others' timeouts waited for it
    lost = why == "stalled" and first.rank in sched.timed_out
    return Verdict(first.rank, first.last_step, reason, "stall" if why == "stalled" else "comm_timeout", tuple(ev),
                   sure, why + ("; msrun's scheduler lost its heartbeat" if lost else ""), collect,
                   cause_class="process_exit" if lost else None, fault="lost" if lost else None)


def _from_scheduler(views: dict[int | str, RankView], sched: Scheduler) -> Verdict:
    """Nobody logged an error, but the scheduler lost some nodes' heartbeats: a frozen or killed
    process (its heartbeat thread stops too), or a lost host."""
    pool = [views[r] for r in sorted(set(sched.timed_out)) if r in views]
    pick = sched.first if sched.first in views else (pool[0].rank if pool else sorted(set(sched.timed_out))[0])
    v = views.get(pick)
    step = v.last_step if v else None
    reason = (f"lost: msrun's scheduler declared rank {pick} timed out (no heartbeat: the process froze, "
              f"was killed, or its host was lost) and no rank logged an error of its own"
              + (f"; last progress step {step}" if step is not None else ""))
    return Verdict(pick, step, reason, "lost", (), "medium", "only msrun's scheduler saw it: its heartbeat stopped",
                   (f"rank {pick}'s host: `dmesg` (OOM killer), and a py-spy dump if the process still exists",),
                   cause_class="process_exit", fault="lost")


def _from_progress(ranks: list[RankView]) -> Verdict:
    """No errors anywhere: the rank with the lowest progress stopped first (if progress differs)."""
    with_steps = [v for v in ranks if v.last_step is not None]
    if with_steps and len({v.last_step for v in with_steps}) > 1:
        first = min(with_steps, key=lambda v: (v.last_step, sort_key(v.rank)))
        top = max(v.last_step for v in with_steps)
        return Verdict(first.rank, first.last_step,
                       f"no output: stopped after step {first.last_step} while others reached step {top}; "
                       f"no error logged (killed, hung outside collectives, or logs lost)", "no_output", (), "low",
                       "it has the lowest progress and nobody logged an error",
                       (f"rank {first.rank}'s host: `dmesg`, and its stderr if it was not in these logs",))
    odd = [(v, f, ln, text) for v in ranks for f, ln, text in v.unclassified]
    if odd:   # a failure the cause model has no class for: said as such, never "no failure found" over it
        v, f, ln, text = odd[0]
        rank = v.rank if isinstance(v.rank, int) else None
        where = f"rank {rank}" if rank is not None else f"the process logging to {f}"
        return Verdict(rank if rank is not None else f"file:{f}", v.last_step,
                       f"unclassified failure: {text} ({f}:{ln}); no class of the cause model matches this line"
                       + (f", and {len(odd) - 1} more line(s) like it" if len(odd) > 1 else ""), "unclassified", (),
                       "low", f"the text holds a failure line ({f}:{ln}) but no error the cause model knows",
                       (f"the lines around {f}:{ln} and the whole log of {where} (what failed before it)",
                        "the job's launcher output (exit codes, signals)"),
                       {"entity": "rank", "id": rank, "text": f"rank {rank}", "via": "unclassified line"}
                       if rank is not None else {"entity": "file", "id": f, "text": "file", "via": "unclassified line"})
    return Verdict(None, None, "no failure found: no error lines and every rank reached the same progress", "none",
                   (), "high", "no line of any file is an error, exception, abort or non-finite value, and every "
                   "rank reached the same step")


def decide(views: dict[int | str, RankView], sched: Scheduler = Scheduler(),
           context: EvidenceContext = EvidenceContext()) -> Verdict:
    """Name the first rank that stopped progressing, and why."""
    ranks = sorted(views.values(), key=lambda v: sort_key(v.rank))
    if not ranks:
        return Verdict(None, None, "no rank logs could be read", "no_output", (), "low")
    saver = frozen_saver(views, sched)   # port's own runs: a rank frozen inside a save (ownrun.py)
    if saver is not None:
        v, found = saver
        own = v.first_cause is not None and v.first_cause.kind != "error"
        return _settle(_from_causes([v], context) if own else found)   # its own error says why, when it has one
    crimer = from_heartbeat(views)   # HCCL's heartbeat names the culprit on every rank's log (heartbeat.py)
    causes = _cause_ranks(ranks)
    if causes:
        v = _from_causes(causes, context)
        if crimer is None or (v.suspect or {}).get("id") == crimer.first_failing_rank:
            return _settle(v)
        other = describe(v.suspect) if v.suspect else v.first_failing_rank
        return _settle(dataclasses.replace(crimer, why=crimer.why + f"; another log shows {v.cause_class or v.reason_kind} "
                                                                    f"on {other}, which the heartbeat does not name"))
    if crimer is not None:
        return _settle(crimer)
    timed_out = [v for v in ranks if v.first_consequence is not None]
    if timed_out:
        return _settle(from_field_evidence(views, context) or _from_timeouts(ranks, timed_out, sched))
    if sched.timed_out:
        return _settle(_from_scheduler(views, sched))
    return _settle(_from_progress(ranks))


INFERRED_KINDS = ("stall", "lost", "no_output")


def _settle(v: Verdict) -> Verdict:
    """The verdict's fault and role, and a confidence its role allows. A culprit is named only when a line says
    so (an error of its own, a crimer or located rank); timeouts alone say who waited, so a verdict built on
    them is never high: 'waiter' when they name at most whom they waited for, 'inferred' when a rank
    is named from the others' timeouts and its own silence."""
    ev = v.evidence[0] if v.evidence else {}
    if v.reason_kind == "none":
        return dataclasses.replace(v, role="none")
    if v.reason_kind == "unclassified":   # a line of that process says it failed; what, no class says
        return dataclasses.replace(v, role="culprit")
    role_of_class = class_role(v.cause_class) if v.cause_class else None
    if "located_rank" in ev.get("facts", {}) or (role_of_class or ev.get("role")) == "cause":
        return dataclasses.replace(v, fault=v.fault or ev.get("fault") or None, role="culprit")
    role = "inferred" if v.reason_kind in INFERRED_KINDS else "waiter"
    fault = v.fault or ev.get("fault") or ("waiter" if v.cause_class == "collective_timeout" else None)
    sure = "medium" if v.confidence == "high" else v.confidence
    why = v.why + ("; not high: only timeouts here, which say who waited" if v.confidence == "high" else "")
    return dataclasses.replace(v, fault=fault, role=role, confidence=sure, why=why)


def rank_status(v: RankView, verdict_rank: int | str | None) -> str:
    if v.rank == verdict_rank:
        return "first failure"
    if v.first_consequence is not None and (v.first_cause is None or v.first_cause.kind == "error" or
                                            (v.first_consequence.ts or 0) <= (v.first_cause.ts or 0)):
        return "timed out (consequence)"
    if v.first_cause is not None:
        return f"error ({v.first_cause.kind})"
    return "no error"
