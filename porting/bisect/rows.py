"""Rows of a bisection: which tensor, where it sits in the data flow, its statistics, its verdict.

A row compares one tensor of the MindSpore run with the same tensor of the HF + torch reference through
the one difference function, :func:`porting.verify.stats.compare` (max abs, max elementwise relative,
relative L2, cosine, non-finite counts). Only these statistics are kept (constant memory per row); the
tensors themselves are dropped after comparing. Its verdict is a :class:`porting.verify.check.Check`
(:attr:`Row.check`), the row every verification prints.

Which number is held against which tolerance comes from the one table,
:data:`porting.verify.stats.TOLERANCES` (README "Parity tolerances"):

- forward activations: max abs against ``hidden`` (``logits`` for the logits, ``loss`` for the loss);
- backward activation gradients, parameter gradients and AdamW updates: the relative L2 error
  ``||ms - ref|| / ||ref||`` against ``grad_rel`` (the table's bound on gradient norms, held against
  the norm of the difference). Gradients are small and their scale depends on the batch (the loss is a
  mean over tokens), so an absolute bound would mean nothing, and the elementwise relative error is
  dominated by entries near zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from porting.verify.check import Check
from porting.verify.stats import Stats, tolerances

PHASES = ("forward", "backward", "update")


@dataclasses.dataclass(frozen=True)
class Row:
    """One compared tensor. ``order`` is its place in the data flow (forward rows in layer order, then
    backward rows in reverse, then updates); ``kernel`` says which implementation produced it."""

    order: int
    phase: str
    layer: int | None
    block: str
    tensor: str
    kernel: str
    stats: Stats | None          # None: the tensor was not observed on one side (named in ``note``)
    measure: str
    tolerance: float
    note: str = ""

    @property
    def value(self) -> float:
        if self.stats is None:
            return float("nan")
        return getattr(self.stats, self.measure)

    @property
    def check(self) -> Check:
        """The verdict as the one result row (a tensor not observed on one side fails, its note says why)."""
        if self.stats is None:
            return Check(self.tensor, self.measure, None, self.tolerance, False, self.note)
        return Check.within(self.tensor, self.measure, self.value, self.tolerance, self.note)

    @property
    def passed(self) -> bool:
        return self.check.passed

    @property
    def nonfinite(self) -> bool:
        return self.stats is not None and self.stats.nonfinite_ms > 0

    def to_dict(self) -> dict[str, Any]:
        """The check's six keys (name, measure, value, tolerance, passed, detail), then where the tensor sits
        and all its statistics (``metrics``)."""
        return {**self.check.to_dict(), "phase": self.phase, "layer": self.layer, "block": self.block,
                "tensor": self.tensor, "kernel": self.kernel, "metrics": self.stats.to_dict() if self.stats else None,
                **({"note": self.note} if self.note else {})}


def tolerance_for(dtype: str, phase: str, block: str) -> tuple[str, float]:
    """(measure, tolerance) of a row, from porting.verify.stats.TOLERANCES."""
    tol = tolerances(dtype)
    if phase != "forward":
        return "rel_l2", tol["grad_rel"]
    if block == "loss":
        return "max_abs", tol["loss"]
    if block == "logits":
        return "max_abs", tol["logits"]
    return "max_abs", tol["hidden"]


def first_divergent(rows: Iterable[Row], nan_origin: bool = False) -> Row | None:
    """The first row in data-flow order that fails its tolerance; with ``nan_origin`` the first whose
    MindSpore tensor holds a non-finite value. Rows not observed on one side are skipped."""
    for r in sorted(rows, key=lambda r: r.order):
        if r.stats is None:
            continue
        if (r.nonfinite if nan_origin else not r.passed):
            return r
    return None
