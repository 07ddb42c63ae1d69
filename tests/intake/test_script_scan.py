"""`port ops lint`: each CUDA habit of real public training scripts at its exact line; a clean
script reports nothing; the rules file is complete."""

from __future__ import annotations

import json

from click.testing import CliRunner

from porting.cli import main
from porting.intake.script_scan import rules, scan, scan_source
from tests.attacks.harness import ROOT

S = ROOT / "tests" / "fixtures" / "cuda_jobs" / "scripts"

# karpathy/nanoGPT train.py (MIT): line -> habit, read off the file
NANOGPT = {(70, "nccl-backend"), (72, "cuda-device-string"), (73, "torch-cuda"), (88, "cuda-device-string"),
           (89, "torch-cuda"), (107, "tf32-flag"), (108, "tf32-flag-cudnn"), (109, "cuda-device-string"),
           (126, "cuda-device-string"), (196, "cuda-amp"), (208, "torch-compile")}
# lm-sys/FastChat llama2 flash-attn patch (Apache-2.0)
FASTCHAT_FA = {(5, "flash-attn"), (6, "flash-attn"), (7, "flash-attn"), (133, "torch-cuda"),
               (155, "cuda-device-string"),
               # the call sites of its CUDA-only kernels, not only their imports
               (80, "flash-attn-call"), (84, "flash-attn-call"), (86, "flash-attn-call"), (89, "flash-attn-call"),
               (101, "flash-attn-call")}
FASTCHAT_XF = {(14, "xformers"), (80, "xformers-call"), (85, "xformers-call"), (89, "xformers-call")}


def _lines(rep, name):
    return {(f["line"], f["rule"]) for f in rep["findings"] if f["file"].endswith(name)}


def test_each_habit_at_its_line():
    rep = scan([str(S)])
    assert _lines(rep, "nanogpt_train.py") == NANOGPT
    assert _lines(rep, "fastchat_llama2_flash_attn_monkey_patch.py") == FASTCHAT_FA
    assert _lines(rep, "fastchat_llama_xformers_attn_monkey_patch.py") == FASTCHAT_XF
    fa = (S / "fastchat_llama2_flash_attn_monkey_patch.py").read_text().splitlines()
    assert "flash_attn_func(" in fa[79] and "flash_attn_varlen_kvpacked_func(" in fa[88]
    text = (S / "nanogpt_train.py").read_text().splitlines()
    for line, rule in NANOGPT:   # the line really holds what the rule names
        assert {"nccl-backend": "nccl", "cuda-device-string": "cuda", "torch-cuda": "torch.cuda.", "tf32-flag":
                "matmul.allow_tf32", "tf32-flag-cudnn": "cudnn.allow_tf32", "cuda-amp": "torch.cuda.amp.GradScaler",
                "torch-compile": "torch.compile("}[rule] in text[line - 1]


def test_a_clean_script_reports_nothing():
    rep = scan([str(S / "alpaca_train_clean.py")])   # tatsu-lab/stanford_alpaca train.py: HF Trainer only
    assert rep["findings"] == [] and rep["counts"] == {}


def test_aliases_and_every_rule_kind():
    src = "\n".join([
        "import torch as t", "from torch.cuda.amp import GradScaler", "import apex.amp",
        "from bitsandbytes.optim import AdamW8bit", "import liger_kernel.transformers", "import triton.language as tl",
        "from torch.utils.cpp_extension import CUDAExtension", "t.cuda.synchronize()", "GradScaler()", "x.cuda()",
        "os.environ['CUDA_VISIBLE_DEVICES'] = '0'", "t.backends.cudnn.benchmark = True",
        "CUDAExtension('k', ['k.cu'])", "t.backends.cuda.enable_flash_sdp(False)",
        "from apex.normalization import FusedRMSNorm", "FusedRMSNorm(8)", "liger_kernel.transformers.apply_liger_kernel_to_llama()",
        "from transformers import BitsAndBytesConfig", "BitsAndBytesConfig(load_in_4bit=True)"])
    got = [(f.line, f.rule) for f in scan_source(src, "x.py")]
    assert got == [(2, "cuda-amp-import"), (3, "apex"), (4, "bitsandbytes"), (5, "liger-kernel"), (6, "triton"),
                   (7, "cpp-extension-cuda-import"), (8, "cuda-synchronize"), (9, "cuda-amp"), (10, "dot-cuda"),
                   (11, "cuda-visible-devices"), (12, "cudnn-flag"), (13, "cpp-extension-cuda"), (14, "cuda-backend-flag"),
                   (15, "apex"), (16, "apex-call"), (17, "liger-call"), (19, "qlora-bnb-config")]
    assert all(r.source.startswith("https://") and r.ascend for r in rules())


def test_cli_json_and_report_row(tiny_cpu_run, tmp_path):
    import shutil

    res = CliRunner().invoke(main, ["ops", "lint", str(S / "nanogpt_train.py"), "--json"])
    assert res.exit_code == 0, res.output
    assert {(f["line"], f["rule"]) for f in json.loads(res.output)["findings"]} == NANOGPT
    run = tmp_path / "run"
    shutil.copytree(tiny_cpu_run, run)
    # the old spelling still works, with a note naming the new verb
    res = CliRunner().invoke(main, ["ops", "scan", "--script", str(S), "--out", str(run / "script_scan.json")])
    assert res.exit_code == 0 and "is now `port ops lint PATH...`" in res.stderr
    from porting.report.rows import rows_operators
    from porting.rundir import read_run

    row = next(r for r in rows_operators(read_run(run)) if "CUDA habits" in r.item)
    assert row.status == "fail" and row.value.startswith("27 habit(s)")
