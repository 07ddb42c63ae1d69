"""Helpers for the `port train` tests: the CLI in a subprocess, free ports, small run settings."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny-cpu.yaml"
# Small and fast: one padded shape (one compiled graph), few steps, no HF export unless asked.
FAST = ["--set", "data.max_seq_length=64", "--set", "batching.bucketing.enabled=false",
        "--set", "checkpointing.export_hf=false"]


def port(*args: str, check: bool = False, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    p = subprocess.run([sys.executable, "-m", "porting", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=env, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"port {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert lines, f"no error line in stderr:\n{p.stderr[-2000:]}"
    return lines[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(run_dir: Path) -> tuple[list[dict], dict | None]:
    """The run's step records and summary, read by the product's one reader (porting.rundir), as the
    dicts they are written as. A test run must not leave a malformed line."""
    from porting.rundir import read_metrics

    m = read_metrics(run_dir / "metrics.jsonl")
    assert m.warning is None, m.warning
    return [r.to_dict() for r in m.steps], (m.summary.to_dict() if m.summary else None)


TINYSTORIES = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"   # shipped with port train


def alpaca_rows(text: str) -> list[dict]:
    """Alpaca rows (instruction, input, output) cut from real stories, as long and as varied as an
    instruction data set's: each sentence asks for the next 1, 2, 3, 5, 8 or 13 sentences, every third
    one with the story so far as its input (so some prompts alone fill a 256-token window)."""
    rows = []
    for story in (s.strip() for s in text.split("<|endoftext|>")):
        sents = re.split(r"(?<=[.!?])\s+", " ".join(story.split())) if story else []
        for i in range(len(sents) - 1):
            for k in (1, 2, 3, 5, 8, 13):
                out = " ".join(sents[i + 1:i + 1 + k])
                if i % 3 == 2:
                    rows.append({"instruction": "Continue the story.", "input": " ".join(sents[:i + 1]),
                                 "output": out})
                else:
                    rows.append({"instruction": f"Tell the story that begins: {sents[i]}", "input": "",
                                 "output": out})
    return rows


@pytest.fixture(scope="session")
def alpaca(tmp_path_factory) -> Path:
    """An Alpaca-format file (390 rows of varied length) made from the TinyStories text port ships, so the
    data and bucketing tests run from a plain clone (the Alpaca demo in ../shared is CC BY-NC and not shipped)."""
    path = tmp_path_factory.mktemp("alpaca") / "alpaca_tinystories.json"
    path.write_text(json.dumps(alpaca_rows(TINYSTORIES.read_text(encoding="utf-8")), indent=1), encoding="utf-8")
    return path
