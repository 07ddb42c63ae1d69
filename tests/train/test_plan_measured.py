"""The memory plan's per-phase figures against measured memory of the same graphs on the CPU at two
model widths (benchmarks/plan_memory_cpu.py: method, and why the comparison is of the width-dependent
part). Tolerance: the plan's width-dependent bytes of each phase are within [0.5, 1.5] of the measured
ones (measured on this machine: forward/backward 0.56, update 0.82; BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from benchmarks import plan_memory_cpu as bench

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("phase", bench.PHASES)
def test_plan_phase_tracks_measured_memory_at_two_widths(phase):
    measured = [bench.measure(w, phase) for w in bench.WIDTHS]
    planned = [bench.planned_mib(w)[phase] for w in bench.WIDTHS]
    assert measured[1] > measured[0] > 0 and planned[1] > planned[0] > 0
    ratio = (planned[1] - planned[0]) / (measured[1] - measured[0])
    assert 0.5 <= ratio <= 1.5, (phase, measured, planned, ratio)
