"""The field's gates (porting/baseline/gates.py): each definition recomputed by hand on a real CUDA curve, the
windows, a non-finite loss, the throughput per device-equivalent and the evaluation gate; a planted 3% offset fails
the 2% gate and passes the 5% one. No training here: the end-to-end pair is tests/baseline/test_compare_cli.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from porting.baseline import gates
from porting.verify.stats import FIELD_GATES, field_gates

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cuda_jobs"


def real_curve() -> list[tuple[int, float]]:
    """The loss every 10 steps of a real LLaMA-Factory run (tests/fixtures/cuda_jobs/README.md)."""
    rows = [json.loads(x) for x in (FIX / "logs" / "medical_trainer_log.jsonl").read_text().splitlines() if x.strip()]
    return [(r["current_steps"], r["loss"]) for r in rows if r.get("loss") is not None][:200]


def no_throughput() -> gates.Throughput:
    return gates.Throughput(None, None, None, None, None, None)


def test_definitions_by_hand_on_a_real_curve():
    base = real_curve()
    # a run that differs by a step-dependent amount: the two definitions give different numbers
    pairs = [(s, b, b * (1 + 0.01 * (i % 5)) + 0.002) for i, (s, b) in enumerate(base)]
    mre = sum(abs(r - b) / b for _, b, r in pairs) / len(pairs)
    lw = sum(abs(r - b) for _, b, r in pairs) / sum(b for _, b, _ in pairs)
    assert gates.mean_relative_error(pairs) == pytest.approx(mre, rel=1e-12)
    assert gates.loss_weighted_error(pairs) == pytest.approx(lw, rel=1e-12)
    assert lw != pytest.approx(mre, rel=1e-3)   # the weighting matters on a real curve
    # loss-weighted = each step's relative error weighted by the baseline's loss
    weighted = sum(b * (abs(r - b) / b) for _, b, r in pairs) / sum(b for _, b, _ in pairs)
    assert gates.loss_weighted_error(pairs) == pytest.approx(weighted, rel=1e-12)


def test_a_planted_3_percent_offset_fails_2_and_passes_5():
    pairs = [(s, b, b * 1.03) for s, b in real_curve()]
    v = gates.verdict(pairs, FIELD_GATES, no_throughput())
    rows = {r.name: r for r in v.rows}
    assert rows["loss mean relative error"].status == "PASS"
    assert rows["loss mean relative error"].value == pytest.approx(0.03)
    assert rows["loss-weighted per-step relative error"].status == "FAIL"
    assert rows["loss-weighted per-step relative error"].value == pytest.approx(0.03)
    assert not v.ok and "loss-weighted per-step relative error 3.000% > 2.000%" in gates.failures(v)[0]
    assert "VeOmni#1034" in rows["loss-weighted per-step relative error"].source
    assert "verl-ascend-recipe" in rows["loss mean relative error"].source
    loose = gates.verdict(pairs, field_gates(weighted_max=0.05), no_throughput())
    assert loose.ok   # the thresholds are the user's to set


def test_windows_choose_the_steps_and_an_empty_window_is_not_applicable():
    base = real_curve()
    # a 10% gap in steps 500-1000 only: each window sees its own steps
    pairs = [(s, b, b * (1.10 if 500 <= s <= 1000 else 1.0)) for s, b in base]
    whole = gates.verdict(pairs, FIELD_GATES, no_throughput()).rows[1]
    early = gates.verdict(pairs, field_gates(weighted_steps=(1, 400)), no_throughput()).rows[1]
    gap = gates.verdict(pairs, field_gates(weighted_steps=(500, 1000)), no_throughput()).rows[1]
    assert early.status == "PASS" and early.value == 0 and "steps 10-400, 40 compared" in early.figures
    assert gap.status == "FAIL" and gap.value == pytest.approx(0.10)
    assert 0 < whole.value < gap.value
    none = gates.verdict(pairs, field_gates(mean_rel_steps=(90_000, 99_000)), no_throughput())
    assert none.rows[0].status == "N/A" and "no compared step in the window 90000-99000" in none.rows[0].figures
    assert not none.ok and none.rows[1].status == "FAIL"   # the weighted gate still covers every step
    assert gates.verdict(pairs, field_gates(mean_rel_steps=(90_000, 99_000), weighted_max=0.2), no_throughput()).ok


def test_a_non_finite_loss_fails_never_drops_out():
    pairs = [(s, b, b) for s, b in real_curve()[:20]]
    pairs[7] = (pairs[7][0], pairs[7][1], math.nan)
    v = gates.verdict(pairs, FIELD_GATES, no_throughput())
    assert [r.status for r in v.rows[:2]] == ["FAIL", "FAIL"] and "a loss is not finite" in v.rows[0].figures
    null = gates.verdict([(1, 2.0, None), (2, 1.5, 1.5)], FIELD_GATES, no_throughput())
    assert null.rows[0].status == "FAIL"


def test_throughput_per_device_equivalent():
    # 2 dies at 1,800 tokens/s together against one A100 at 1,000: 900 / 1000 = 0.9 >= 0.7
    t = gates.Throughput(1000.0, 1, "NVIDIA A100-SXM4-80GB", 1800.0, 2, "Ascend device (a 910C die = one A2 card)")
    row = gates.throughput_row(t, 0.7)
    assert row.status == "PASS" and row.value == pytest.approx(0.9) and row.bound == ">="
    assert "900 tokens/s per device" in row.figures and "set against an A100" not in row.figures
    slow = gates.throughput_row(gates.Throughput(1000.0, 1, "NVIDIA H200", 1200.0, 2, "die"), 0.7)
    assert slow.status == "FAIL" and slow.value == pytest.approx(0.6)
    assert "the 0.7x gate is set against an A100, this baseline ran on NVIDIA H200" in slow.figures
    unknown = gates.throughput_row(gates.Throughput(5000.0, None, "H200", 1200.0, 2, "die", "padded"), 0.7)
    assert unknown.status == "N/A" and "baseline device count" in unknown.figures
    # a CPU run is not the target: the ratio is shown, judged only when the bound was asked for
    cpu = gates.Throughput(1000.0, 1, "AMD EPYC", 300.0, 1, "CPU process")
    shown = gates.verdict([(1, 2.0, 2.0)], FIELD_GATES, cpu).rows[3]
    assert shown.status == "N/A" and shown.value == pytest.approx(0.3) and shown.figures.startswith("not judged")
    asked = gates.verdict([(1, 2.0, 2.0)], field_gates(throughput_min=0.2, judge_cpu_throughput=True), cpu).rows[3]
    assert asked.status == "PASS" and asked.threshold == 0.2


def test_evaluation_gate_at_the_last_common_step():
    base = [(500, 0.320), (1000, 0.358), (1500, 0.394)]
    run = [(500, 0.325), (1000, 0.370)]
    row = gates.eval_row(base, run, 0.05)
    assert row.status == "PASS" and row.value == pytest.approx(abs(0.370 - 0.358) / 0.358)
    assert "step 1000" in row.figures and "2 common evaluation step(s)" in row.figures
    assert gates.eval_row(base, [(500, 0.5)], 0.05).status == "FAIL"
    assert gates.eval_row(base, [], 0.05).status == "N/A"
    assert gates.eval_row(base, [(700, 0.3)], 0.05).status == "N/A"


def test_the_window_option_is_one_line():
    from model_zoo.errors import ConfigError
    from porting.cli.compare import step_window

    assert step_window("5:20", "--weighted-steps") == (5, 20)
    for bad in ("20:5", "a:b", "5", "5:", "-1:3", "1:2:3"):
        with pytest.raises(ConfigError, match="expected FIRST:LAST"):
            step_window(bad, "--weighted-steps")
