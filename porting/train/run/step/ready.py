"""The ranks of one node meet after their compiles without a collective: a file per rank, polled.

Why not only the all-reduce barrier: a rank that enters a collective waits there at most the collective's
own timeout (the CPU's MCCL op timeout, about 30 s when ``MS_CPU_COMM_OP_TIMEOUT`` is unset; measured, see
porting/data/env_knobs.yaml; ``HCCL_EXEC_TIMEOUT`` on Ascend). Graph compiles before step 1 are uneven
across ranks (measured on 2 busy cores: 24.5 s on one rank of a 2048-wide TP 2 x DP 2 ZeRO-1 run and
49-58 s on the other three), so the first rank to finish gave up in the barrier and the run died before
step 1. Here each rank writes ``logs/.ready_<launch>/rank_<r>`` and waits for the node's other workers'
files, with a log line every :data:`LOG_EVERY_S` (no silent window); the all-reduce barrier that follows
then meets ranks that are all ready. ``<launch>`` is the worker's parent (the node's msrun process, pid
and start time), so a relaunch never counts a dead launch's files. Across nodes the collective remains
the barrier (each node's files are its own).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable

from porting.train.plan.execution import GraphCompileError
from porting.train.run.lifeline import token

LOG_EVERY_S = 30.0
POLL_S = 0.1
PREFIX = ".ready_"


def launch_dir(run_dir: Path) -> Path:
    """This launch's folder of ready files (named by the worker's parent process)."""
    return run_dir / "logs" / (PREFIX + token(os.getppid()).replace(":", "-"))


def meet_node(run_dir: Path, rank: int, workers: int, limit_s: float, log: Callable[[str], None],
              clock: Callable[[], float] = time.monotonic, late_s: float = 0.0) -> float:
    """Marks ``rank`` ready and waits until ``workers`` ranks of this launch are; the seconds waited.
    Raises GraphCompileError after ``limit_s`` with the count still missing. ``late_s`` (the test hook
    PORT_TEST_COMPILE_DELAY): this rank marks itself ready that long after the node's other ranks did, so each
    of them waits at least ``late_s`` whatever the machine's load made of their compile times."""
    here = launch_dir(run_dir)
    here.mkdir(parents=True, exist_ok=True)
    if late_s > 0:
        deadline = clock() + limit_s
        while _count(here) < workers - 1 and clock() < deadline:
            time.sleep(POLL_S)
        log(f"precompile: test hook PORT_TEST_COMPILE_DELAY: rank {rank} is ready {late_s:g} s after the others")
        time.sleep(late_s)
    mine = here / f"rank_{rank}"
    tmp = here / f".rank_{rank}.tmp"
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, mine)
    t0 = clock()
    said = t0
    while True:
        ready = _count(here)
        if ready >= workers:
            return clock() - t0
        now = clock()
        if now - t0 > limit_s:
            raise GraphCompileError(f"rank {rank}: {ready} of {workers} ranks of this node finished compiling in "
                                    f"{limit_s:.0f} s ({here}); a rank is stuck compiling or died: see logs/rank_*.log")
        if now - said >= LOG_EVERY_S:
            said = now
            log(f"precompile: rank {rank} compiled; waiting for the node's other ranks ({ready} of {workers} "
                f"ready, {now - t0:.0f} s)")
        time.sleep(POLL_S)


def _count(here: Path) -> int:
    return sum(1 for p in here.iterdir() if p.name.startswith("rank_"))


def clear(run_dir: Path, workers: int) -> None:
    """Rank 0, after every rank passed the collective barrier: removes what this launch wrote and nothing else,
    the ready files ``rank_0 .. rank_<workers-1>`` of its own folder (:func:`launch_dir`: named by this launch's
    msrun process, which no earlier launch shares), each a regular file holding a process id as
    :func:`meet_node` writes it, then the folder if that left it empty. A ``.ready_*`` folder of another launch,
    an empty one, a link, or a user's file named like a ready file stays: a folder port cannot prove it wrote is
    not port's to delete (a dead launch's folder of a few bytes stays too)."""
    here = launch_dir(run_dir)
    if here.is_symlink() or not here.is_dir():
        return
    for r in range(workers):
        f = here / f"rank_{r}"
        try:
            if f.is_symlink() or not f.is_file() or f.stat().st_size > 32 or not _PID.fullmatch(f.read_text()):
                continue
            f.unlink()
        except (OSError, UnicodeDecodeError):
            continue
    try:
        here.rmdir()   # only when empty: anything else in it stays, with its folder
    except OSError:
        pass


_PID = re.compile(r"[0-9]{1,10}")   # what meet_node writes in a ready file
