"""`port baseline --import`, `port recipe import`, `port ops scan --script`, `port intake`: hostile logs,
configs, pickles and scripts get one line, run no code and write nothing outside the destination."""

from __future__ import annotations

import json
import pickle
import shutil
import struct
import zipfile

from tests.attacks import inputs as I
from tests.attacks.harness import ROOT, case

FIX = ROOT / "tests" / "fixtures" / "cuda_jobs"


def _import(d, log, *extra):
    (d / "out").mkdir(exist_ok=True)
    return ["baseline", "--import", str(log), "--out", str(d / "out" / "base.json"), *extra]


def _recipe(d, *cfgs):
    (d / "out").mkdir(exist_ok=True)
    return ["recipe", "import", *map(str, cfgs), "--model", "stories260k", "--out", str(d / "out" / "r.yaml")]


def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


# ------------------------------------------------------------------------------------------ logs
def _events(d):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(logdir=str(d / "tb"))
    for s in range(1, 4):
        w.add_scalar("train/loss", 1.0 / s, s)
    w.close()
    return next((d / "tb").iterdir())


@case("data CRC mismatch", "corrupt")
def tfevents_corrupt_record(d):
    p = _events(d)
    raw = bytearray(p.read_bytes())
    raw[-6] ^= 0xFF   # a byte inside the last record's data
    p.write_bytes(bytes(raw))
    return _import(d, p)


@case("more than the 4,194,304 a scalar event needs")
def tfevents_huge_record_length(d):
    from porting.intake.tfevents import masked_crc

    header = struct.pack("<Q", 1 << 40)
    p = d / "events.out.tfevents.1.host"
    p.write_bytes(header + struct.pack("<I", masked_crc(header)) + b"\0" * 16)
    return _import(d, p)


@case("no scalar tagged 'train/loss\\n' (--loss-tag)")
def tfevents_loss_tag_absent(d):
    # the public event file logs strict/foo only; a tag with a newline must not pass as another
    shutil.copy(FIX / "logs" / "tensorboard" / "events.out.tfevents.strict.run_1", d / "events.out.tfevents.1.host")
    return _import(d, d / "events.out.tfevents.1.host", "--loss-tag", "train/loss\n")


@case("--loss-tag names a TensorBoard scalar")
def loss_tag_on_a_json_log(d):
    shutil.copy(FIX / "logs" / "luojiu_trainer_state.json", d / "trainer_state.json")
    return _import(d, d / "trainer_state.json", "--loss-tag", "loss")


@case("nests deeper than 16 levels")
def trainer_state_deep(d):
    p = d / "trainer_state.json"
    p.write_text('{"log_history": ' + "[" * I.DEEP + "]" * I.DEEP + "}")
    return _import(d, p)


@case("more than the 268,435,456 allowed")
def trainer_state_huge(d):
    return _import(d, _sparse(d / "trainer_state.json", (256 << 20) + 1))


@case("step 10 comes after step 20")
def jsonl_steps_backward(d):
    p = d / "log.jsonl"
    p.write_text(json.dumps({"step": 20, "loss": 1.0}) + "\n" + json.dumps({"step": 10, "loss": 1.0}) + "\n")
    return _import(d, p)


@case("line 3: loss: found 'abc', expected a number")
def csv_bad_loss(d):
    p = d / "log.csv"
    p.write_text("step,loss\n1,2.0\n2,abc\n")
    return _import(d, p)


@case("overlaps the input")
def out_is_the_log(d):
    p = d / "out" / "metrics.jsonl"
    p.parent.mkdir()
    p.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    return ["baseline", "--import", str(p), "--out", str(p)]


# ------------------------------------------------------------------------------------------ configs
class _RunsCode:
    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED",))


def _nothing_ran(line, d):
    assert not list(d.rglob("PWNED")), "the pickle ran"


@case("refused", "posix.system", check=_nothing_ran)
def training_args_bin_runs_code(d):
    p = d / "training_args.bin"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("training_args/data.pkl", pickle.dumps(_RunsCode(), protocol=2))
    return _recipe(d, p)


@case("refused", "builtins.eval", check=_nothing_ran)
def training_args_bin_bare_pickle_eval(d):
    p = d / "training_args.bin"
    p.write_bytes(b"cbuiltins\neval\n(S'__import__(\"os\").system(\"touch PWNED\")'\ntR.")
    return _recipe(d, p)


@case("refused: pickle opcode BINPERSID")
def training_args_bin_tensor(d):
    p = d / "training_args.bin"
    p.write_bytes(b"\x80\x02X\x01\x00\x00\x000Q.")
    return _recipe(d, p)


@case("nests deeper than 16 levels")
def deepspeed_json_deep(d):
    p = d / "ds_config.json"
    p.write_text('{"zero_optimization": ' + "[" * I.DEEP + "]" * I.DEEP + "}")
    return _recipe(d, p)


@case("aliases are expanded")
def llamafactory_yaml_alias_bomb(d):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    p = d / "sft.yaml"
    p.write_text("finetuning_type: full\n" + "\n".join(lines) + "\n")
    return _recipe(d, p)


@case("more than the 1,048,576 allowed")
def config_yaml_huge(d):
    return _recipe(d, _sparse(d / "sft.yaml", (1 << 20) + 1))


@case("not a training config port knows")
def config_not_training(d):
    p = d / "config.json"
    p.write_text(json.dumps({"hidden_size": 64}))
    return _recipe(d, p)


# ------------------------------------------------------------------------------------------ scripts, intake
@case("line 1: not valid Python")
def script_not_python(d):
    (d / "train.py").write_text("def f(:\n    pass\n")
    return ["ops", "scan", "--script", str(d / "train.py")]


@case("more than the 4,194,304 allowed")
def script_100_mb(d):
    return ["ops", "scan", "--script", str(_sparse(d / "train.py", 100 << 20))]


@case("train.py: not valid Python (source code string cannot contain null bytes)")
def script_nul_bytes(d):
    (d / "train.py").write_bytes(b"import torch\x00\n")
    return ["ops", "scan", "--script", str(d / "train.py")]


@case("inside the job folder")
def intake_out_inside_job(d):
    job = d / "out"
    job.mkdir()
    shutil.copy(FIX / "configs" / "medical_full.yaml", job)
    return ["intake", str(job), "--out", str(job / "migration")]


@case("exists and is not empty", dest=None)
def intake_out_not_empty(d):
    (d / "job").mkdir()
    (d / "mine").mkdir()
    (d / "mine" / "notes.txt").write_text("mine")
    return ["intake", str(d / "job"), "--out", str(d / "mine")]


from tests.attacks.intake import cases_configs, cases_logs, cases_outs  # noqa: E402,F401  (register issue 40's cases)
