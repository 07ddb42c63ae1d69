"""Rendering a `port diagnose` result: the text report and the JSON file (``--out``)."""

from __future__ import annotations

import json
from pathlib import Path

from model_zoo.files import write_atomic
from porting.diagnostics import DiagnosticsError


def render_text(d: dict, max_ranks: int = 32) -> str:
    out = [f"port diagnose {d['logdir']}: {d['files_read']}/{d['files']} files, {d['ranks_seen']} rank(s) "
           f"({', '.join(f'{k} {v}' for k, v in sorted(d['formats'].items()))})", ""]
    if d["first_failing_rank"] is not None:
        out.append(f"FIRST FAILING RANK: {d['first_failing_rank']}   last step: {d['last_step']}")
    else:
        out.append("FIRST FAILING RANK: none found")
    s = d.get("suspect")
    if s:
        details = ", ".join(f"{k} {s[k]}" for k in ("device", "chip", "die", "host", "pid", "nic_ip", "op", "signal")
                            if k in s and not (k == "host" and s.get("entity") == "host"))
        out.append(f"suspect: {s['text']}" + (f" ({details})" if details else "")
                   + (f"   cause class: {d['cause_class']}" if d.get("cause_class") else "")
                   + (f" / {d['fault']}" if d.get("fault") else "")
                   + (f"   ({d['role']})" if d.get("role") not in (None, "culprit", "none") else ""))
    out.append(f"reason: {d['reason']}")
    if d.get("why"):
        out.append(f"confidence: {d['confidence']} ({d['why']})")
    for item in d.get("collect_next") or []:
        out.append(f"collect next: {item}")
    if d.get("scheduler"):
        s = d["scheduler"]
        out.append(f"scheduler: timed-out ranks {s['timed_out_ranks']}, first timed out {s['first_timed_out']}")
    out.append("")
    hdr = f"{'rank':>6}  {'status':<24} {'last step':>9}  {'step time':<23} {'last collective':<22} first error"
    out.append(hdr)
    shown = d["ranks"]
    if len(shown) > max_ranks:
        keep = [r for r in shown if r["rank"] == d["first_failing_rank"]]
        shown = keep + [r for r in shown if r not in keep][: max_ranks - len(keep)]
    for r in shown:
        fe = r["first_error"]
        fe_txt = f"{fe['time'] or '?'} {fe['kind']}: {fe['text'][:80]}" if fe else "-"
        out.append(f"{str(r['rank']):>6}  {r['status']:<24} {str(r['last_step']):>9}  "
                   f"{str(r['last_step_time']):<23} {str(r['last_collective'] or '-')[:22]:<22} {fe_txt}")
    if len(d["ranks"]) > len(shown):
        out.append(f"  ... {len(d['ranks']) - len(shown)} more rank(s); use --json for all")
    if d["error_codes"]:
        out += ["", "error codes:"]
        for c in d["error_codes"]:
            out.append(f"  {c['code']} x{c['count']} (ranks {c['ranks']}): {c['meaning']}")
            if c["next_step"]:
                out.append(f"      next: {c['next_step']}")
    if d["timeline"]:
        out += ["", "timeline (first errors, clock-corrected):"]
        for t in d["timeline"][:12]:
            out.append(f"  {t['time'] or '?':<23} rank {t['rank']}: {t['kind']} ({t['role']}) {t['text'][:100]}")
    if d["warnings"]:
        out += ["", "warnings:"] + [f"  {w}" for w in d["warnings"][:20]]
    return "\n".join(out)


def write_json(d: dict, path: Path) -> None:
    """The JSON diagnosis, written atomically (the old file stays until the new one is whole)."""
    write_atomic(path, json.dumps(d, indent=2, default=str), error=DiagnosticsError)
