"""The hostile-input corpus: every case of every command folder, through the one harness.

    python -m pytest -q tests/attacks/test_corpus.py
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from tests.attacks import harness

FOLDERS = ("convert", "verify", "train", "diagnose", "ranktable", "report", "compare", "baseline", "generate",
           "zoo", "rehearse", "intake", "bisect", "ckpt", "launch", "templates", "nonfinite", "datasets", "models",
           "doctor", "diverge", "lora")
for _f in FOLDERS:
    importlib.import_module(f"tests.attacks.{_f}.cases")

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module", autouse=True)
def _imports_before_measuring():
    """The heavy libraries some commands import are loaded once up front, so the per-case memory bound
    (peak RSS growth) measures the case, not the first import of MindSpore or torch."""
    import mindspore  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import porting.cli  # noqa: F401


def test_corpus_size_and_every_folder_has_cases():
    by_folder = {f: sum(c.id.startswith(f + "/") for c in harness.CASES) for f in FOLDERS}
    assert len(harness.CASES) >= 120 and all(by_folder.values()), by_folder
    assert len({c.id for c in harness.CASES}) == len(harness.CASES), "two cases share a name"


@pytest.mark.parametrize("c", harness.CASES, ids=[c.id for c in harness.CASES])
def test_attack(c: harness.Case, tmp_path: Path):
    harness.run_case(c, tmp_path / "case")
