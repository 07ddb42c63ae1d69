"""The rank log, ``logs/rank_<r>.log``: its one writer and its one reader.

Every rank of `port train` writes its log here (porting/train/run/loop.py); the launcher, the supervisor, the
non-finite rollback and `port diagnose` read it. The lines others read are written by the functions below and
read by the patterns beside them, and tests/rundir/test_ranklog.py writes each one and reads it back, so a
reworded line fails a unit test instead of a supervised run.

A line is ``2026-12-03T10:00:00.000 rank=0 INFO <message>`` (local time, milliseconds). The messages others read:

==========  ==================================================  ==============================================
line        message                                              read by
==========  ==================================================  ==============================================
pid         ``rank R of W (pid P): ...`` (msrun workers)         tests that signal one rank's process
step        ``step N/T loss L lr ... graphs G``                  `port diagnose` (its last step), tests
saving      ``saving checkpoint step_N``                         `port diagnose`; a reader of the log
saved       ``checkpoint PATH``                                  a reader of the log
save part   ``checkpoint step N: save phase P (what)``           `port diagnose` (which rank froze inside a save)
stop        ``... K non-finite steps in a row (steps A..B) ...`` the launch outcome (porting/launch/outcome.py)
            at ERROR: the run stopped past its caps
finished    :data:`FINISHED`, the rank's last line               the launch outcome: a crash at exit is no fault
==========  ==================================================  ==============================================

The supervisor does not read these lines for its heartbeat: it reads the record each rank keeps beside them
(porting/rundir/heartbeat.py), written by the same calls (:class:`RankLog`).
"""

from __future__ import annotations

import datetime as _dt
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from porting.rundir.heartbeat import Heartbeat
from porting.rundir.paths import RunDir, rank_log_name

# The last line every rank logs once its run has ended and every file it writes is complete. A worker can
# still crash after it: 2 of ~1,000 msrun workers here (MindSpore 2.10, CPU) segfaulted (exit -11) in the
# teardown of MindSpore's communication threads at interpreter exit, and msrun then reports the job failed.
# MindSpore's cluster is finalized only in that teardown (no API finalizes it sooner: os._exit after
# mindspore.communication.release() left the scheduler timing the workers out), so the launcher reads
# this line instead: a launch whose ranks all logged it finished its run, whatever msrun's exit code.
FINISHED = "run finished: every file of this rank is written"
LOG_NAME = re.compile(r"^rank_([0-9]{1,9})\.log$")   # ASCII digits: int() would take any script's
STOP_TAIL = 64 << 10       # bytes of each log the stop line is looked for in
FINISHED_TAIL = 4096       # bytes of each log its last line is looked for in

# -------------------------------------------------------------------------------- the patterns others read
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} rank=(\d+) (INFO|WARNING|ERROR|CRITICAL) ")
PID = re.compile(r" INFO rank (\d+) of (\d+) \(pid (\d+)\)")
STEP = re.compile(r" INFO step (\d+)/(\d+) loss (\S+) lr (\S+) grad_norm (\S+) tokens/s (\S+) step (\S+)s pad (\S+)"
                  r"( \(compile\))? shapes \[([\d, ]*)\] graphs (\d+)(?: \(skipped: ([^)]*)\))?$", re.M)
SAVING = re.compile(r" INFO saving checkpoint step_(\d+)$", re.M)
SAVED = re.compile(r" INFO checkpoint (\S.*)$", re.M)
SAVE_PART = re.compile(r" INFO checkpoint step (\d{1,9}): save phase (\w{1,16}) ", re.M)
WINDOW = re.compile(r"non-finite steps in a row \(steps (\d+)\.\.(\d+)\)|non-finite steps in all \(last window: "
                    r"steps (\d+)\.\.(\d+)\)")
