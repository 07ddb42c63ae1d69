"""Each rank's heartbeat, ``heartbeat/rank_<r>.json``: one small record a rank replaces as it moves through its
run, so that a supervisor knows what every rank is doing without parsing its log.

    {"rank": 2, "phase": "step", "step": 12, "pid": 4242, "time": 1764755400.123, "seq": 31}

Phases, each with its own allowance in the supervisor (porting/launch/supervise.py ``Limits.allowance``), as
NVIDIA's resiliency extension times a rank's named sections separately (nvidia-resiliency-ext fault_tolerance,
``rank_section_timeouts``: setup, step, checkpointing; docs "Sections API Integration"):

- ``setup``: from the rank's start (data, model); before its first record the rank is in setup too;
- ``restore``: a resume reading its checkpoint;
- ``compile``: every shape compiled before step 1 (porting/train/run/step/precompile.py), until step 1 is logged;
- ``step``: training, ``step`` the last step logged (``logging.every_steps``, as the step lines);
- ``save``: a checkpoint or the HF export being written, ``step`` its step, and ``part`` which part of it
  (porting/rundir/ranklog.py ``SAVE_PARTS``: "wait", "write", "barrier", "record", "done"); the record's ``time`` is
  when that part began, so a rank at "barrier" says when it reached the barrier;
- ``finished``: the run ended and every file of the rank is written.

The rank writes a record at the moments it logs a line others read (porting/rundir/ranklog.py ``RankLog``), not
more often, and replaces it atomically (a temporary file in the same directory, then ``os.replace``): a reader
sees the old record or the new one. Unlike ``model_zoo.files.write_atomic`` it does not fsync: a heartbeat need
not survive a power cut, and with the fsync a beat took twice as long at the median and 9x at the 90th
percentile on this project's 2-core machine (0.48 / 4.9 ms against 0.23 / 0.57 ms, benchmarks/heartbeat_write.py,
BENCHMARKS.md), beside a tiny CPU step of ~50 ms. ``seq`` counts
the beats of one process; a reader compares ``(pid, seq)`` with what it saw before and times the change with its
own clock, never the writer's ``time`` (another node's clock). The reader is bounded (:data:`MAX_BYTES`) and
forgiving: a missing, partial or foreign file reads as no beat, never as an error that stops a supervisor.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from porting.rundir.paths import RunDir

PHASES = ("setup", "restore", "compile", "step", "save", "finished")
SAVE_PARTS = ("wait", "write", "barrier", "record", "done")   # ranklog.SAVE_PARTS says what each is
MAX_BYTES = 4096


@dataclass(frozen=True)
class Beat:
    rank: int
    phase: str
    step: int | None
    pid: int
    time: float
    seq: int
    part: str | None = None   # which part of a save (SAVE_PARTS); None outside a save


class Heartbeat:
    """Rank ``rank``'s writer. A heartbeat that cannot be written (a full disk) is skipped: the rank's training
    goes on, and a supervisor sees the rank's log instead."""

    def __init__(self, run_dir: Path, rank: int, clock: Callable[[], float] = time.time, pid: int | None = None) -> None:
        self.path: Path | None = RunDir(run_dir).heartbeat(rank)
        self.rank, self.clock, self.seq = rank, clock, 0
        self.pid = os.getpid() if pid is None else pid   # the process the record speaks for
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:   # a file in the way, a read-only disk: no heartbeat, the run goes on
            self.path = None

    def beat(self, phase: str, step: int | None = None, part: str | None = None) -> Beat:
        if phase not in PHASES:
            raise ValueError(f"heartbeat phase {phase!r}: expected one of {', '.join(PHASES)}")
        if part is not None and (phase != "save" or part not in SAVE_PARTS):
            raise ValueError(f"heartbeat part {part!r}: expected one of {', '.join(SAVE_PARTS)} in phase save")
        self.seq += 1
        b = Beat(self.rank, phase, step, self.pid, round(self.clock(), 3), self.seq, part)
        if self.path is not None:
            _replace(self.path, json.dumps(asdict(b)).encode())
        return b


def _replace(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part; a failure (a full disk) leaves it as it was."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".port-tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def read_beat(path: Path) -> Beat | None:
    """The record at ``path``, or None when there is none that port wrote."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        d = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):   # RecursionError: 4 KiB of nested brackets
        return None
    if not isinstance(d, dict) or d.get("phase") not in PHASES:
        return None
    ints = ("rank", "pid", "seq")
    if any(type(d.get(k)) is not int for k in ints) or not (d.get("step") is None or type(d.get("step")) is int):
        return None
    if not isinstance(d.get("time"), (int, float)) or isinstance(d.get("time"), bool):
        return None
    part = d.get("part")
    if part is not None and (part not in SAVE_PARTS or d["phase"] != "save"):
        return None
    return Beat(d["rank"], d["phase"], d["step"], d["pid"], float(d["time"]), d["seq"], part)
