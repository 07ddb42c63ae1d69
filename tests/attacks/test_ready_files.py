"""The precompile ready files (porting/train/run/step/ready.py): rank 0's cleanup removes only the ``logs/.ready_*``
folders port wrote (ready files alone), never a folder of that name holding anything else, nor a link's target."""

from __future__ import annotations

import os

from porting.train.run.step import ready


def test_clear_removes_port_ready_folders_only(tmp_path):
    logs = tmp_path / "logs"
    ours, dead, user, outside = logs / ".ready_1-5", logs / ".ready_2-7", logs / ".ready_notes", tmp_path / "keep"
    for d in (ours, dead, user, outside):
        d.mkdir(parents=True)
    (ours / "rank_0").write_text("1")
    (ours / "rank_1").write_text("2")
    (dead / ".rank_3.tmp").write_text("3")          # a launch that died mid-write
    (user / "rank_0").write_text("mine")
    (user / "notes.txt").write_text("a user's file")   # not a ready file: the folder is not port's
    (outside / "rank_0").write_text("outside")
    os.symlink(outside, logs / ".ready_link")
    ready.clear(tmp_path)
    assert sorted(p.name for p in logs.iterdir()) == [".ready_link", ".ready_notes"]
    assert (user / "notes.txt").read_text() == "a user's file" and (user / "rank_0").read_text() == "mine"
    assert (outside / "rank_0").read_text() == "outside"