ERROR_MARK = " ERROR "
# `port diagnose` reads every rank log as bytes (porting/diagnostics/grammar.py). Its patterns take this
# module's lines and also the ``YYYY-MM-DD HH:MM:SS`` and ``level=`` spellings of hand-made logs.
DIAG_PREFIX = re.compile(rb"^\d{4}-\d\d-\d\d[T ][\d:.,]+\s+rank=\d+\s+(?:level=)?(?:ERROR|CRITICAL|WARNING|INFO)?\s*")
DIAG_LEVEL = re.compile(rb"\brank=\d+\s+(?:level=)?(ERROR|CRITICAL|WARNING|INFO)\b")
DIAG_RANK = re.compile(rb"(?:^|\s)rank=(\d{1,9})\s")
DIAG_SAVE_PART = re.compile(SAVE_PART.pattern.encode())
# The parts of a checkpoint save, in order (porting/train/run/checkpoint/save.py ``save``): every rank meets the others
# ("wait"), writes its own file ("write"), meets them again once it is written ("barrier"); rank 0 then writes the
# layout record and state.json and renames the directory into place ("record"); "done" when its save returned. A rank
# that stopped at "wait" or "barrier" waited for the others; one that stopped at "write" or "record" froze in its
# own work.
SAVE_PARTS = {"wait": "waiting for every rank before writing", "write": "writing its own file",
              "barrier": "its file written, waiting at the barrier for the others",
              "record": "writing the layout record and state.json", "done": "its save finished"}


# -------------------------------------------------------------------------------- the writer
class Formatter(logging.Formatter):
    """``<local time>.<ms> rank=<r> <LEVEL> <message>``."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        t = _dt.datetime.fromtimestamp(record.created)
        return (f"{t.strftime('%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d} rank={self.rank} {record.levelname} "
                f"{record.getMessage()}")


def open_log(run_dir: Path, rank: int, echo: bool) -> logging.Logger:
    """Rank ``rank``'s logger, appending to ``logs/rank_<rank>.log`` (and echoed to stderr with ``echo``)."""
    log = logging.getLogger(f"port.train.rank{rank}.{id(run_dir)}")   # tests/helpers.py closes "port.train.*"
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
    path = RunDir(run_dir).rank_log(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(path)
    fh.setFormatter(Formatter(rank))
    log.addHandler(fh)
    if echo:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(Formatter(rank))
        log.addHandler(sh)
    return log


def pid_line(rank: int, world: int, pid: int, detail: str) -> str:
    return f"rank {rank} of {world} (pid {pid}): {detail}"


def step_line(step: int, total: int, loss: float, lr: float, grad_norm: float, tokens_per_s: float,
              step_time_s: float, padding: float, compile: bool, shapes: Iterable[int], graphs: int,
              skip_reason: str | None) -> str:
    return (f"step {step}/{total} loss {loss:.5f} lr {lr:.3e} grad_norm {grad_norm:.4f} tokens/s {tokens_per_s:.0f} "
            f"step {step_time_s:.3f}s pad {padding:.3f}" + (" (compile)" if compile else "")
            + f" shapes {list(shapes)} graphs {graphs}" + (f" (skipped: {skip_reason})" if skip_reason else ""))


def saving_line(step: int) -> str:
    return f"saving checkpoint step_{step}"


def saved_line(path: Path | str) -> str:
    return f"checkpoint {path}"


def save_part_line(step: int, part: str) -> str:
    return f"checkpoint step {step}: save phase {part} ({SAVE_PARTS[part]})"


def window_phrase(count: int, first: int, last: int, in_a_row: bool) -> str:
    """The part of a non-finite stop that names its window (:data:`WINDOW` reads it back)."""
    if in_a_row:
        return f"{count} non-finite steps in a row (steps {first}..{last})"
    return f"{count} non-finite steps in all (last window: steps {first}..{last})"


class RankLog:
    """One rank's log and heartbeat: every line another process reads is written through these methods, which
    also move the rank's heartbeat record to the phase the line announces."""

    def __init__(self, log: logging.Logger, beat: Heartbeat | None = None) -> None:
        self.log, self.beat = log, beat

    def _phase(self, phase: str, step: int | None = None) -> None:
        if self.beat is not None:
            self.beat.beat(phase, step)

    def started(self, rank: int, world: int, pid: int, detail: str, distributed: bool) -> None:
        """The setup phase begins; an msrun worker logs its pid."""
        if distributed:
            self.log.info(pid_line(rank, world, pid, detail))
        self._phase("setup")

    def phase(self, phase: str, step: int | None = None) -> None:
        """A phase without a line of its own (restore, compile)."""
        self._phase(phase, step)

    def step(self, step: int, total: int, **fields) -> None:
        self.log.info(step_line(step, total, **fields))
        self._phase("step", step)

    def saving(self, step: int) -> None:
        self.log.info(saving_line(step))
        self._phase("save", step)

    def save_part(self, step: int, part: str) -> None:
        """A part of the save begins (:data:`SAVE_PARTS`): its line, and the heartbeat's ``part`` with its time, so
        that a rank frozen inside the save is told from the ranks that wait for it at the barrier."""
        self.log.info(save_part_line(step, part))
        if self.beat is not None:
            self.beat.beat("save", step, part=part)

    def saved(self, step: int, path: Path | str) -> None:
        self.log.info(saved_line(path))
        self._phase("step", step)

    def failed(self, reason: str) -> None:
        """The run stops with ``reason`` (a non-finite stop names its window: :func:`window_phrase`)."""
        self.log.error(reason)

    def finished(self) -> None:
        self.log.info(FINISHED)
        self._phase("finished")


# -------------------------------------------------------------------------------- the reader
@dataclass(frozen=True)
class StepLine:
    """A step line read back, its numbers as rounded as the line prints them."""

    step: int
    total: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    step_time_s: float
    padding: float
    compile: bool
    shapes: tuple[int, ...]
    graphs: int
    skip_reason: str | None

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None


def read_steps(text: str) -> list[StepLine]:
    """Every step line of a rank log's text, in order."""
    return [StepLine(int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6]), float(m[7]),
                     float(m[8]), m[9] is not None, tuple(int(x) for x in m[10].split(",") if x.strip()), int(m[11]),
                     m[12]) for m in STEP.finditer(text)]


