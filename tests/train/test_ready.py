"""The node's ranks meet after their compiles through files (porting/train/run/step/ready.py): real processes,
children of one parent as msrun's workers are."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK = """
import sys, time
from pathlib import Path
from porting.train.run.step import ready
run, rank, workers, sleep, limit, late = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
time.sleep(sleep)
try:
    waited = ready.meet_node(run, rank, workers, limit, print, late_s=late)
except Exception as e:
    print(type(e).__name__, e)
    sys.exit(3)
print(f"waited {waited:.2f}")
"""


def _rank(run: Path, rank: int, workers: int, sleep: float, limit: float = 60.0, late: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RANK, str(run), str(rank), str(workers), str(sleep), str(limit),
                             str(late)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_the_early_rank_waits_for_the_late_one_and_stale_launches_do_not_count(tmp_path):
    stale = tmp_path / "logs" / ".ready_1-999"   # a dead launch's ready file: not this launch's
    stale.mkdir(parents=True)
    (stale / "rank_1").write_text("1")
    t0 = time.monotonic()
    early, late = _rank(tmp_path, 0, 2, 0.0), _rank(tmp_path, 1, 2, 4.0)
    out0, out1 = early.communicate(timeout=60)[0], late.communicate(timeout=60)[0]
    assert early.returncode == 0 and late.returncode == 0, (out0, out1)
    waited0 = float(out0.split("waited ")[1])
    assert waited0 >= 3.0 and time.monotonic() - t0 >= 4.0, out0   # rank 0 did not pass on the stale file
    assert float(out1.split("waited ")[1]) < 1.0
    dirs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert len(dirs) == 2 and ".ready_1-999" in dirs   # one folder for this launch (the test's pid), one stale
    # rank 0 clears as a child of the same parent (the launch): this launch's folder goes, the stale one stays
    # (port cannot prove it wrote it: tests/attacks/test_ready_files.py)
    clear = "import sys; from pathlib import Path; from porting.train.run.step import ready; ready.clear(Path(sys.argv[1]), 2)"
    subprocess.run([sys.executable, "-c", clear, str(tmp_path)], cwd=ROOT, check=True, timeout=60)
    assert [p.name for p in (tmp_path / "logs").iterdir()] == [".ready_1-999"]


def test_a_rank_that_never_arrives_is_one_error_line_after_the_limit(tmp_path):
    p = _rank(tmp_path, 0, 2, 0.0, limit=1.0)
    out = p.communicate(timeout=60)[0]
    assert p.returncode == 3
    assert out.startswith("GraphCompileError rank 0: 1 of 2 ranks of this node finished compiling in 1 s") and \
        "logs/rank_*.log" in out and out.count("\n") == 1, out


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_a_late_rank_marks_itself_ready_that_long_after_the_others_whatever_their_start(tmp_path):
    """The test hook's rank (PORT_TEST_COMPILE_DELAY) waits for the others first: rank 0, which starts 3 s after
    it, still waits the full 2 s."""
    late, early = _rank(tmp_path, 1, 2, 0.0, late=2.0), _rank(tmp_path, 0, 2, 3.0)
    out1, out0 = late.communicate(timeout=60)[0], early.communicate(timeout=60)[0]
    assert late.returncode == 0 and early.returncode == 0, (out0, out1)
    assert "rank 1 is ready 2 s after the others" in out1
    assert float(out0.split("waited ")[1]) >= 2.0, out0
