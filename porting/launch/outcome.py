"""What a launch came to, decided once for both launch paths (`port train` under msrun, porting/launch/msrun.py,
and `port train --supervise`, porting/launch/supervise.py): finished or failed, the workers' own reason when they
stopped past the non-finite caps, and the half-written saves a failed launch left, removed.

A launch finished when its exit code is 0, or when every rank of this node logged the rank log's last line
(porting/rundir/ranklog.py ``FINISHED``) during this launch: a worker that crashes in MindSpore's teardown after
its run ended does not fail the launch. A failed launch's own ``.tmp_step_*`` directories (a disk that filled, a
rank killed mid-save) are removed by node 0, which holds the run's checkpoints; never an ``.old_step_*`` one,
which is the previous copy of a step moved aside by ``model_zoo.files.swap_in``, nor one an earlier launch left.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from porting.rundir import ranklog
from porting.rundir.paths import RunDir
from porting.train.recipe.schema import Recipe

TMP_PREFIX = ".tmp_step_"


@dataclass(frozen=True)
class Mark:
    """What the run directory held before a launch: its rank logs' sizes and its interrupted saves."""

    sizes: dict[str, int]
    saves: frozenset[Path]


@dataclass(frozen=True)
class Outcome:
    code: int | None                            # None: the launch had not exited when it was decided
    finished: bool                              # exit 0, or every rank of this node logged its run's end
    stop: tuple[str, tuple[int, int]] | None    # the workers' non-finite stop: (reason, (first, last) window)
    removed: tuple[Path, ...]                   # this launch's half-written saves, removed

    @property
    def crashed_at_exit(self) -> bool:
        """Every rank logged its run's end, and the launch still exited non-zero (a crash at exit)."""
        return self.finished and self.code != 0


def _interrupted(run_dir: Path) -> list[Path]:
    from porting.train.run.checkpoint.save import interrupted_saves   # deferred: the checkpoint readers (NumPy, the recipe schema), only after a launch

    return interrupted_saves(RunDir(run_dir).checkpoints)


def mark(run_dir: Path) -> Mark:
    """The run directory before a launch: what the launch adds after it is the launch's own."""
    return Mark(ranklog.log_sizes(RunDir(run_dir).logs), frozenset(_interrupted(run_dir)))


def launch_outcome(run_dir: Path, before: Mark, code: int | None, ranks: Iterable[int], *, clean: bool) -> Outcome:
    """What the launch that exited with ``code`` came to (``before``: its :func:`mark`, ``ranks``: this node's).
    A failed launch's own half-written saves are removed with ``clean`` (node 0), once it has exited: with ``code``
    None (a rank's process is gone while msrun still runs) the ranks' logs alone decide, and nothing is removed."""
    logs = RunDir(run_dir).logs
    if code == 0 or ranklog.all_finished(logs, before.sizes, ranks):
        return Outcome(code, True, None, ())
    removed = []
    for p in sorted(set(_interrupted(run_dir)) - before.saves) if clean and code is not None else ():
        if p.name.startswith(TMP_PREFIX):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return Outcome(code, False, ranklog.stop_line(logs, before.sizes), tuple(removed))


def after_finished(rec: Recipe, run_dir: Path, node: int, echo: Callable[[str], None]) -> None:
    """What a finished launch of more than one worker does once its workers have exited, on node 0 only: the HF
    export the recipe asks for, merged from the per-rank checkpoint by this process (no worker holds memory or
    waits in a collective any more; porting/train/run/checkpoint/export.py). The plain and the supervised launch call it."""
    if node != 0 or rec.world_size == 1:
        return
    from porting.train.run.checkpoint.export import export_after_exit  # deferred: loads the checkpoint readers

    export_after_exit(rec, run_dir, log=echo)
