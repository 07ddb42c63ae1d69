"""One run's logged training curve (the record every log reader of porting/intake fills), with the checks
each logged value passes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from porting.intake import IntakeError
from porting.intake.typed import Num, typed

MAX_POINTS = 1_000_000
SERIES = ("loss", "grad_norm", "lr", "tokens")


@dataclass
class Curve:
    """One run's logged training curve, in optimizer steps (1-based), as the log states it."""

    path: Path
    fmt: str                                   # hf-trainer-state | llamafactory-jsonl | csv | jsonl | tensorboard
    step: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)
    lr: list[float | None] = field(default_factory=list)
    tokens: list[int | None] = field(default_factory=list)      # tokens seen up to and including the step
    recovered: dict[str, Any] = field(default_factory=dict)     # settings the log itself states
    skipped: dict[str, int] = field(default_factory=dict)       # rows left out, by reason

    def add(self, step: Any, where: str, **vals: Any) -> None:
        if len(self.step) >= MAX_POINTS:
            raise IntakeError(f"{where}: more than {MAX_POINTS:,} logged steps; this is not a training log "
                              "port reads (split it, or log less often)")
        s = _step(step, where)
        if self.step and s <= self.step[-1]:
            if s == self.step[-1]:   # a resumed run logs the step again: the later row wins
                self._pop()
                self.skipped["repeated step (later row kept)"] = self.skipped.get("repeated step (later row kept)", 0) + 1
            else:
                raise IntakeError(f"{where}: step {s} comes after step {self.step[-1]}; expected increasing steps "
                                  "(one run per file: split a log that restarts from step 0)")
        self.step.append(s)
        self.loss.append(_num(vals.get("loss"), where, "loss"))
        self.grad_norm.append(_num(vals.get("grad_norm"), where, "grad_norm"))
        self.lr.append(_num(vals.get("lr"), where, "lr"))
        tok = _num(vals.get("tokens"), where, "tokens")
        self.tokens.append(int(tok) if tok is not None else None)

    def _pop(self) -> None:
        for name in ("step",) + SERIES:
            getattr(self, name).pop()

    def has(self, name: str) -> bool:
        return any(v is not None for v in getattr(self, name))

    @property
    def logging_interval(self) -> int | None:
        """Steps between two logged rows when constant (HF ``logging_steps``), else None."""
        gaps = {b - a for a, b in zip(self.step, self.step[1:])}
        if len(gaps) == 1:
            return gaps.pop()
        return 1 if not gaps and self.step == [1] else None


# the typed reader's specs of a logged row (porting/intake/typed.py): a step is a whole number, a logged value
# a number no logged loss, norm, rate or token count comes near (|x| <= 1e30)
STEP = Num(1, 1e12, whole=True)
VALUE = Num(-1e30, 1e30)


def _step(v: Any, where: str) -> int:
    return typed(v, STEP, where, "step", null=False)


def _num(v: Any, where: str, key: str) -> float | None:
    """A finite number, None for a missing value; a non-finite logged value is kept as None (NaN in the
    curve: a diverged run is compared, not refused). A CSV cell is text: a number written as text is read."""
    if v is None or v == "":
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass   # the typed reader names it: found 'abc', expected a number
    if isinstance(v, float) and not math.isfinite(v):
        return None
    out = typed(v, VALUE, where, key)
    return None if out is None else float(out)
