"""Imported logs and the curve gate: a TensorBoard field of the wrong wire type and an imported
baseline of the wrong types are one line; valid logs (a UTF-8 byte-order mark, tab-separated, every real
event file the fixtures hold) and scripts with a byte-order mark are accepted."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from tests.attacks.harness import ROOT, case

FIX = ROOT / "tests" / "fixtures" / "cuda_jobs"
TB = FIX / "logs" / "tensorboard"
BOM = "\ufeff"


def _import(d: Path, log: Path, *extra: str) -> list[str]:
    (d / "out").mkdir(exist_ok=True)
    return ["baseline", "--import", str(log), "--out", str(d / "out" / "base.json"), *extra]


def _wrote(*names: str):
    def check(line: str, d: Path) -> None:
        for n in names:
            assert (d / n).is_file(), f"{n} was not written: {line[-500:]}"
    return check


# -------------------------------------------------------------------------------- TensorBoard wire types
def _key(num: int, wt: int) -> bytes:
    return bytes([num << 3 | wt])


def _ld(num: int, payload: bytes) -> bytes:
    return _key(num, 2) + bytes([len(payload)]) + payload


def _record(data: bytes) -> bytes:
    from porting.intake.tfevents import masked_crc

    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc(head)) + data + struct.pack("<I", masked_crc(data))


@case("events.out.tfevents.1.host", "record at byte 0", "not a TensorBoard Event", "wire type 0")
def tfevents_float_field_with_a_varint_wire_type(d):
    """TensorProto.float_val (field 5) as a varint: struct.unpack of an int was a TypeError traceback."""
    tensor = _key(1, 0) + b"\x01" + _key(5, 0) + b"\x07"
    value = _ld(1, b"train/loss") + _ld(8, tensor)
    event = _key(2, 0) + b"\x01" + _ld(5, _ld(1, value))
    p = d / "events.out.tfevents.1.host"
    p.write_bytes(_record(event))
    return _import(d, p)


@case("events.out.tfevents.1.host", "not a TensorBoard Event", "Summary.Value field 1 with wire type 0")
def tfevents_tag_with_a_varint_wire_type(d):
    value = _key(1, 0) + b"\x05" + _key(2, 5) + struct.pack("<f", 1.0)
    event = _key(2, 0) + b"\x01" + _ld(5, _ld(1, value))
    p = d / "events.out.tfevents.1.host"
    p.write_bytes(_record(event))
    return _import(d, p)


# -------------------------------------------------------------------------------- imported baselines
def _imported(d: Path, **imported) -> Path:
    """A real `port baseline --import` of the public LLaMA-Factory log, then ``imported`` fields edited."""
    from porting.intake.baseline_import import Stated, import_log

    p = d / "base.json"
    _, base = import_log(FIX / "logs" / "medical_trainer_log.jsonl", p, Stated(global_batch=4), ["port"])
    doc = base.to_dict()
    doc["imported"].update(imported)
    p.write_text(json.dumps(doc))
    return p


def _run_dir(d: Path) -> Path:
    from tests.attacks.report.cases import run_dir

    return run_dir(d)


@case("base.json", "imported.logging_interval is 'x'", dest=None)
def imported_baseline_logging_interval_is_x(d):
    return ["compare", str(_imported(d, logging_interval="x")), str(_run_dir(d)), "--no-probe"]


@case("base.json", "imported.logging_interval is '-5'", dest=None)
def imported_baseline_logging_interval_is_minus_5(d):
    return ["compare", str(_imported(d, logging_interval=-5)), str(_run_dir(d)), "--no-probe"]


@case("base.json", "imported.contains is '5'", "expected a list of names", dest=None)
def imported_baseline_contains_is_a_number(d):
    return ["compare", str(_imported(d, contains=5)), str(_run_dir(d)), "--no-probe"]


@case("base.json", "holds the loss curve only", "without --bisect", dest=None)
def compare_bisect_against_an_imported_baseline(d):
    """Was `KeyError: 'loss'`."""
    return ["compare", str(_imported(d)), str(_run_dir(d)), "--bisect"]


# -------------------------------------------------------------------------------- valid inputs accepted
@case(refusal=False, check=_wrote("out/base.json"))
def jsonl_log_with_a_byte_order_mark(d):
    p = d / "log.jsonl"
    p.write_text(BOM + "".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n" for s in range(1, 6)), encoding="utf-8")
    return _import(d, p)


@case(refusal=False, check=_wrote("out/base.json"))
def csv_log_with_a_byte_order_mark(d):
    """Excel's "CSV UTF-8" starts the file with a byte-order mark."""
    p = d / "log.csv"
    p.write_text(BOM + "step,loss\n1,2.0\n2,1.5\n3,1.2\n", encoding="utf-8")
    return _import(d, p)


@case(refusal=False, check=_wrote("out/base.json"))
def tsv_log(d):
    p = d / "log.tsv"
    p.write_text("step\tloss\tlr\n1\t2.0\t1e-4\n2\t1.5\t1e-4\n3\t1.2\t1e-4\n")
    return _import(d, p)


@case(refusal=False, check=_wrote("out/scan.json"))
def script_with_a_byte_order_mark(d):
    (d / "out").mkdir()
    p = d / "train.py"
    p.write_text(BOM + (FIX / "scripts" / "nanogpt_train.py").read_text(), encoding="utf-8")
    return ["ops", "scan", "--script", str(p), "--out", str(d / "out" / "scan.json")]


@case(refusal=False, check=_wrote("out/base.json"))
def tfevents_fixture_strict_with_its_loss_tag(d):
    shutil.copy(TB / "events.out.tfevents.strict.run_1", d / "events.out.tfevents.strict.run_1")
    return _import(d, d / "events.out.tfevents.strict.run_1", "--loss-tag", "strict/foo")


@case(refusal=False, check=_wrote("out/base.json"))
def tfevents_fixture_duplicate_steps_with_its_loss_tag(d):
    shutil.copy(TB / "events.out.tfevents.duplicate_steps.run_1", d / "events.out.tfevents.dup.run_1")
    return _import(d, d / "events.out.tfevents.dup.run_1", "--loss-tag", "dup_steps/foo")


def _job_with_events(d: Path) -> Path:
    job = d / "job"
    job.mkdir()
    shutil.copy(FIX / "configs" / "lf_qwen3_full_sft.yaml", job)
    for f in TB.glob("events.out.tfevents.*"):
        shutil.copy(f, job)
    return job


@case(refusal=False, check=_wrote("out/recipe.yaml", "out/README.md"), timeout=60)
def intake_job_with_the_real_event_files(d):
    """Their scalars are not named as a loss: the migration is made, the log named in a note (was refused)."""
    return ["intake", str(_job_with_events(d)), "--out", str(d / "out"), "--model", "stories260k"]


@case(refusal=False, check=_wrote("out/recipe.yaml", "out/baseline.json"), timeout=60)
def intake_job_with_an_event_file_and_its_loss_tag(d):
    return ["intake", str(_job_with_events(d)), "--out", str(d / "out"), "--model", "stories260k",
            "--loss-tag", "dup_steps/foo"]
