"""`port compare`'s step-breakdown section (porting/baseline/profile.py): the baseline's profiled steps beside
the run's sampled ones, per part and phase, per 1,000 tokens each device processes."""

from __future__ import annotations

from porting.baseline.profile import render_side_by_side, side_by_side
from porting.rundir import breakdown as bd

MS = 1_000_000


def _rec(step: int, rank: int, source: str, compute_ms: int, wall_ms: int) -> bd.Breakdown:
    ks = [bd.Kernel("Default/MatMul-op0", 0, compute_ms // 2 * MS),
          bd.Kernel("Gradients/Default/MatMul-op1", compute_ms // 2 * MS, compute_ms // 2 * MS)]
    return bd.from_timeline(step, rank, source, (0, wall_ms * MS), [("step", 0, wall_ms * MS)], ks)


def test_side_by_side_normalises_by_the_tokens_each_device_processes(tmp_path):
    # baseline: one device, the global batch of 4096 tokens, 400 ms compute of a 500 ms step
    base = (_rec(2, 0, "torch-profiler", 400, 500).to_dict(),)   # as MeasuredBaseline.breakdown holds it
    # run: two data-parallel ranks, 2048 tokens each, 100 ms compute of a 150 ms step
    for rank in (0, 1):
        bd.append(tmp_path, _rec(2, rank, "mindspore-profiler", 100, 150))
    sbs = side_by_side(base, tmp_path, 4096, 2048)
    assert sbs["baseline"]["compute_s"] == 0.4 and sbs["run"]["compute_s"] == 0.1
    text = "\n".join(render_side_by_side(sbs))
    # compute per 1k tokens: baseline 400/4.096 = 97.66 ms, run 100/2.048 = 48.83 ms, ratio 0.50
    assert "compute                    97.66     48.83    0.50" in text, text
    assert "phase backward" in text and "phase forward" in text


def test_a_missing_or_bad_side_leaves_the_section_out_with_a_note(tmp_path):
    assert side_by_side(None, tmp_path, 1, 1) is None
    bd.append(tmp_path, _rec(2, 0, "mindspore-profiler", 100, 150))
    sbs = side_by_side([{"step": "x"}], tmp_path, 1, 1)
    assert "baseline" not in sbs and "missing key" in sbs["notes"][0]
    assert render_side_by_side(sbs)[0].startswith("NOTE (breakdown): baseline breakdown[0]")
