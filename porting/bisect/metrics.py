"""Rows of a bisection: which tensor, where it sits in the data flow, its statistics, its verdict.

A row compares one tensor of the MindSpore run with the same tensor of the HF + torch reference:
max abs difference, max elementwise relative difference (the denominator floored at 1e-6 as in
:mod:`porting.parity`), cosine similarity and each side's count of non-finite values. Only these
statistics are kept (constant memory per row); the tensors themselves are dropped after comparing.

Which number is held against which tolerance comes from the project's one table,
:data:`porting.parity.TOLERANCES` (README "Parity tolerances"):

- forward activations: max abs against ``hidden`` (``logits`` for the logits, ``loss`` for the loss);
- backward activation gradients, parameter gradients and AdamW updates: the relative L2 error
  ``||ms - ref|| / ||ref||`` against ``grad_rel`` (the table's bound on gradient norms, held against
  the norm of the difference). Gradients are small and their scale depends on the batch (the loss is a
  mean over tokens), so an absolute bound would mean nothing, and the elementwise relative error is
  dominated by entries near zero.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

import numpy as np

from porting.parity import TOLERANCES

PHASES = ("forward", "backward", "update")
_FLOOR = 1e-6   # the relative-difference floor of porting/parity.py's _diff


@dataclasses.dataclass(frozen=True)
class Stats:
    """Statistics of one MindSpore tensor against its reference."""

    max_abs: float
    max_rel: float
    scaled_abs: float      # max abs / max |reference|
    rel_l2: float          # ||ms - ref|| / ||ref||
    cosine: float
    nonfinite_ms: int
    nonfinite_ref: int
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def compare(ms: np.ndarray, ref: np.ndarray) -> Stats:
    """The statistics of ``ms`` against ``ref`` (same shape), in float64."""
    a = np.asarray(ms, np.float64).ravel()
    b = np.asarray(ref, np.float64).ravel()
    nf_a, nf_b = int(a.size - np.isfinite(a).sum()), int(b.size - np.isfinite(b).sum())
    if nf_a or nf_b or a.size == 0:
        nan = float("nan")
        return Stats(nan, nan, nan, nan, nan, nf_a, nf_b, tuple(np.shape(ms)))
    d = np.abs(a - b)
    peak = float(np.abs(b).max())
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    nd = float(np.linalg.norm(d))
    return Stats(float(d.max()), float((d / np.maximum(np.abs(b), _FLOOR)).max()),
                 float(d.max() / peak) if peak > 0 else float(d.max()), nd / nb if nb > 0 else nd, cos, 0, 0,
                 tuple(np.shape(ms)))


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
    def passed(self) -> bool:
        return self.stats is not None and math.isfinite(self.value) and self.value <= self.tolerance

    @property
    def nonfinite(self) -> bool:
        return self.stats is not None and self.stats.nonfinite_ms > 0

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "layer": self.layer, "block": self.block, "tensor": self.tensor,
                "kernel": self.kernel, "metrics": self.stats.to_dict() if self.stats else None,
                "measure": self.measure, "tolerance": self.tolerance, "passed": self.passed,
                **({"note": self.note} if self.note else {})}


def tolerance_for(dtype: str, phase: str, block: str) -> tuple[str, float]:
    """(measure, tolerance) of a row, from porting.parity.TOLERANCES."""
    tol = TOLERANCES[dtype]
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
