"""The precompile ready files (porting/train/run/step/ready.py): after the barrier, rank 0 removes what this launch
wrote (its own ``logs/.ready_<launch>/rank_<r>`` files, then the folder if empty) and nothing else: not a folder of
another launch, not an empty ``.ready_*`` folder, not a user's file whose name looks like a ready file, not a link's
target. The ranks and rank 0's cleanup are real processes, children of one parent as msrun's workers are; every file
under the case is hashed before and after (tests/attacks/harness.py ``snapshot``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.attacks.harness import ROOT, changes, snapshot

WRITE = """import sys; from pathlib import Path; from porting.train.run.step import ready
for run in map(Path, sys.argv[1:]):
    ready.meet_node(run, 0, 1, 30, print); ready.meet_node(run, 1, 2, 30, print)
print(ready.launch_dir(run).name)"""
CLEAR = """import sys; from pathlib import Path; from porting.train.run.step import ready
for run in map(Path, sys.argv[1:]):
    ready.clear(run, 2)"""


def _child(code: str, *runs: Path) -> str:
    return subprocess.run([sys.executable, "-c", code, *map(str, runs)], cwd=ROOT, check=True, timeout=60,
                          capture_output=True, text=True).stdout.strip()


def test_rank_0_removes_only_what_this_launch_wrote(tmp_path):
    """Two runs, one launch (two children of this test, as msrun's workers are of msrun): in ``run``, hostile
    neighbours of this launch's folder; in ``kept``, a user's files inside this launch's folder itself."""
    run, kept, outside = tmp_path / "run", tmp_path / "kept", tmp_path / "outside"
    ours = _child(WRITE, run, kept).splitlines()[-1]       # two ranks of this launch wrote their ready files
    logs = run / "logs"
    assert sorted(p.name for p in (logs / ours).iterdir()) == ["rank_0", "rank_1"]
    dead, empty, user = logs / ".ready_1-5", logs / ".ready_empty", logs / ".ready_notes"
    for d in (dead, empty, user, outside):
        d.mkdir(parents=True)
    (dead / "rank_0").write_text("4242")                  # another launch's: port cannot prove it wrote it
    (user / "rank_0").write_text("mine")                  # a user's file named like a ready file
    (outside / "rank_0").write_text("1")
    os.symlink(outside, logs / ".ready_link")
    (kept / "logs" / ours / "rank_7").write_text("123")    # not one of this launch's 2 workers
    (kept / "logs" / ours / "notes.txt").write_text("mine")
    before = snapshot(tmp_path, None)
    _child(CLEAR, run, kept)
    assert changes(before, snapshot(tmp_path, None)) == [
        f"removed kept/logs/{ours}/rank_0", f"removed kept/logs/{ours}/rank_1",
        f"removed run/logs/{ours}", f"removed run/logs/{ours}/rank_0", f"removed run/logs/{ours}/rank_1"]
