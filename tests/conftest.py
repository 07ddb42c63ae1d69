"""Shared fixtures. Tests may read ../shared (real model, data, logs); the product never does."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("PORT_SHARED", ROOT.parent / "shared"))
EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
GOLDEN_TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
               "One day, she saw a big, red ball. She wanted to play with it, but it was too high")
GOLDEN_FIRST_IDS = [403, 407, 261, 378, 432, 383, 286, 261, 376, 298]


def _has_npu() -> bool:
    return shutil.which("npu-smi") is not None or Path("/dev/davinci0").exists()


def pytest_collection_modifyitems(config, items):
    if _has_npu():
        return
    skip = pytest.mark.skip(reason="needs a real Ascend NPU")
    for item in items:
        if "npu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"../shared not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def stories_dir(shared) -> Path:
    """The real stories260K model from ../shared (the embedded copy is tested to be identical)."""
    return shared / "data" / "models" / "stories260k"


@pytest.fixture(autouse=True)
def _pynative_by_default():
    """Tests share one process: a test that switches MindSpore to graph mode (an in-process
    `port train`) must not leave it on for the next one."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)
