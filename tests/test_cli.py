"""The `port` command as a user runs it: every help example run, one-line errors, exit codes."""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from porting.cli import main
from tests.conftest import ROOT
from tests.helpers import port


def _all_commands(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + (name,))


def help_examples() -> list[str]:
    """Every example of every `port ... --help` (the lines after "Examples:", continuations joined),
    each once, in help order. Fails for a help without examples."""
    runner, seen = CliRunner(), []
    for path in [()] + [p for p, _ in _all_commands(main)]:
        res = runner.invoke(main, [*path, "--help"], terminal_width=200)
        assert res.exit_code == 0, (path, res.output)
        assert "Examples:" in res.output, f"`port {' '.join(path)} --help` has no examples"
        lines, cur = [], ""
        for line in res.output.split("Examples:", 1)[1].lstrip("\n").splitlines():
            if not line.strip(" \b"):  # a blank line (or click's \b paragraph mark) ends the examples
                break
            cur += line.strip()
            if cur.endswith("\\"):
                cur = cur[:-1].rstrip() + " "
                continue
            lines.append(cur)
            cur = ""
        assert lines and all(ln.startswith(("port ", "HCCL_")) for ln in lines), (path, lines)
        seen += [ln for ln in lines if ln not in seen]
    # the same command shown twice (with and without a comment) runs once
    keys = [tuple(shlex.split(ln, comments=True)) for ln in seen]
    return [ln for i, ln in enumerate(seen) if keys[i] not in keys[:i]]


