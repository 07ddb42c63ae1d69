"""The rank log and the heartbeat beside it (porting/rundir/ranklog.py, heartbeat.py): every line another process
reads is written by the module's own writer and read back by its own reader, so a reworded line fails here, not
in a supervised run; `port diagnose`'s patterns read the same lines; the heartbeat record follows the lines."""

from __future__ import annotations

import json
import logging

import pytest

from porting.diagnostics import grammar
from porting.rundir import ranklog
from porting.rundir.heartbeat import Heartbeat, read_beat
from porting.rundir.ranklog import StepLine

STEP_1 = dict(loss=2.5, lr=1e-3, grad_norm=0.5, tokens_per_s=1234.0, step_time_s=0.125, padding=0.25, compile=False,
              shapes=(64, 128), graphs=2, skip_reason=None)
STEP_2 = dict(STEP_1, loss=float("nan"), compile=True, shapes=(64,), graphs=3, skip_reason="nonfinite")
STOP = ("step 5: loss is nan (grad norm nan); " + ranklog.window_phrase(3, 3, 5, True)
        + ", nonfinite.max_consecutive_skips is 2; their updates were not applied")


@pytest.fixture
def written(tmp_path):
    """A run directory whose rank 3 logged every line others read, in a run's order; (run dir, log text, beats
    after each call)."""
    log = ranklog.open_log(tmp_path, 3, echo=False)
    rl = ranklog.RankLog(log, Heartbeat(tmp_path, 3))
    beats = []

    def seen():
        beats.append(read_beat(tmp_path / "heartbeat" / "rank_3.json"))

    rl.started(3, 4, 4242, "parallel_mode data_parallel", distributed=True)
    seen()
    rl.phase("compile")
    seen()
    rl.step(1, 10, **STEP_1)
    seen()
    rl.saving(1)
    seen()
    rl.saved(1, tmp_path / "checkpoints" / "step_1")
    seen()
    rl.step(2, 10, **STEP_2)
    log.warning("fallback: something")
    rl.failed(STOP)
    rl.finished()
    seen()
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    return tmp_path, (tmp_path / "logs" / "rank_3.log").read_text(), beats


def test_every_line_written_is_read_back_by_the_same_module(written):
    run, text, _ = written
    lines = text.splitlines()
    assert len(lines) == 8 and all(ranklog.LINE.match(ln)[1] == "3" for ln in lines)
    assert [ranklog.LINE.match(ln)[2] for ln in lines].count("ERROR") == 1
    assert ranklog.pid_of(text) == 4242
    assert ranklog.read_steps(text)[0] == StepLine(1, 10, 2.5, 1e-3, 0.5, 1234.0, 0.125, 0.25, False, (64, 128), 2, None)
    second = ranklog.read_steps(text)[1]
    assert (second.step, second.compile, second.shapes, second.graphs, second.skip_reason) == (2, True, (64,), 3,
                                                                                              "nonfinite")
    assert [m[1] for m in ranklog.SAVING.finditer(text)] == ["1"]
    assert [m[1] for m in ranklog.SAVED.finditer(text)] == [str(run / "checkpoints" / "step_1")]
    assert ranklog.stop_line(run / "logs", {}) == (STOP, (3, 5))
    assert ranklog.all_finished(run / "logs", {}, [3])


def test_the_heartbeat_follows_the_lines(written):
    _, _, beats = written
    assert [(b.phase, b.step) for b in beats] == [("setup", None), ("compile", None), ("step", 1), ("save", 1),
                                                   ("step", 1), ("finished", None)]
    assert [b.seq for b in beats] == [1, 2, 3, 4, 5, 7] and {b.rank for b in beats} == {3}


def test_a_reworded_line_is_not_read():
    """The readers are the writers' exact words: another wording (an edit to one side only) reads as nothing."""
    assert ranklog.read_steps(" INFO step 3 of 10 loss 2.0") == []
    assert ranklog.pid_of(" INFO rank 0 of 2 pid 17") is None
    assert not ranklog.SAVING.search(" INFO saving checkpoint at step 3")
    assert not ranklog.WINDOW.search("3 non-finite steps running (steps 1..3)")
    for in_a_row in (True, False):
        m = ranklog.WINDOW.search(ranklog.window_phrase(7, 2, 8, in_a_row))
        assert [int(g) for g in m.groups() if g is not None] == [2, 8]


def test_port_diagnose_reads_the_same_lines(written):
    """`port diagnose` takes its rank-log patterns from the owner: the file kind and rank, the rank in the text,
    the level, the message without its prefix, the step line's step and the error line."""
    _, text, _ = written
    assert grammar.classify_file("logs/rank_3.log") == ("port_rank", 3)
    raw = [ln.encode() for ln in text.splitlines()]
    assert grammar.rank_from_content(raw[0]) == 3
    steps = [int(m[1]) for ln in raw if not grammar.is_error_line(ln) and (m := grammar.STEP_RE.search(grammar.clean(ln)))]
    assert steps == [1, 2]
    errors = [ln for ln in raw if grammar.is_error_line(ln)]
    assert [grammar.clean(ln) for ln in errors] == [STOP.encode()]


