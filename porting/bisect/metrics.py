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


_CHUNK = 1 << 20   # elements per pass: the float64 temporaries stay a few MiB whatever the tensor's size


def compare(ms: np.ndarray, ref: np.ndarray) -> Stats:
    """The statistics of ``ms`` against ``ref`` (same shape), accumulated in float64 over chunks."""
    a_all, b_all = np.asarray(ms).reshape(-1), np.asarray(ref).reshape(-1)
    nf_a = nf_b = 0
    max_abs = max_rel = peak = dot = na2 = nb2 = nd2 = 0.0
    for i in range(0, a_all.size, _CHUNK):
        a = a_all[i:i + _CHUNK].astype(np.float64)
        b = b_all[i:i + _CHUNK].astype(np.float64)
        nf_a += int(a.size - np.count_nonzero(np.isfinite(a)))
        nf_b += int(b.size - np.count_nonzero(np.isfinite(b)))
        if nf_a or nf_b:
            continue
        d = np.abs(a - b)
        max_abs = max(max_abs, float(d.max()))
        max_rel = max(max_rel, float((d / np.maximum(np.abs(b), _FLOOR)).max()))
        peak = max(peak, float(np.abs(b).max()))
        dot, na2, nb2, nd2 = dot + float(a @ b), na2 + float(a @ a), nb2 + float(b @ b), nd2 + float(d @ d)
    shape = tuple(np.shape(ms))
    if nf_a or nf_b or a_all.size == 0:
        nan = float("nan")
        return Stats(nan, nan, nan, nan, nan, nf_a, nf_b, shape)
    na, nb, nd = math.sqrt(na2), math.sqrt(nb2), math.sqrt(nd2)
    cos = dot / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    return Stats(max_abs, max_rel, max_abs / peak if peak > 0 else max_abs, nd / nb if nb > 0 else nd, cos, 0, 0, shape)


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
