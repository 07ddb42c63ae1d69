"""Shared fixtures. The real model and text come from what port ships (model_zoo/assets, porting/*/assets),
so a plain clone runs the whole real-model tier. ../shared is read only for material port does not ship
(Alpaca data, Ascend logs, rank tables): `shared_file` skips naming the absent file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


# scripts/test.sh runs the suite on two pytest-xdist workers (--dist loadgroup). Tests that start msrun
# jobs, or that read machine-wide state (free ports, running training processes: `port doctor`), all go
# to one worker, one after another, so they never see each other's workers or race for a port.
MACHINE_WIDE = {"tests/test_cli.py", "tests/diagnostics/test_doctor.py", "tests/diagnostics/test_preflight.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        if "msrun" in item.keywords or rel in MACHINE_WIDE:
            item.add_marker(pytest.mark.xdist_group("machine"))
    if _has_npu():
        return
    skip = pytest.mark.skip(reason="needs a real Ascend NPU")
    for item in items:
        if "npu" in item.keywords:
            item.add_marker(skip)


def shared_file(relpath: str) -> Path:
    """``../shared/<relpath>``, test material port does not ship; skips, naming it, where it is absent."""
    path = SHARED / relpath
    if not path.exists():
        pytest.skip(f"needs ../shared/{relpath} (test material port does not ship), not found at {path}")
    return path


@pytest.fixture(scope="session")
def shared() -> Path:
    """The ../shared folder itself, for tests that read several files of it (see `shared_file`)."""
    if not SHARED.is_dir():
        pytest.skip(f"needs ../shared (test material port does not ship), not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    """The real stories260K as port ships it (tests/model_zoo/test_real_model.py checks it is shared's)."""
    return EMBEDDED


@pytest.fixture(scope="session")
def tiny_cpu_run(tmp_path_factory) -> Path:
    """The run directory of `port train recipes/tiny-cpu.yaml`, run once as a user runs it (from the
    command line, in a directory of its own), for the tests that read a finished run: copy it to change it."""
    work = tmp_path_factory.mktemp("tiny-cpu")
    (work / "recipes").symlink_to(ROOT / "recipes")
    p = subprocess.run([sys.executable, "-m", "porting", "train", "recipes/tiny-cpu.yaml"], cwd=work,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "done: 20 steps" in p.stdout + p.stderr, p.stderr[-3000:]
    return work / "runs" / "tiny-cpu"


@pytest.fixture(scope="module")
def graph_mode_module():
    """GRAPH_MODE while a module's module-scoped fixtures compile and train (request it with
    ``pytest.mark.usefixtures("graph_mode_module")`` beside ``pytest.mark.graph_mode``)."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture(autouse=True)
def _mindspore_mode(request):
    """Tests share one process: each test starts in PyNative (an in-process `port train` switches to
    graph mode and must not leave it on for the next one), or in GRAPH_MODE when marked ``graph_mode``.
    Set per test, after any module-scoped fixture, so a test body runs in the mode its marker says."""
    import mindspore as ms

    graph = request.node.get_closest_marker("graph_mode") is not None
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)