# Examples that cannot run as written on this machine, and how they are run instead. Every other
# example runs as written, in a fresh copy of a work directory holding what the examples name
# (`_workdir`), and must exit 0. A new example must run, or be listed here.
DRY_RUN = {  # need a cluster (several devices or nodes): run with --dry-run appended
    "port train recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --run-dir runs/dp2   # 2 msrun workers",
    # real resumes (kill -9 included) are tests/train/test_train.py's; this one plans it on the set-up run
    "port train recipes/tiny-cpu.yaml --resume                  # continue from the last checkpoint",
    "port train recipes/tiny-cpu.yaml --set batching.grad_accum_steps=2 --set schedule.max_steps=10",
    # the whole ladder of the 13B shape takes minutes: tests/test_rehearse.py runs it
    "port rehearse recipes/13b-32card.yaml --out runs/rehearse-13b             # the whole ladder (minutes)",
    # supervised msrun runs with faults are tests/train/test_supervise.py's
    "port train recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --supervise   # watch, diagnose, resume",
}
# Generation examples decode 8 tokens instead of their 40-256 (the slowest part of this test otherwise):
# the same path; all 60 golden tokens are checked by the `port verify --generate` example below and by
# tests/model_zoo/test_real_model.py.
SHORT = {
    "port generate --hf stories260k --max-new-tokens 60",
    "port generate --hf stories260k",
    "port generate --hf stories260k --prompt \"Once upon a time\" --max-new-tokens 40",
}
# Examples whose whole run another test holds: run with these arguments appended (the command line is the same up
# to them), so the example is still parsed and started for real
CHEAPER = {
    # the doctor's msrun smoke jobs are tests/cluster/test_preflight.py's (a pass and a diagnosed failure)
    "port doctor --cluster recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --set cluster.master_port=29517":
        ("--no-smoke",),
    # a LoRA baseline of 50 steps against port train is tests/train/test_lora_train.py's; 1 step here
    "port baseline run --recipe recipes/tiny-cpu.yaml --set lora.target_modules=all-linear --out lora.json --steps 8":
        ("--steps", "1"),
    # the two fingerprinted runs `port diverge` compares are tests/diverge/test_diverge.py's; one epoch (4 steps)
    # here, where the whole recipe's 20 steps took 17-22 s of the test's ~100
    "port train recipes/tiny-cpu.yaml --set execution=pynative --set logging.fingerprint_every=1 --set output_dir=runs/a":
        ("--set", "schedule.epochs=1"),
    "port baseline run --recipe recipes/tiny-cpu.yaml --set logging.fingerprint_every=1 --out base.json":
        ("--set", "schedule.epochs=1"),
}
NOT_HERE = "is not in the local HF cache"
NO_DIR = "no such directory"
FAILS = {  # need a model, a GPU or cluster files this machine has not: (exit code, the documented error)
    "port train recipes/7b-8card.yaml --dry-run --calibration runs/rehearse-7b   # step from measured pieces":
        (2, "no calibration.json there; run `port rehearse RECIPE --out runs/rehearse-7b`"),
    "port convert --hf llama-7b --out ./llama-7b-ms": (2, NOT_HERE),
    "port convert --hf llama-7b --out ./llama-7b-ms --format ckpt": (2, NOT_HERE),
    "port verify --hf llama-7b --seq 16 --batch 1 # zoo name, found in the local HF cache": (2, NOT_HERE),
    "port convert --hf /models/Llama-2-7b-hf --out ./llama2-7b-ms --dtype bf16": (2, NO_DIR),
    "port convert --hf /models/Llama-2-13b-hf --out ./13b-ms --source-hash": (2, NO_DIR),
    "port convert --ms ./llama2-7b-ms --out ./llama2-7b-hf": (2, NO_DIR),
    "port convert --ms runs/r1/checkpoints/step_100 --config ./base/config.json --out ./ft-hf": (2, NO_DIR),
    "port convert --hf ./my-model --out ./my-model-ms --force --quiet": (2, NO_DIR),
    "port generate --hf ./my-llama --prompt \"def fib(n):\" --cache dynamic": (2, NO_DIR),
    "port ops scan --hf ./my-llama --attn eager --json > ops.json": (2, NO_DIR),
    "port ops zoo --hf ./my-llama --device CPU --json": (2, NO_DIR),
    "port verify --hf ./my-llama --hidden-states --grads --json": (2, NO_DIR),
    "port verify --hf ./my-llama --ms ./my-llama-ms --no-roundtrip --rehash-source": (2, NO_DIR),
    "port ops scan --module mypkg.models:build   # factory returning (model, inputs)":
        (2, "cannot import mypkg.models"),
    "port baseline run --hf ./llama-7b --recipe recipes/7b-8card.yaml --device cuda --steps 20 --out llama7b_h200.json":
        (2, "data.path: file not found: data/train.jsonl"),
    "port compare h200.json runs/7b --min-throughput-ratio 0.8 --max-memory-ratio 1.2": (2, "no such baseline file"),
    "port eval --hf ./my-llama --data held_out.jsonl --chat-template model --json": (2, NO_DIR),
    "port eval --ms ms/my-llama --data held_out.parquet --reference ./my-llama": (2, NO_DIR),
    "port train recipes/13b-32card.yaml --launch-node 2         # run node 2's msrun command here":
        (2, "data.path: file not found: data/train.jsonl"),   # a real launch reads the data first
    "port zoo add r1-8b --hf deepseek-ai/DeepSeek-R1-Distill-Llama-8B   # found in the local HF cache":
        (2, "not in the local HF cache"),
    # a 13B node's disk: 3 checkpoints kept while a save completes + the HF export (issue 47: the doctor checks it)
    "port doctor --cluster recipes/13b-32card.yaml --node-rank 1 --fingerprint-dir /shared/port_fp --no-smoke":
        (1, "disk space: 533.5 GiB needed at the peak"),
    # two runs with fingerprints are tests/diverge/test_diverge.py's (relaunch, baseline, TP 2, planted cases)
    "port diverge runs/a base.json                      # port against its PyTorch baseline":
        (2, "runs/a: no fingerprints there"),
    "port diverge runs/a runs/b --json --out runs/a/diverge.json   # `port report runs/a` shows the verdict":
        (2, "folder runs/a does not exist"),
    "port diagnose ./pasted_logs --rank-table rank_table.json   # socket peers mapped to ranks":
        (2, "pasted_logs: no such directory"),
    # a CUDA job's own files (tests/intake/ runs these commands on the real public fixtures)
    "port baseline import ./runs/events.out.tfevents.1700000000.host --loss-tag Loss/train --out cuda_base.json":
        (2, "cannot read the event file"),
    "port baseline import ./job/trainer_state.json --global-batch 64 --seq-length 2048 --out cuda_base.json":
        (2, "trainer_state.json not found"),
    "port ops lint ./train.py": (2, "train.py: no such file or directory"),
    "port ops lint ./train.py ./patches/ --json": (2, "train.py: no such file or directory"),
    "port ops lint ./job/ --out migration/script_scan.json": (2, "job: no such file or directory"),
    "port recipe import ./job/training_args.bin ./job/ds_z2_config.json --model llama2-7b --out recipe.yaml":
        (2, "training_args.bin not found"),
    "port recipe import ./job/llama3_full_sft.yaml --cluster atlas-800t-a3 --nodes 2 --data data/train.jsonl --out r.yaml":
        (2, "config not found"),
    "port recipe import ./job/args.json --source-gpus 8 --out r.yaml --json": (2, "config not found"),
    "port intake ./cuda_job --out ./migration --model llama2-7b": (2, "cuda_job: not a directory"),
    # a LoRA run's checkpoint over an 8B base (tests/train/test_lora_train.py merges and exports real ones)
    "port ckpt merge runs/lora/checkpoints/step_20 --out lora-adapter --adapter-only --model ./llama3-8b":
        (2, "step_20: does not exist"),
    "port intake ./cuda_job --out ./migration --cluster atlas-800t-a3 --nodes 2 --source-gpus 8 --json":
        (2, "cuda_job: not a directory"),
    # the set-up table is one server of 8 devices: checked against a bigger cluster, it is refused
    "port ranktable check rank_table.json --nodes 2 --cards-per-node 16": (1, "expects cards_per_node=16"),
    "port ranktable check rank_table.json --nodes 4 --cards-per-node 16 --json": (1, "expects cards_per_node=16"),
    "port ranktable gen --server node_0:172.16.0.110 --server node_1:172.16.0.111 --devices 0-7 "
    "--hccn-conf node_0=/etc/hccn.conf --hccn-conf node_1=hccn_node1.conf --out rank_table.json":
        (2, "hccn.conf not found"),
}
# What a few examples must print (beyond exiting 0).
OUTPUT = {
    "port verify --hf stories260k --generate      # plus greedy text vs HF generate and the golden text":
        "ok      matches the model's golden continuation",
    "port compare base.json runs/tiny-cpu": "RESULT: PASS",
    "port baseline import runs/tiny-cpu/metrics.jsonl --global-batch 4 --out cuda.json && port compare cuda.json "
    "runs/tiny-cpu --window 5": "RESULT: PASS",
    "port zoo show stories260k": '"hidden_size": 64',
}
# Run first, once, to make the work directory the other examples use (results checked there too);
# the first is tests/conftest.py's `tiny_cpu_run`.
SETUP = ("port train recipes/tiny-cpu.yaml",
         "port baseline run --recipe recipes/tiny-cpu.yaml --device cpu --out base.json --steps 8",
         "port ranktable gen --server node_0 --devices 0-7 --out rank_table.json",
         # each example's copy of the work directory then has its own registry naming my-llama
         "port zoo add my-llama --hf ./checkpoints/my-llama")


