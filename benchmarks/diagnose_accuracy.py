"""Benchmark: how often `port diagnose` names the expected suspect, cause class and confidence on the
field corpus (tests/diagnostics/fixtures/field: real excerpts from public threads, each headed by its URL,
expected verdicts in expected.yaml), split into the held-back excerpts (never tuned on) and the rest.

A case passes when all four hold: the suspect entity (rank N / device N / host H / peer HOST:PORT / file),
the cause class, the confidence level, and every reason key word (case-insensitive) in the reason. Verdicts
from before the cause model (no ``cause_class`` / ``suspect`` in the result) are scored leniently: their
``reason_kind`` counts as right for every class it could stand for (OLD_KIND_CLASSES), and the suspect is
read from ``first_failing_rank``.

    python benchmarks/diagnose_accuracy.py [--json] [--show-misses] [--split heldout|tune|tune38|...|tune53|heldout53]

Issue 53's report is by shape (device, memory, link, heartbeat, install, operator, numerical, crash): an entry's
``shape`` field, else the shape of its class (:data:`SHAPE_OF_CLASS`). An entry whose name ends in "/" is a
directory of logs (a run's own ``logs/``), diagnosed as it is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from porting.diagnostics.diagnose import diagnose  # noqa: E402

FIELD = ROOT / "tests" / "diagnostics" / "fixtures" / "field"
NEUTRAL = "pasted.log"
OLD_KIND_CLASSES = {
    "oom": {"memory"}, "config": {"address_port", "config", "nic_link_init", "comm_init"},
    "device_error": {"device_fault", "nic_link_init"}, "operator_error": {"operator_error"},
    "crash": {"process_exit"}, "worker_exit": {"process_exit"},
    "comm_timeout": {"collective_timeout", "socket_timeout", "watchdog_abort", "process_exit"},
}


def expected_suspects(want: dict) -> list[str]:
    """The suspect strings a verdict may give for one expected entry."""
    if "suspect" in want:
        s = want["suspect"]
        return list(s) if isinstance(s, list) else [s]
    r = want["rank"]
    return [f"rank {r}"] if isinstance(r, int) else [str(r)]


def suspect_of(d: dict) -> str:
    if isinstance(d.get("suspect"), dict):
        return d["suspect"]["text"]
    r = d.get("first_failing_rank")
    if isinstance(r, int):
        return f"rank {r}"
    if isinstance(r, str) and r.startswith("file:"):
        return "file"
    return str(r)


def class_ok(d: dict, want: str) -> bool:
    if "cause_class" in d:
        return d["cause_class"] == want
    return want in OLD_KIND_CLASSES.get(d.get("reason_kind"), set())


# issue 53's shapes, for entries without a `shape` of their own (a class's usual shape)
SHAPE_OF_CLASS = {"device_fault": "device", "memory": "memory", "host_oom": "memory", "nic_link_init": "link",
                  "socket_timeout": "link", "address_port": "link", "collective_timeout": "heartbeat",
                  "watchdog_abort": "heartbeat", "comm_init": "link", "config": "install", "operator_error": "operator",
                  "numerical": "numerical", "process_exit": "crash", "framework_internal": "crash",
                  "data_starvation": "device"}
SHAPES = ("device", "memory", "link", "heartbeat", "install", "operator", "numerical", "crash")


def shape_of(want: dict) -> str:
    return want.get("shape") or SHAPE_OF_CLASS.get(want.get("class", ""), "other")


def score(name: str, want: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        if name.endswith("/"):   # a run's own log directory: its file names are part of what it says
            shutil.copytree(FIELD / name, logs)
        else:
            logs.mkdir()
            # a neutral name: fixture names like "..._rank5_watchdog.log" would otherwise give the rank away
            # (the file-name grammar reads "rank5" as the rank), which a pasted log does not have
            shutil.copy(FIELD / name, logs / NEUTRAL)
        d = diagnose(logs, jobs=1)
    got = suspect_of(d)
    reason = d.get("reason", "")
    checks = {"suspect": got in expected_suspects(want), "class": class_ok(d, want["class"]),
              "confidence": d.get("confidence") == want["confidence"],
              "reason": all(k.lower() in reason.lower() for k in want.get("reason", [])),
              # issue 38: the fine-grained fault of the taxonomy, where the expectation names one
              "fault": "fault" not in want or d.get("fault") == want["fault"]}
    return {"name": name, "split": want.get("split", "tune"), "kinds": want.get("kinds", []), "shape": shape_of(want),
            **checks,
            "pass": all(checks.values()), "no_failure_found": d.get("reason_kind") == "none",
            "want_fault": want.get("fault"),
            "got": {"suspect": got, "class": d.get("cause_class", d.get("reason_kind")), "fault": d.get("fault"),
                    "role": d.get("role"), "confidence": d.get("confidence"), "reason": reason[:200], "why": d.get("why", "")}}


SPLITS = (("heldout", "held-back, issue 28"),
          ("tune38", "issue 38's first held-back batch, tuned on since"),
          ("tune38b", "issue 38's second held-back batch, tuned on since"),
          ("tune38c", "issue 38's third held-back batch, tuned on since"),
          ("tune38d", "issue 38's fourth held-back batch, tuned on since"), ("tune", "rest (tuned on)"),
          ("tune53", "issue 53's tuning set"), ("heldout53", "issue 53's held-back batch (never tuned on)"))
TUNING = ("tune", "tune38", "tune38b", "tune38c", "tune38d", "tune53")
MEASURES = ("pass", "suspect", "class", "fault", "confidence", "reason")


def summary(rows: list[dict]) -> dict:
    out = {}
    for split, _ in SPLITS:
        part = [r for r in rows if r["split"] == split]
        c = Counter(k for r in part for k in MEASURES if r[k])
        # issue 38's target is "suspect and class together"
        both = sum(r["suspect"] and r["class"] for r in part)
        out[split] = {"n": len(part), **{k: c[k] for k in MEASURES}, "suspect_and_class": both,
                      "no_failure_found": sum(r["no_failure_found"] for r in part)}
    for kind in ("consequence", "peer", "device", "markerless", "undetermined"):
        part = [r for r in rows if kind in r["kinds"]]
        out[f"kind:{kind}"] = {"n": len(part), "pass": sum(r["pass"] for r in part)}
    for shape in SHAPES:
        for group, splits in (("held-back", ("heldout53",)), ("all", None)):
            part = [r for r in rows if r["shape"] == shape and (splits is None or r["split"] in splits)]
            out[f"shape:{shape}:{group}"] = {"n": len(part), "pass": sum(r["pass"] for r in part),
                                             "suspect_and_class": sum(r["suspect"] and r["class"] for r in part),
                                             "no_failure_found": sum(r["no_failure_found"] for r in part)}
    for fault in sorted({r["want_fault"] for r in rows if r.get("want_fault")}):
        part = [r for r in rows if r.get("want_fault") == fault]
        out[f"fault:{fault}"] = {"n": len(part), "pass": sum(r["pass"] for r in part)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--show-misses", action="store_true",
                    help="list the tuning split's misses (never the held-back ones: looking would be tuning on them)")
    ap.add_argument("--split", choices=[k for k, _ in SPLITS], help="score one split only")
    args = ap.parse_args()
    expected = yaml.safe_load((FIELD / "expected.yaml").read_text())
    rows = [score(name, want) for name, want in expected.items()
            if args.split is None or want.get("split", "tune") == args.split]
    s = summary(rows)
    if args.json:
        print(json.dumps({"summary": s, "cases": rows}, indent=1))
        return 0
    for split, label in SPLITS:
        x = s[split]
        if not x["n"]:
            continue
        print(f"{label:>20}: {x['pass']}/{x['n']} pass ({100 * x['pass'] / max(x['n'], 1):.0f}%); suspect and class "
              f"{x['suspect_and_class']}/{x['n']}; suspect {x['suspect']}, class {x['class']}, fault {x['fault']}, "
              f"confidence {x['confidence']}, reason {x['reason']}; 'no failure found' {x['no_failure_found']}")
    print("by kind: " + ", ".join(f"{k[5:]} {v['pass']}/{v['n']}" for k, v in s.items() if k.startswith("kind:")))
    print("by fault: " + ", ".join(f"{k[6:]} {v['pass']}/{v['n']}" for k, v in s.items() if k.startswith("fault:")))
    for group in ("all", "held-back"):
        print(f"by shape ({group}; suspect and class / n, full pass, 'no failure found'): " + ", ".join(
            f"{sh} {s[f'shape:{sh}:{group}']['suspect_and_class']}/{s[f'shape:{sh}:{group}']['n']} "
            f"({s[f'shape:{sh}:{group}']['pass']}, {s[f'shape:{sh}:{group}']['no_failure_found']})"
            for sh in SHAPES if s[f"shape:{sh}:{group}"]["n"]))
    if args.show_misses:
        for r in rows:
            if not r["pass"] and r["split"] in TUNING:
                bad = [k for k in MEASURES[1:] if not r[k]]
                print(f"MISS [{r['split']}] {r['name']}: {bad} got {r['got']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
