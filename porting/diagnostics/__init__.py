"""Migration diagnostics: environment (doctor), operator coverage (opscan), failed-job logs
(diagnose: grammar, field, scan, ranks, evidence, verdict, outcome, render) and run acceptance
reports (report). Rank tables and the cluster preflight are cluster set-up: ``porting/cluster``.

Each module is a typed library; ``porting/cli/<name>.py`` is the thin click layer over it.
"""

from __future__ import annotations

from pathlib import Path

from model_zoo.errors import DiagnosticsError  # noqa: F401 (the diagnostics commands' error, by its old name)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def load_yaml(name: str) -> dict:
    """A data table shipped in porting/data (parsed on each call; callers cache)."""
    import yaml

    path = DATA_DIR / name
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)
