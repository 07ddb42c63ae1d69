"""The memory plan's per-phase figures against measured memory of the same graphs on the CPU at two
model widths (benchmarks/plan_memory_cpu.py: the method, peak RSS per phase in its own process, and
why the comparison is of the width-dependent part). Tolerance: planned / measured within [0.75, 1.33]
(measured here: forward/backward at 16 tokens 1.0, update 0.8). The activations of the CPU's unfused
reference graph are not within it (planned / measured 0.56 at 256 tokens): a known gap, held by a
strict xfail so that closing it shows."""

from __future__ import annotations

import pytest

from benchmarks import plan_memory_cpu as bench

pytestmark = pytest.mark.slow


def _ratio(phase: str, seq: int) -> float:
    row = bench.compare_case(phase, seq)
    measured, planned = row["measured_mib"], row["planned_mib"]
    assert measured[1] > measured[0] > 0 and planned[1] > planned[0] > 0, row
    return row["ratio_planned_over_measured"]


@pytest.mark.parametrize("phase, seq", [("forward_backward", 16), ("apply", 256)])
def test_plan_phase_tracks_measured_memory_at_two_widths(phase, seq):
    ratio = _ratio(phase, seq)
    assert 0.75 <= ratio <= 1.33, (phase, seq, ratio)


@pytest.mark.xfail(strict=True, reason="the activation formula counts a fused-kernel graph's tensors; MindSpore's "
                                       "CPU reference graph holds about 3x per token (BENCHMARKS.md)")
def test_plan_activations_track_the_cpu_reference_graph():
    assert 0.75 <= _ratio("forward_backward", 256) <= 1.33