def _steps(line: str, work: Path) -> list[tuple[dict, list[str], str | None]]:
    """A shell example line as (env, argv after `port`, file stdout goes to) per `&&` step."""
    steps, env, argv, redirect, words = [], {}, [], None, shlex.split(line, comments=True) + ["&&"]
    it = iter(words)
    for w in it:
        if w == "&&":
            assert argv[0] == "port", line
            steps.append((env, argv[1:], redirect))
            env, argv, redirect = {}, [], None
        elif w == ">":
            redirect = next(it)
        elif not argv and "=" in w:
            env.update([w.split("=", 1)])
        else:
            # ~ is the work directory; absolute /tmp paths are kept inside it too
            argv.append(str(work / w[2:]) if w.startswith("~/") else
                        str(work / w[1:]) if w.startswith("/tmp/") else w)
    return steps


def _run_example(line: str, work: Path, extra: tuple[str, ...] = ()) -> tuple[int, str, str]:
    """Run an example in-process (as `port` would, in ``work``); (exit code, stdout, stderr)."""
    out, err, code = "", "", 0
    for env, argv, redirect in _steps(line, work):
        # an empty HF cache of its own: zoo names other than stories260k are "not downloaded" everywhere
        res = port(*argv, *extra, cwd=work, env={"HOME": str(work), "HF_HOME": None,
                                                 "HF_HUB_CACHE": str(work / "hf-cache"),
                                                 "PORT_ZOO_FILE": str(work / "zoo.json"), **env})
        assert "Traceback (most recent call last)" not in res.stderr, f"{line}: traceback\n{res.stderr[-3000:]}"
        if redirect:
            (work / redirect).write_text(res.stdout)
        out, err, code = out + res.stdout, err + res.stderr, res.returncode
        if code:
            break
    return code, out, err


@pytest.fixture(scope="module")
def example_workdir(tmp_path_factory, tiny_cpu_run) -> Path:
    """What the examples name: the shipped recipes, a real run of the tiny recipe, its baseline, a rank
    table, and that run under the other names the examples use for a run or its logs."""
    work = tmp_path_factory.mktemp("examples") / "work"
    work.mkdir()
    (work / "recipes").symlink_to(ROOT / "recipes")
    shutil.copytree(ROOT / "model_zoo" / "assets" / "stories260k", work / "checkpoints" / "my-llama")  # zoo add
    (work / "porting" / "train").mkdir(parents=True)   # the shipped TinyStories sample, as the eval example names it
    (work / "porting" / "train" / "assets").symlink_to(ROOT / "porting" / "train" / "assets")
    for name in ("tiny-cpu", "llama7b", "other", "x"):
        shutil.copytree(tiny_cpu_run, work / "runs" / name)
    shutil.copytree(tiny_cpu_run / "logs", work / "msrun_logs")
    shutil.copytree(tiny_cpu_run / "logs", work / "ascend" / "log")
    for line in SETUP[1:]:
        code, _, err = _run_example(line, work)
        assert code == 0, f"{line}\n{err[-3000:]}"
    for i in (0, 1):  # one server's table each, with device IPs, for `ranktable merge`
        ips = " ".join(f"--device-ip node_{i}:{d}=192.168.{i}.{10 + d}" for d in range(8))
        line = f"port ranktable gen --server node_{i}:10.0.0.{i + 1} --devices 0-7 {ips} --out node{i}.json"
        assert _run_example(line, work)[0] == 0, line
    return work


