"""The memory estimator check: `port train --dry-run`'s per-device estimate (components in GiB, as
``porting.train.plan.estimate_memory`` and plan.json's ``memory_gib_by_phase`` give them) set against
peaks measured per phase.

Phases are composed the way they are measured (gradients freed after each optimizer step, AdamW
states persistent):
  forward   = weights + optimizer_states + activations (the ones in use: recompute or not)
  backward  = weights + optimizer_states + gradients + activations   (an upper bound)
  optimizer = weights + optimizer_states + gradients
Workspace and communication buffers are part of the estimate's total only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from porting.baseline.memory import PHASES
from porting.train.plan.memory import MemoryByPhase


def phase_estimate(est: MemoryByPhase, recompute: bool, states_gib: float | None = None) -> dict[str, float]:
    act = est.activations_recompute if recompute else est.activations
    states = est.optimizer_states if states_gib is None else states_gib
    w, g = est.weights, est.gradients
    return {"forward": w + states + act, "backward": w + states + g + act, "optimizer": w + states + g}


def check(est: MemoryByPhase, measured: dict[str, float], recompute: bool, kind: str) -> dict[str, Any]:
    """Estimate vs measured per phase and in total; ``kind`` says what was measured (device or host)."""
    ph = phase_estimate(est, recompute)
    m_max = max(measured[p] for p in PHASES)
    return {
        "measured_kind": kind,
        "comparable": kind.startswith("cuda"),   # host RSS includes the framework runtime: indicative only
        "estimate_gib": {p: round(ph[p], 4) for p in PHASES},
        "measured_gib": {p: round(measured[p], 4) for p in PHASES},
        "ratio_estimate_over_measured": {p: round(ph[p] / measured[p], 3) if measured[p] else None for p in PHASES},
        "estimate_total_gib": est.total, "measured_max_gib": round(m_max, 4),
        "ratio_total_over_measured_max": round(est.total / m_max, 3) if m_max else None,
        "components_gib": dataclasses.asdict(est),
    }
