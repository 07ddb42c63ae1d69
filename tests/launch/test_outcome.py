"""Whether a launch finished or failed, and what a failed one left (porting/launch/outcome.py), one decision for
the plain and the supervised launch."""

from __future__ import annotations

from porting.launch.outcome import launch_outcome, mark
from porting.rundir import ranklog

STOP = ("step 3: loss is nan (grad norm nan); " + ranklog.window_phrase(3, 1, 3, True)
        + ", nonfinite.max_consecutive_skips is 2; their updates were not applied")


def _run(tmp_path):
    (tmp_path / "logs").mkdir()
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    (ck / "step_2").mkdir()
    (ck / ".tmp_step_4_9").mkdir()        # an earlier launch's leftover: not this launch's to remove
    for r in (0, 1):
        (tmp_path / "logs" / f"rank_{r}.log").write_text(f"2026-01-01T00:00:00.000 rank={r} INFO {ranklog.FINISHED}\n")
    return ck


def _log(tmp_path, rank: int, level: str, message: str) -> None:
    with open(tmp_path / "logs" / f"rank_{rank}.log", "a") as f:
        f.write(f"2026-01-01T00:00:01.000 rank={rank} {level} {message}\n")


def test_a_failed_launch_removes_only_its_own_half_written_saves_and_reads_the_stop_line(tmp_path):
    ck = _run(tmp_path)
    before = mark(tmp_path)
    for name in (".tmp_step_6_1", ".old_step_2_1"):   # .old_step_*: the previous copy of a step (swap_in)
        (ck / name).mkdir()
        (ck / name / "rank_00000.safetensors").write_bytes(b"x")
    for r in (0, 1):
        _log(tmp_path, r, "ERROR", STOP)
    done = launch_outcome(tmp_path, before, 3, [0, 1], clean=True)
    assert not done.finished and not done.crashed_at_exit and done.code == 3
    assert done.stop == (STOP, (1, 3)) and done.removed == (ck / ".tmp_step_6_1",)
    assert sorted(p.name for p in ck.iterdir()) == [".old_step_2_1", ".tmp_step_4_9", "step_2"]


def test_node_k_and_a_launch_still_running_remove_nothing(tmp_path):
    ck = _run(tmp_path)
    before = mark(tmp_path)
    (ck / ".tmp_step_6_1").mkdir()
    assert launch_outcome(tmp_path, before, 1, [0, 1], clean=False).removed == ()   # node k: node 0 holds them
    done = launch_outcome(tmp_path, before, None, [0, 1], clean=True)               # msrun has not exited yet
    assert not done.finished and done.removed == () and (ck / ".tmp_step_6_1").is_dir()


def test_exit_0_or_every_rank_logging_its_end_is_finished(tmp_path):
    _run(tmp_path)
    before = mark(tmp_path)
    assert launch_outcome(tmp_path, before, 0, [0, 1], clean=True).finished
    assert not launch_outcome(tmp_path, before, -11, [0, 1], clean=True).finished   # the earlier launch's lines
    for r in (0, 1):
        _log(tmp_path, r, "INFO", ranklog.FINISHED)
    done = launch_outcome(tmp_path, before, -11, [0, 1], clean=True)   # a worker segfaulted at exit
    assert done.finished and done.crashed_at_exit and done.stop is None and done.removed == ()
    assert not launch_outcome(tmp_path, before, -11, [0, 1, 2], clean=True).finished   # rank 2 never ended
