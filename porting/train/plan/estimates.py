"""The step estimates a plan holds, records only: the roofline's (:func:`porting.train.plan.roofline.step_time`) and
the calibrated one (:func:`porting.train.plan.calibrated.predict`). Both sit in the plan's ``estimated_step`` and in
each proposal's ``estimate``; they live here because the roofline ranks layouts with either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from model_zoo.typed import spec


@dataclass(frozen=True)
class CommFigure:
    """One collective of the step as an estimate prices it, and where its figure comes from (``figure``: "measured
    at group size N on <device>", "extrapolated from group size M to N on <device> (...)", "half the AllReduce
    measured at group size N on <device> (...)" or "peak link figure (...)"; ``basis`` the same as one word)."""

    op: str
    group: str                     # tp or dp (porting/train/plan/sharding.py Collective)
    ranks: int
    count: int
    seconds: float                 # all ``count`` calls of one optimizer step
    basis: Literal["measured", "extrapolated", "half of measured AllReduce", "links rung", "peak", "not measured"]
    figure: str
    measured_ranks: int | None = None   # the group size the figure was measured at (None: peak or not measured)


@dataclass(frozen=True, kw_only=True)
class RooflineStep:
    """Seconds of one optimizer step on one rank at the hardware's peak, by part (roofline.py module docstring)."""

    # "roofline" as the plan's estimate; absent from a proposal's (plan.json has always written it so)
    kind: Literal["roofline"] | None = spec(None, omit_none=True)
    compute_s: float
    memory_s: float
    comm_s: float
    step_s: float
    comm_tp_s: float
    comm_dp_s: float
    tokens_per_s: float
    comm_figures: tuple[CommFigure, ...] = ()   # every collective at the peak link figure (roofline.py)


@dataclass(frozen=True)
class CalibratedStep:
    """The step predicted from a rehearsal's measured pieces, by part, with the source of each figure."""

    kind: Literal["calibrated"]
    from_: str = field(metadata={"key": "from"})     # the rehearsal folder
    step_s: float
    compute_s: float
    memory_s: float                                  # the update
    comm_s: float
    how: str
    comm_sources: tuple[str, ...]
    measured_shape: dict[str, int | bool | str]     # calibration.json's shape (calibrated.shape_of)
    load_avg_at_measurement: float | None
    tokens_per_s: float | None
    comm_figures: tuple[CommFigure, ...] = ()   # each collective's seconds and whether measured, extrapolated or peak
    sync_s: float = 0.0      # the synchronising calls' waits beyond the calls (calibrated.sync_waits)
    sync_how: str = ""       # where they were measured ("" when none: one worker, or no chain on a node like it)


StepEstimate = RooflineStep | CalibratedStep