def test_only_this_launchs_last_line_says_it_finished(tmp_path):
    """A launch has ended when every rank's log gained FINISHED as its last line after the launch started (the
    sizes before it): an earlier launch's line, a later line, or a missing log do not count."""
    logs = tmp_path / "logs"
    logs.mkdir()
    line = f"2026-12-03T10:00:00.000 rank=0 INFO {ranklog.FINISHED}\n"
    (logs / "rank_0.log").write_text("step 1\n" + line)
    (logs / "rank_1.log").write_text("step 1\n" + line)
    assert ranklog.all_finished(logs, {}, [0, 1])
    before = ranklog.log_sizes(logs)
    assert not ranklog.all_finished(logs, before, [0, 1])            # the earlier launch's line
    with open(logs / "rank_0.log", "a") as f:
        f.write("step 2\n" + line)
    assert not ranklog.all_finished(logs, before, [0, 1])            # rank 1 did not finish this launch
    with open(logs / "rank_1.log", "a") as f:
        f.write("step 2\n" + line + "a later line\n")
    assert not ranklog.all_finished(logs, before, [0, 1])            # something came after it
    assert not ranklog.all_finished(logs, {}, [0, 1, 2])             # no log for rank 2


def test_the_stop_line_is_only_what_this_launch_logged_last(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank_0.log").write_text(f"2026-01-01T00:00:00.000 rank=0 ERROR {STOP}\n")
    assert ranklog.stop_line(logs, {})[1] == (3, 5)
    before = ranklog.log_sizes(logs)
    assert ranklog.stop_line(logs, before) is None      # an earlier launch's line is not this launch's reason
    with open(logs / "rank_0.log", "a") as f:
        f.write("2026-01-01T00:00:01.000 rank=0 ERROR checkpoint: disk full\n")
    assert ranklog.stop_line(logs, {}) is None          # only the last error line counts


@pytest.mark.parametrize("body", ["", "{", "[" * 4000, json.dumps({"phase": "step"}), "x" * 5000,
                                  json.dumps({"rank": True, "phase": "step", "step": 1, "pid": 1, "time": 0, "seq": 1}),
                                  json.dumps({"rank": 0, "phase": "dancing", "step": 1, "pid": 1, "time": 0, "seq": 1}),
                                  json.dumps({"rank": 0, "phase": "step", "step": "1", "pid": 1, "time": 0, "seq": 1})])
def test_a_damaged_or_foreign_heartbeat_reads_as_none(tmp_path, body):
    p = tmp_path / "rank_0.json"
    p.write_text(body)
    assert read_beat(p) is None
    assert read_beat(tmp_path / "missing.json") is None


def test_a_heartbeat_that_cannot_be_written_does_not_stop_the_rank(tmp_path):
    (tmp_path / "heartbeat").write_text("a file in the way")
    hb = Heartbeat(tmp_path, 0)
    assert hb.beat("step", 1).step == 1        # the rank goes on; the supervisor sees its log instead
    with pytest.raises(ValueError, match="expected one of setup, restore"):
        hb.beat("lunch")


def test_the_logger_is_one_per_run_and_rank(tmp_path):
    a, b = ranklog.open_log(tmp_path, 0, echo=False), ranklog.open_log(tmp_path, 1, echo=False)
    assert a is not b and a.name.startswith("port.train.") and not a.propagate and a.level == logging.INFO
    for log in (a, b):
        for h in list(log.handlers):
            log.removeHandler(h)
            h.close()


def test_each_part_of_a_save_is_a_line_and_a_heartbeat_part(tmp_path):
    """Issue 53: the save's parts (wait, write, barrier, record, done) are lines `port diagnose` reads and the
    heartbeat's ``part``, with the time each began; a part outside a save, or one port does not write, reads as no
    beat."""
    log = ranklog.open_log(tmp_path, 1, echo=False)
    rl = ranklog.RankLog(log, Heartbeat(tmp_path, 1))
    rl.saving(6)
    for part in ("wait", "write", "barrier"):
        rl.save_part(6, part)
    beat = read_beat(tmp_path / "heartbeat" / "rank_1.json")
    assert (beat.phase, beat.step, beat.part) == ("save", 6, "barrier")
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    text = (tmp_path / "logs" / "rank_1.log").read_text()
    assert [(m[1], m[2]) for m in ranklog.SAVE_PART.finditer(text)] == [("6", "wait"), ("6", "write"), ("6", "barrier")]
    assert [m[2] for m in ranklog.DIAG_SAVE_PART.finditer(text.encode())][-1] == b"barrier"
    with pytest.raises(ValueError):
        Heartbeat(tmp_path, 2).beat("step", 3, part="write")
    planted = tmp_path / "heartbeat" / "rank_3.json"
    for part in ("sleep", ["write"], 7):
        planted.write_text(json.dumps({"rank": 3, "phase": "save", "step": 1, "pid": 9, "time": 1.0, "seq": 1,
                                       "part": part}))
        assert read_beat(planted) is None
