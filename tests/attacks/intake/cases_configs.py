"""`port recipe import` and `port intake` on configs with values of the wrong type, non-finite or oversized
numbers, YAML dates and sets, hostile pickles and zips, and names that hold a newline: one line
naming the file, the key, what was found and what was expected; nothing written outside ``out``."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
import zipfile
from pathlib import Path

import yaml

from tests.attacks.harness import EMBEDDED, case

BASE = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "learning_rate": 2e-5, "seed": 1}


def _recipe(d: Path, *cfgs: Path) -> list[str]:
    (d / "out").mkdir(exist_ok=True)
    return ["recipe", "import", *map(str, cfgs), "--model", "stories260k", "--out", str(d / "out" / "r.yaml")]


def _args_json(d: Path, text: str, name: str = "args.json") -> list[str]:
    """A TrainingArguments JSON whose text is ``text`` (raw, so Infinity and 1e999 reach the parser)."""
    p = d / name
    p.write_text(text)
    return _recipe(d, p)


def _with(**kv) -> str:
    return json.dumps({**BASE, **kv})


# -------------------------------------------------------------------------------- wrong types and numbers
@case("args.json", "learning_rate", "found 'abc'", "expected a number above 0 to 1e+30")
def lr_is_a_string(d):
    return _args_json(d, _with(learning_rate="abc"))


@case("args.json", "learning_rate", "found [1, 2]", "expected a number")
def lr_is_a_list(d):
    return _args_json(d, _with(learning_rate=[1, 2]))


@case("args.json", "learning_rate", "found True", "expected a number")
def lr_is_true(d):
    """A boolean is never a number (true was taken as 1.0)."""
    return _args_json(d, _with(learning_rate=True))


@case("args.json", "num_train_epochs", "found inf", "expected a number above 0 to 1,000,000")
def epochs_infinity(d):
    return _args_json(d, _with()[:-1] + ', "num_train_epochs": Infinity}')


@case("args.json", "num_train_epochs", "found nan")
def epochs_nan(d):
    return _args_json(d, _with()[:-1] + ', "num_train_epochs": NaN}')


@case("args.json", "per_device_train_batch_size", "found inf", "expected a whole number from 1 to 65,536")
def batch_1e999(d):
    return _args_json(d, _with().replace('"per_device_train_batch_size": 1,', '"per_device_train_batch_size": 1e999,'))


@case("sft.yaml", "per_device_train_batch_size", "found 'four'", "expected a whole number")
def batch_is_four(d):
    p = d / "sft.yaml"
    p.write_text("stage: sft\nfinetuning_type: full\nper_device_train_batch_size: four\n")
    return _recipe(d, p)


@case("args.json", "seed", "found 'x'", "expected a whole number from 0 to 4,294,967,295")
def seed_x(d):
    return _args_json(d, _with(seed="x"))


@case("ds.json", "fp16.initial_scale_power", "found 100000", "expected a whole number from 0 to 32")
def deepspeed_initial_scale_power_100000(d):
    p = d / "ds.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True,
                                                                             "initial_scale_power": 100000}}))
    return _recipe(d, p)


@case("accelerate.yaml", "num_processes", "found 8.5", "expected a whole number")
def accelerate_num_processes_8_5(d):
    """8.5 GPUs was taken as 8."""
    p = d / "accelerate.yaml"
    p.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 8.5\n")
    (d / "args.json").write_text(_with())
    return _recipe(d, d / "args.json", p)


@case("args.json", "bf16", "found 1", "expected true or false")
def bf16_is_1(d):
    return _args_json(d, _with(bf16=1))


@case("sft.yaml", "learning_rate", "a YAML date (2020-01-01)", "expected a number")
def llamafactory_lr_is_a_yaml_date(d):
    p = d / "sft.yaml"
    p.write_text("stage: sft\nfinetuning_type: full\nlearning_rate: 2020-01-01\n")
    return _recipe(d, p)


@case("sft.yaml", "learning_rate", "a YAML set (!!set)", "expected a number")
def llamafactory_lr_is_a_yaml_set(d):
    p = d / "sft.yaml"
    p.write_text("stage: sft\nfinetuning_type: full\nlearning_rate: !!set {1: null, 2: null}\n")
    return _recipe(d, p)


@case("sft.yaml", "per_device_train_batch_size: line 3: an integer of 5,000 digits")
def yaml_integer_of_5000_digits(d):
    p = d / "sft.yaml"
    p.write_text("stage: sft\nfinetuning_type: full\nper_device_train_batch_size: " + "9" * 5000 + "\n")
    return _recipe(d, p)


@case("args.json", "an integer of 5,000 digits")
def json_integer_of_5000_digits(d):
    return _args_json(d, _with()[:-1] + ', "max_steps": ' + "9" * 5000 + "}")


def _no_injected_keys(line: str, d: Path) -> None:
    """The recipe port wrote holds only port's own keys; every line above them is one comment."""
    text = (d / "out" / "r.yaml").read_text()
    rec = yaml.safe_load(text)
    assert "execution" not in rec and "nonfinite" not in rec, sorted(rec)
    assert rec["seed"] == 1 and rec["optimizer"]["lr"] == 2e-5
    head = text[:text.index("model:")]
    assert all(ln.startswith("# ") for ln in head.splitlines()), head
    assert "\\nexecution:" in head   # the value is shown, escaped


@case(refusal=False, check=_no_injected_keys)
def value_with_a_newline_cannot_inject_recipe_keys(d):
    """An optimizer name holding a newline was written into the recipe's REFUSED comment and started new
    YAML keys (execution, nonfinite)."""
    evil = "sgd\nexecution: {launcher: evil}\nnonfinite: {max_total_skips: 1000000}\n#"
    return _args_json(d, _with(optim=evil, warmup_ratio=0.1))


