"""The `port` command as a user runs it: help with examples, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from porting.cli import main
from tests.conftest import ROOT, GOLDEN_TEXT


def port(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "porting", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _all_commands(group: click.Group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + (name,))


def test_every_help_ends_with_examples():
    from click.testing import CliRunner

    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0 and "Examples:" in top.output
    cmds = list(_all_commands(main))
    assert {"verify", "zoo"} <= {p[0] for p, _ in cmds}
    for path, _ in cmds:
        res = runner.invoke(main, [*path, "--help"])
        assert res.exit_code == 0, path
        tail = res.output.rstrip().split("Examples:")
        assert len(tail) >= 2 and "port " in tail[-1], f"`port {' '.join(path)} --help` lacks examples"


def test_zoo_list_and_show():
    res = port("zoo", "list", "--json")
    rows = json.loads(res.stdout)
    by = {r["name"]: r for r in rows}
    assert {"llama-7b", "llama-13b", "llama2-7b", "llama2-13b", "codellama-7b", "llama3-8b", "llama3.1-8b",
            "tinyllama-1.1b", "mistral-7b", "qwen2-7b", "stories260k", "llama3.2-1b", "llama3.2-3b", "qwen2.5-7b",
            "qwen2.5-14b", "deepseek-r1-distill-llama-8b"} == set(by)
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
    res = subprocess.run([sys.executable, "-m", "porting", "verify", "--hf", "llama-7b"], cwd=ROOT,
                         capture_output=True, text=True, env={**__import__("os").environ, "HF_HUB_CACHE": str(env_cache)})
    assert res.returncode == 2
    assert "huggyllama/llama-7b" in res.stderr and str(env_cache) in res.stderr


def test_verify_embedded_default_json_with_generation():
    res = port("verify", "--hf", "stories260k", "--generate", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    assert rep["passed"] and rep["generation"]["tokens_equal"] and rep["generation"]["golden_equal"]
    assert rep["generation"]["text"] == GOLDEN_TEXT


def test_sliding_window_longer_sequence_refused():
    import numpy as np
    import mindspore as ms

    from model_zoo import LlamaConfig, build
    from model_zoo.errors import ConfigError

    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, model_type="mistral", sliding_window=8)
    m = build(cfg)
    with pytest.raises(ConfigError, match="sliding_window=8"):
        m.forward_cached(ms.Tensor(np.zeros((1, 9), np.int32)), None)
