"""Non-finite steps, handled as the field does: the update of a step whose loss or gradient is not finite is
skipped, its data counted as consumed, and the run goes on, up to the recipe's caps (``nonfinite.*``,
porting/train/recipe/nonfinite.py); past them the run stops with the reason and the window of steps that
went non-finite, which a supervisor (porting/supervise.py) rolls back from once, skipping that data.

The skip itself happens inside the step's graph (porting/train/run/step.py): AdamW's masters, moments and
parameters keep their values when the all-reduced gradient norm or the all-reduced loss is not finite, so
every rank skips the same step. Megatron-LM does the same for a step whose gradients overflow
(megatron/core/optimizer/optimizer.py, MixedPrecisionOptimizer.step: found_inf returns before the update;
megatron/training/training.py counts it as a skipped iteration); MindFormers skips a step's data and stops
after a streak (mindformers/core/callback/callback.py, TrainingStateMonitor, use_skip_data_by_global_norm).
Under dynamic loss scaling an overflow at a scale above 1 is the scaler's business (it lowers the scale) and
is not counted; at a scale of 1 it is a non-finite step like any other.

Test hook (off unless set; for tests and rehearsals only): ``PORT_TEST_NONFINITE=STEPS[@RANK]`` makes the
worker feed a NaN loss scale into the chosen steps (1-based: ``3``, ``3,5``, ``4-`` for step 4 onwards,
``*`` for every step) on one rank (``@1``) or on every rank, so that rank's gradients and, through the
all-reduce, every rank's gradient norm are NaN. The graph, the all-reduce and the skip are the real ones.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

from model_zoo.errors import PortingError

HOOK_ENV = "PORT_TEST_NONFINITE"
# The one line a stopped run logs on every rank (and raises); porting/supervise.py reads the window from it.
WINDOW = re.compile(r"non-finite steps in a row \(steps (\d+)\.\.(\d+)\)|non-finite steps in all \(last window: "
                    r"steps (\d+)\.\.(\d+)\)")
_HOOK = re.compile(r"(\*|\d+-|\d+(?:,\d+)*)(?:@(\d+))?")
NONFINITE, OVERFLOW, WINDOW_SKIP = "nonfinite", "overflow", "data window"


class NonfiniteHookError(PortingError):
    """The test hook's variable does not parse."""


@dataclasses.dataclass
class SkipGuard:
    """Counts skipped steps against ``nonfinite.max_consecutive_skips`` and ``max_total_skips``."""

    max_consecutive: int
    max_total: int
    total: int = 0            # non-finite steps skipped in this run (resumes included)
    consecutive: int = 0
    first: int | None = None  # the first step of the current streak

    def classify(self, r: dict, dynamic: bool) -> str | None:
        """Why the step's update was skipped (None: it was applied)."""
        if r["applied"]:
            return None
        return OVERFLOW if dynamic and r["scale_used"] > 1.0 else NONFINITE

    def after(self, step_no: int, r: dict, dynamic: bool) -> str | None:
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
        what = f"step {step_no}: loss is {r['loss']} (grad norm {r['grad_norm']})"
        if self.consecutive > self.max_consecutive:
            return (f"{what}; {self.consecutive} non-finite steps in a row (steps {self.first}..{step_no}), "
                    f"nonfinite.max_consecutive_skips is {self.max_consecutive}; their updates were not applied")
        if self.total > self.max_total:
            return (f"{what}; {self.total} non-finite steps in all (last window: steps {self.first}..{step_no}), "
                    f"nonfinite.max_total_skips is {self.max_total}; their updates were not applied")
        return None


def guard_for(recipe, run_dir: Path, start: int) -> SkipGuard:
    """The run's guard; a resumed run counts the non-finite steps its kept metrics record (through ``start``)."""
    nf = recipe.nonfinite
    return SkipGuard(nf.max_consecutive_skips, nf.max_total_skips, total=prior_skips(run_dir, start))


def prior_skips(run_dir: Path, start: int) -> int:
    """Non-finite steps skipped before step ``start`` (0-based next step) by earlier launches of this run, from
    ``metrics.jsonl`` (rank 0 writes it into the shared run directory; every rank reads the same lines)."""
    from porting.rundir import read_metrics   # deferred: only a resumed run reads its metrics

    path = run_dir / "metrics.jsonl"
    if not start or not path.is_file():
        return 0
    return sum(1 for r in read_metrics(path).steps if r.step <= start and r.skip_reason == NONFINITE)


def in_window(recipe, step_no: int) -> tuple[int, int] | None:
    """The ``nonfinite.skip_steps`` window holding step ``step_no`` (1-based), else None."""
    return next(((a, b) for a, b in recipe.nonfinite.skip_steps if a <= step_no <= b), None)


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
    """(the reason, (first, last) window) of a launch that stopped past its caps, from what its rank logs in
    ``logs`` gained after ``since`` (:func:`log_sizes` before the launch; every rank logs the same line), else
    None. Only the last 64 KiB of each log are read, and only its last error line counts."""
    for log in sorted(logs.glob("rank_*.log")):
        text = gained(log, since, 64 << 10)
        if text is None:
            continue
        last = next((ln for ln in reversed(text.splitlines()) if " ERROR " in ln), "")
        m = WINDOW.search(last)
        if m:
            first, end = (int(g) for g in m.groups() if g is not None)
            return last.split(" ERROR ", 1)[-1][:400], (first, end)
    return None


def parse_hook(value: str | None) -> tuple[str, int | None] | None:
    """``PORT_TEST_NONFINITE``'s (steps, rank), or None when unset. A value that does not parse is one line."""
    if not value:
        return None
    m = _HOOK.fullmatch(value.strip())
    if m is None:
        raise NonfiniteHookError(f"{HOOK_ENV}={value[:40]!r}: expected STEPS[@RANK] with STEPS one of 3, 3,5, "
                                 "4- (step 4 onwards) or * (every step), e.g. 3@1; unset it for a normal run")
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


def poison(step_no: int, rank: int, hook: tuple[str, int | None] | None) -> float:
    """The factor the hook puts on step ``step_no``'s loss scale on ``rank``: NaN where injected, else 1.0."""
    if hook is None:
        return 1.0
    steps, only = hook
    if only is not None and only != rank:
        return 1.0
    if steps == "*" or (steps.endswith("-") and step_no >= int(steps[:-1])):
        return math.nan
    return math.nan if not steps.endswith("-") and str(step_no) in steps.split(",") else 1.0


def hook_from_env() -> tuple[str, int | None] | None:
    return parse_hook(os.environ.get(HOOK_ENV))
