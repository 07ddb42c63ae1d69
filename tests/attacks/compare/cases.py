"""`port compare BASELINE RUNDIR`: hostile baseline files and run directories are one line."""

from __future__ import annotations

from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case
from tests.attacks.report.cases import run_dir


def _baseline(d: Path, raw: bytes | str) -> Path:
    p = d / "base.json"
    p.write_bytes(raw.encode() if isinstance(raw, str) else raw)
    return p


@case("base.json", dest=None)
def baseline_not_utf8(d):
    return ["compare", str(_baseline(d, I.NOT_UTF8)), str(run_dir(d)), "--no-probe"]


@case("base.json", dest=None)
def baseline_nested_100000_levels(d):
    return ["compare", str(_baseline(d, I.deep_json())), str(run_dir(d)), "--no-probe"]


@case("base.json", dest=None)
def baseline_is_a_list(d):
    return ["compare", str(_baseline(d, "[1, 2, 3]")), str(run_dir(d)), "--no-probe"]


@case("base.json", dest=None)
def baseline_is_truncated(d):
    return ["compare", str(_baseline(d, '{"schema": 1, "steps": [')), str(run_dir(d)), "--no-probe"]


@case("base.json", dest=None)
def baseline_missing(d):
    return ["compare", str(d / "base.json"), str(run_dir(d)), "--no-probe"]


@case("base.json", dest=None, timeout=10)
def baseline_is_a_fifo(d):
    import os

    os.mkfifo(d / "base.json")
    return ["compare", str(d / "base.json"), str(run_dir(d)), "--no-probe"]


@case(dest=None)
def rundir_missing(d):
    return ["compare", str(_baseline(d, "{}")), str(d / "nope"), "--no-probe"]


@case(dest=None)
def rundir_metrics_nested(d):
    return ["compare", str(_baseline(d, "{}")), str(run_dir(d, **{"metrics.jsonl": I.deep_json() + "\n"})),
            "--no-probe"]