def pid_of(text: str) -> int | None:
    """The pid the rank logged (the last pid line of ``text``), or None."""
    found = list(PID.finditer(text))
    return int(found[-1][3]) if found else None


def read_tail(path: Path, start: int, limit: int = 1 << 20) -> str:
    """At most ``limit`` bytes of ``path`` from byte ``start`` ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def log_sizes(logs: Path) -> dict[str, int]:
    """The size of every rank log in ``logs`` now: a launch's own lines are the ones after these."""
    return {p.name: p.stat().st_size for p in logs.glob("rank_*.log")} if logs.is_dir() else {}


def gained(log: Path, since: dict[str, int], limit: int) -> str | None:
    """What rank log ``log`` gained after ``since`` (:func:`log_sizes` before a launch), its last ``limit``
    bytes at most; None when it cannot be read."""
    try:
        with open(log, "rb") as f:
            f.seek(max(since.get(log.name, 0), log.stat().st_size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return None


def stop_line(logs: Path, since: dict[str, int]) -> tuple[str, tuple[int, int]] | None:
    """(the reason, (first, last) window) of a launch that stopped past its non-finite caps, from what its rank
    logs in ``logs`` gained after ``since`` (every rank logs the same line), else None. Only the last
    :data:`STOP_TAIL` bytes of each log are read, and only its last error line counts."""
    for log in sorted(logs.glob("rank_*.log")):
        text = gained(log, since, STOP_TAIL)
        if text is None:
            continue
        last = next((ln for ln in reversed(text.splitlines()) if ERROR_MARK in ln), "")
        m = WINDOW.search(last)
        if m:
            first, end = (int(g) for g in m.groups() if g is not None)
            return last.split(ERROR_MARK, 1)[-1][:400], (first, end)
    return None


def all_finished(logs: Path, since: dict[str, int], ranks: Iterable[int]) -> bool:
    """Whether every rank in ``ranks`` logged :data:`FINISHED` as its last line after ``since``. Only each log's
    last :data:`FINISHED_TAIL` bytes are read."""
    for r in ranks:
        tail = gained(Path(logs) / rank_log_name(r), since, FINISHED_TAIL)
        if tail is None or not tail.rstrip().endswith(FINISHED):
            return False
    return True
