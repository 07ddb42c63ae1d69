"""Every --out of the import commands under the converters' rule (`converters.atomic.check_out`): a
new path or a file port wrote of the same kind; never a file of the user's, never an input, never a link;
a side file (`R.mapping.json` of `--out R.yaml`) is an output too."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import ROOT, case

FIX = ROOT / "tests" / "fixtures" / "cuda_jobs"


def _args(d: Path) -> Path:
    p = d / "args.json"
    p.write_text(json.dumps({"per_device_train_batch_size": 1, "learning_rate": 2e-5}))
    return p


@case("R.mapping.json", "exists and is not a mapping `port recipe import` wrote", dest=None)
def recipe_import_over_a_users_mapping_file(d):
    """`--out R.yaml` overwrote the user's R.mapping.json beside it."""
    I.canary(d, "R.mapping.json")
    return ["recipe", "import", str(_args(d)), "--model", "stories260k", "--out", str(d / "R.yaml")]


@case("R.mapping.json", "is a symbolic link", dest=None)
def recipe_import_mapping_is_a_link_to_a_file_elsewhere(d):
    (d / "elsewhere").mkdir()
    target = I.canary(d / "elsewhere", "notes.json")
    os.symlink(target, d / "R.mapping.json")
    return ["recipe", "import", str(_args(d)), "--model", "stories260k", "--out", str(d / "R.yaml")]


@case("R.yaml", "is a symbolic link", dest=None)
def recipe_import_out_is_a_dangling_link(d):
    os.symlink(d / "nowhere" / "x.yaml", d / "R.yaml")
    return ["recipe", "import", str(_args(d)), "--model", "stories260k", "--out", str(d / "R.yaml")]


@case("scan.json", "exists and is not a scan port wrote", dest=None)
def ops_scan_out_over_a_users_file(d):
    shutil.copy(FIX / "scripts" / "alpaca_train_clean.py", d / "train.py")
    I.canary(d, "scan.json")
    return ["ops", "scan", "--script", str(d / "train.py"), "--out", str(d / "scan.json")]


@case("train.py", "overlaps the input", dest=None)
def ops_scan_out_is_the_script(d):
    shutil.copy(FIX / "scripts" / "alpaca_train_clean.py", d / "train.py")
    return ["ops", "scan", "--script", str(d / "train.py"), "--out", str(d / "train.py")]


@case("mine.json", "exists and is not a baseline port wrote", dest=None)
def baseline_import_out_over_a_users_file(d):
    shutil.copy(FIX / "logs" / "medical_trainer_log.jsonl", d / "trainer_log.jsonl")
    I.canary(d, "mine.json")
    return ["baseline", "--import", str(d / "trainer_log.jsonl"), "--out", str(d / "mine.json")]


def _replaced(line: str, d: Path) -> None:
    doc = json.loads((d / "out" / "base.json").read_text())
    assert doc["imported"]["format"] == "llamafactory-jsonl", "an earlier baseline port wrote is replaced"


@case(refusal=False, check=_replaced)
def baseline_import_out_replaces_an_earlier_baseline(d):
    """A file port wrote of the same kind is replaced (the rule's one exception for files)."""
    from porting.intake.baseline_import import Stated, import_log

    (d / "out").mkdir()
    shutil.copy(FIX / "logs" / "medical_trainer_log.jsonl", d / "trainer_log.jsonl")
    p = d / "log.csv"
    p.write_text("step,loss\n1,2.0\n2,1.5\n")
    import_log(p, d / "out" / "base.json", Stated(), ["port"])
    return ["baseline", "--import", str(d / "trainer_log.jsonl"), "--out", str(d / "out" / "base.json")]