@case("sft.yaml", "key a YAML date (2020-01-01)", "expected a setting name")
def yaml_key_is_a_date(d):
    """A date as a key crashed the key table (AttributeError: 'datetime.date' object has no attribute 'startswith')."""
    p = d / "sft.yaml"
    p.write_text("stage: sft\nfinetuning_type: full\n2020-01-01: 3\n")
    return _recipe(d, p)


@case("accelerate.yaml", "fsdp_config.key None", "expected a setting name")
def yaml_nested_key_is_null(d):
    p = d / "accelerate.yaml"
    p.write_text("compute_environment: LOCAL_MACHINE\nnum_processes: 2\nfsdp_config:\n  null: 1\n")
    return _recipe(d, p)


# -------------------------------------------------------------------------------- training_args.bin
def _zip_bin(d: Path, member: str = "training_args/data.pkl", payload: bytes = b"\x80\x02}q\x00.") -> Path:
    p = d / "training_args.bin"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(member, payload)
    return p


def _patch_zip(p: Path, *, flag: int | None = None, method: int | None = None) -> None:
    """Set the general-purpose flag or the compression method in both headers of the one member."""
    raw = bytearray(p.read_bytes())
    lh, cd = raw.index(b"PK\x03\x04"), raw.index(b"PK\x01\x02")
    for off, base in ((6, lh), (8, cd)):
        if flag is not None:
            struct.pack_into("<H", raw, base + off, flag)
    for off, base in ((8, lh), (10, cd)):
        if method is not None:
            struct.pack_into("<H", raw, base + off, method)
    p.write_bytes(bytes(raw))


@case("training_args.bin:training_args/data.pkl", "an encrypted zip member")
def training_args_bin_encrypted_member(d):
    p = _zip_bin(d)
    _patch_zip(p, flag=0x1)
    return _recipe(d, p)


@case("training_args.bin", "a zip port cannot read", "NotImplementedError")
def training_args_bin_unsupported_compression(d):
    p = _zip_bin(d)
    _patch_zip(p, method=99)   # AES (WinZip): zipfile has no decoder for it
    return _recipe(d, p)


@case("tuples nested deeper than 32 levels", subprocess=True, timeout=60)
def training_args_bin_tuple_190000_deep(d):
    """A 190,000-deep tuple used as a dict key was hashed recursively in C: signal 11."""
    n = 190_000
    pkl = (b"\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81}(" + b")" + b"\x85" * n + b"K\x01ub.")
    (d / "training_args.bin").write_bytes(pkl)
    return _recipe(d, d / "training_args.bin")


def billion_laughs_pickle() -> bytes:
    """409 bytes: ten memo entries, each a list of nine references to the one before (9^10 values)."""
    def s(t: str) -> bytes:
        b = t.encode()
        return b"X" + struct.pack("<I", len(b)) + b
    ops = [b"\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81}(",
           s("a0") + b"]q\x00(" + s("lol") * 9 + b"e"]
    ops += [s(f"a{i}") + b"]q" + bytes([i]) + b"(" + (b"h" + bytes([i - 1])) * 9 + b"e" for i in range(1, 10)]
    return b"".join(ops) + b"ub."


@case("billion laughs", subprocess=True, timeout=30)
def training_args_bin_billion_laughs(d):
    """Grew past 4 GB in under 70 s; now refused before any value is copied."""
    (d / "training_args.bin").write_bytes(billion_laughs_pickle())
    return _recipe(d, d / "training_args.bin")


# -------------------------------------------------------------------------------- names with a newline
@case("args\\nerror: forged.json")
def config_name_with_a_newline(d):
    """The file name is shown escaped: it cannot forge a second error line."""
    return _args_json(d, _with(seed="x"), name="args\nerror: forged.json")


@case("training_args.bin:x\\nerror: forged/data.pkl", "refused: pickle opcode BINPERSID")
def zip_member_name_with_a_newline(d):
    p = _zip_bin(d, "x\nerror: forged/data.pkl", b"\x80\x02X\x01\x00\x00\x000Q.")
    return _recipe(d, p)


# -------------------------------------------------------------------------------- intake README
def _block_runs_nothing(line: str, d: Path) -> None:
    """The README's shell block, run by bash with `port` and `cp` as no-ops, creates no PWNED: every value
    from the job is quoted, so `$(...)` in a folder name is never expanded."""
    text = (d / "out" / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "m$(touch PWNED)" in block
    with tempfile.TemporaryDirectory() as sandbox:
        subprocess.run(["bash", "-c", "port() { :; }; cp() { :; }\n" + block], cwd=sandbox, check=True, timeout=10)
        assert not list(Path(sandbox).rglob("PWNED")), "the README's shell block ran code from a folder name"
    assert not list(d.rglob("PWNED"))


@case(refusal=False, check=_block_runs_nothing, timeout=60)
def readme_shell_block_quotes_a_hostile_model_path(d):
    model = d / "m$(touch PWNED)"
    shutil.copytree(EMBEDDED, model)
    (d / "job").mkdir()
    (d / "job" / "args.json").write_text(_with(model_name_or_path=str(model)))
    return ["intake", str(d / "job"), "--out", str(d / "out")]


@case("is a symbolic link", dest=None)
def intake_out_is_a_symlink(d):
    """The link was moved aside and left behind; now it is refused and left as it is."""
    (d / "job").mkdir()
    (d / "job" / "args.json").write_text(_with())
    (d / "elsewhere").mkdir()
    os.symlink(d / "elsewhere", d / "out")
    return ["intake", str(d / "job"), "--out", str(d / "out"), "--model", "stories260k"]
