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


# -- --out under the converters' rule (converters.atomic.check_out)
@case("base.json", "overlaps the input", dest=None)
def out_is_the_baseline_being_compared(d):
    """`--out base.json` overwrote the baseline being compared."""
    from tests.attacks.intake.cases_logs import _imported

    return ["compare", str(_imported(d)), str(run_dir(d)), "--no-probe", "--out", str(d / "base.json")]


@case("mine.json", "exists and is not a comparison port wrote", dest=None)
def out_over_a_users_file(d):
    from tests.attacks.intake.cases_logs import _imported

    I.canary(d, "mine.json")
    return ["compare", str(_imported(d)), str(run_dir(d)), "--no-probe", "--out", str(d / "mine.json")]


@case("is a symbolic link", dest=None)
def out_is_a_link_to_a_file_elsewhere(d):
    from tests.attacks.intake.cases_logs import _imported

    (d / "elsewhere").mkdir()
    import os

    os.symlink(I.canary(d / "elsewhere", "c.json"), d / "cmp.json")
    return ["compare", str(_imported(d)), str(run_dir(d)), "--no-probe", "--out", str(d / "cmp.json")]


@case("metrics.jsonl", "exists and is not a comparison port wrote", dest=None)
def out_is_a_file_of_the_run(d):
    from tests.attacks.intake.cases_logs import _imported

    r = run_dir(d)
    return ["compare", str(_imported(d)), str(r), "--no-probe", "--out", str(r / "metrics.jsonl")]


# -- the field's gates and the settings table (issue 49)
@case("--weighted-steps", "expected FIRST:LAST", dest=None)
def field_gate_window_reversed(d):
    from tests.attacks.intake.cases_logs import _imported

    return ["compare", str(_imported(d)), str(run_dir(d)), "--no-probe", "--weighted-steps", "90:10"]


@case("--mean-rel-steps", "expected FIRST:LAST", dest=None)
def field_gate_window_not_numbers(d):
    from tests.attacks.intake.cases_logs import _imported

    return ["compare", str(_imported(d)), str(run_dir(d)), "--no-probe", "--mean-rel-steps", "1:$(touch PWNED)"]


@case("job", "no training config", dest=None)
def cuda_job_without_a_config(d):
    from tests.attacks.intake.cases_logs import _imported

    (d / "job").mkdir()
    I.canary(d / "job", "notes.txt")
    return ["compare", str(_imported(d)), str(run_dir(d)), "--no-probe", "--cuda-job", str(d / "job")]


@case("base.json", "imported.effective_settings.seed: expected an object", dest=None)
def imported_effective_settings_forged(d):
    from tests.attacks.intake.cases_logs import _imported

    return ["compare", str(_imported(d, effective_settings={"seed": 5})), str(run_dir(d)), "--no-probe"]
