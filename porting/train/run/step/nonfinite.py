"""Non-finite steps, handled as the field does: the update of a step whose loss or gradient is not finite is
skipped, its data counted as consumed, and the run goes on, up to the recipe's caps (``nonfinite.*``,
porting/train/recipe/nonfinite.py); past them the run stops with the reason and the window of steps that
went non-finite, which a supervisor (porting/launch/supervise.py) rolls back from once, skipping that data. The
stop's reason names the window in the rank log's words (porting/rundir/ranklog.py ``window_phrase``), which the
launch outcome reads back (porting/launch/outcome.py).

The skip itself happens inside the step's graph (porting/train/run/step/cells.py): AdamW's masters, moments and
parameters keep their values when the all-reduced gradient norm or the all-reduced loss is not finite, so
every rank skips the same step. Megatron-LM does the same for a step whose gradients overflow
(megatron/core/optimizer/optimizer.py, MixedPrecisionOptimizer.step: found_inf returns before the update;
megatron/training/training.py counts it as a skipped iteration); MindFormers skips a step's data and stops
after a streak (mindformers/core/callback/callback.py, TrainingStateMonitor, use_skip_data_by_global_norm).
Under dynamic loss scaling an overflow at a scale above 1 is the scaler's business (it lowers the scale) and
is not counted; at a scale of 1 it is a non-finite step like any other.

Test hook: ``PORT_TEST_NONFINITE`` (porting/train/run/faults.py) feeds a NaN loss scale into chosen steps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from porting.rundir.ranklog import window_phrase
from porting.train.run.step.result import StepResult
from porting.rundir.paths import RunDir
from porting.train.recipe.schema import Recipe

NONFINITE, OVERFLOW, WINDOW_SKIP = "nonfinite", "overflow", "data window"


@dataclasses.dataclass
class SkipGuard:
    """Counts skipped steps against ``nonfinite.max_consecutive_skips`` and ``max_total_skips``."""

    max_consecutive: int
    max_total: int
    total: int = 0            # non-finite steps skipped in this run (resumes included)
    consecutive: int = 0
    first: int | None = None  # the first step of the current streak

    def classify(self, r: StepResult, dynamic: bool) -> str | None:
        """Why the step's update was skipped (None: it was applied)."""
        if r.applied:
            return None
        return OVERFLOW if dynamic and r.scale_used > 1.0 else NONFINITE

    def after(self, step_no: int, r: StepResult, dynamic: bool) -> str | None:
        """Count step ``step_no`` (1-based); the reason to stop when it passes a cap, else None."""
        why = self.classify(r, dynamic)
        if why is None:
            self.consecutive, self.first = 0, None
            return None
        if why == OVERFLOW:
            return None
        self.total += 1
        self.consecutive += 1
        self.first = step_no if self.first is None else self.first
        what = f"step {step_no}: loss is {r.loss} (grad norm {r.grad_norm})"
        if self.consecutive > self.max_consecutive:
            return (f"{what}; {window_phrase(self.consecutive, self.first, step_no, True)}, "
                    f"nonfinite.max_consecutive_skips is {self.max_consecutive}; their updates were not applied")
        if self.total > self.max_total:
            return (f"{what}; {window_phrase(self.total, self.first, step_no, False)}, "
                    f"nonfinite.max_total_skips is {self.max_total}; their updates were not applied")
        return None


def guard_for(recipe: Recipe, run_dir: Path, start: int) -> SkipGuard:
    """The run's guard; a resumed run counts the non-finite steps its kept metrics record (through ``start``)."""
    nf = recipe.nonfinite
    return SkipGuard(nf.max_consecutive_skips, nf.max_total_skips, total=prior_skips(run_dir, start))


def prior_skips(run_dir: Path, start: int) -> int:
    """Non-finite steps skipped before step ``start`` (0-based next step) by earlier launches of this run, from
    ``metrics.jsonl`` (rank 0 writes it into the shared run directory; every rank reads the same lines)."""
    from porting.rundir import read_metrics   # deferred: only a resumed run reads its metrics

    path = RunDir(run_dir).metrics
    if not start or not path.is_file():
        return 0
    return sum(1 for r in read_metrics(path).steps if r.step <= start and r.skip_reason == NONFINITE)


def in_window(recipe: Recipe, step_no: int) -> tuple[int, int] | None:
    """The ``nonfinite.skip_steps`` window holding step ``step_no`` (1-based), else None."""
    return next(((a, b) for a, b in recipe.nonfinite.skip_steps if a <= step_no <= b), None)
