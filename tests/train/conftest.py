"""Helpers for the `port train` tests: free ports, small run settings, reading a run (the CLI itself:
tests/helpers.py)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SHARED
from tests.fixtures import alpaca_written

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny-cpu.yaml"
# Small and fast: one padded shape (one compiled graph), few steps, no HF export unless asked.
FAST = ["--set", "data.max_seq_length=64", "--set", "batching.bucketing.enabled=false",
        "--set", "checkpointing.export_hf=false"]


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


ALPACA_REAL = SHARED / "data/instruct/alpaca_en_demo.json"  # CC BY-NC: tests only, port does not ship it


@pytest.fixture(scope="session")
def alpaca(tmp_path_factory) -> Path:
    """Alpaca data: the real demo where ../shared is present, else the set written for the tests
    (tests/fixtures/alpaca_written.py: 999 rows, lengths spread like the real file's). One of the two, so the
    bucketing run is paid once."""
    if ALPACA_REAL.exists():
        return ALPACA_REAL
    return alpaca_written.write(tmp_path_factory.mktemp("alpaca"))