@pytest.mark.slow
def test_every_help_example_runs(example_workdir, tmp_path):
    """Every example in every `port ... --help` runs: as written, with --dry-run where it needs a
    cluster, or failing with the documented message where it needs what this machine lacks."""
    assert {"baseline", "compare", "convert", "diagnose", "doctor", "generate", "ops", "ranktable", "report",
            "train", "verify", "zoo"} <= set(main.commands)
    examples = help_examples()
    for table in (DRY_RUN, SHORT, FAILS, OUTPUT, CHEAPER):
        assert set(table) <= set(examples), f"not an example (any more): {set(table) - set(examples)}"
    assert set(SETUP[:2]) <= set(examples)
    for i, line in enumerate(examples):
        if line in SETUP:  # ran in the fixture
            continue
        work = tmp_path / f"ex{i}"
        shutil.copytree(example_workdir, work, symlinks=True)
        t0 = time.perf_counter()
        extra = ("--dry-run",) if line in DRY_RUN else ("--max-new-tokens", "8") if line in SHORT else \
            CHEAPER.get(line, ())
        code, out, err = _run_example(line, work, extra)
        print(f"{time.perf_counter() - t0:6.1f} s  {line}")  # shown with -s: where the time goes
        if line in FAILS:
            want_code, want = FAILS[line]
            last = [ln for ln in err.splitlines() if ln.strip()][-1:]
            assert code == want_code and last and last[0].startswith("error: ") and want in last[0], \
                f"{line}: expected exit {want_code} and one line naming {want!r}, got {code}:\n{err[-2000:]}"
            continue
        assert code == 0, f"{line}: exit {code}\n{err[-3000:]}"
        assert OUTPUT.get(line, "") in out + err, f"{line}: {OUTPUT[line]!r} not in its output:\n{out[-2000:]}"


def test_zoo_list_and_show():
    res = port("zoo", "list", "--json")
    rows = json.loads(res.stdout)
    by = {r["name"]: r for r in rows}
    assert {"llama-7b", "llama-13b", "llama2-7b", "llama2-13b", "codellama-7b", "llama3-8b", "llama3.1-8b",
            "tinyllama-1.1b", "mistral-7b", "qwen2-7b", "stories260k", "llama3.2-1b", "llama3.2-3b", "qwen2.5-7b",
            "qwen2.5-14b", "deepseek-r1-distill-llama-8b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b",
            "qwen3-14b", "qwen3-32b"} == set(by)
    assert by["llama-7b"]["params"] == 6_738_415_616
    show = json.loads(port("zoo", "show", "llama3.1-8b").stdout)
    assert show["config.json"]["rope_scaling"]["rope_type"] == "llama3"


def test_unknown_zoo_name_is_one_line_with_suggestion():
    res = port("zoo", "show", "lama-7b")
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "did you mean llama-7b" in res.stderr and "Traceback" not in res.stderr


def test_verify_missing_dir_and_unsupported_arch(tmp_path):
    res = port("verify", "--hf", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no such directory" in res.stderr and res.stderr.count("\n") == 1
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    res = port("verify", "--hf", str(tmp_path))
    assert res.returncode == 2 and "LlamaForCausalLM" in res.stderr and res.stderr.count("\n") == 1


def test_verify_missing_from_hf_cache_names_repo(tmp_path, monkeypatch):
    env_cache = tmp_path / "hub"
    res = port("verify", "--hf", "llama-7b", env={"HF_HUB_CACHE": str(env_cache)})
    assert res.returncode == 2
    assert "huggyllama/llama-7b" in res.stderr and str(env_cache) in res.stderr


def test_sliding_window_longer_sequence_refused():
    import numpy as np
    import mindspore as ms

    from model_zoo import LlamaConfig, build
    from model_zoo.decode import forward_cached
    from model_zoo.errors import ConfigError

    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, model_type="mistral", sliding_window=8)
    m = build(cfg)
    with pytest.raises(ConfigError, match="sliding_window=8"):
        forward_cached(m, ms.Tensor(np.zeros((1, 9), np.int32)), None)
