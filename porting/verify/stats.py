"""The one difference function of port's verifications and the one table of their tolerances.

:func:`compare` turns a MindSpore tensor and its reference into :class:`Stats`: max abs difference,
max elementwise relative difference (the denominator floored at 1e-6), max abs scaled by the reference's
peak, relative L2 error, cosine similarity, mean abs difference and each side's count of non-finite
values, accumulated in float64 over chunks, so memory stays a few MiB whatever the tensor's size. `port verify`, `port bisect` and
`port compare` measure with it.

The tolerances, all here (tests/test_house_rules.py finds a second table):

- :data:`TOLERANCES`: the zoo cell against HF transformers on the same weights and inputs, per compute
  dtype (README "Parity tolerances"; `port verify`, `port bisect`, `port eval`);
- :data:`TRAINING_CURVE_TOLERANCES`: a port training run against a `port baseline` run of the same
  recipe, per step (`port compare`; docs/baseline.md "Tolerances"), and :data:`IMPORTED_CURVE_GATE`,
  the curve-level gate against an imported CUDA log (porting/baseline/curve.py), and :data:`FIELD_GATES`, the
  acceptance gates of the field that `port compare` and `port report` show first (porting/baseline/gates.py);
- :data:`LAYOUT_TOLERANCES`: the same training run at another parallel layout (`port rehearse`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from model_zoo.errors import ConfigError

# --------------------------------------------------------------------------- parity: zoo cell vs HF
# Max abs difference of logits / hidden states, abs difference of the mean loss, and relative difference
# of gradient norms, per compute dtype. fp32 is 1e-4 on logits; the half precisions are bounded by their
# 8- and 11-bit mantissas over a handful of layers.
TOLERANCES: dict[str, dict[str, float]] = {
    "float32": {"logits": 1e-4, "loss": 1e-5, "hidden": 1e-4, "grad_rel": 1e-4},
    "float16": {"logits": 5e-2, "loss": 5e-3, "hidden": 5e-2, "grad_rel": 2e-2},
    "bfloat16": {"logits": 2.5e-1, "loss": 3e-2, "hidden": 2.5e-1, "grad_rel": 1e-1},
}


def tolerances(dtype: str) -> dict[str, float]:
    """The parity tolerances of a compute dtype (one-line ConfigError for another dtype)."""
    if dtype not in TOLERANCES:
        raise ConfigError(f"--dtype {dtype!r}: expected one of {', '.join(TOLERANCES)}")
    return TOLERANCES[dtype]


# --------------------------------------------------------------------------- training curves
@dataclasses.dataclass(frozen=True)
class CurveTolerances:
    """A step passes when |loss_run - loss_base| <= loss_atol + loss_rtol * |loss_base|."""

    loss_rtol: float
    loss_atol: float
    logits_atol: float                          # max |logit_run - logit_base| on the probe batch
    min_throughput_ratio: float | None = None   # run / baseline tokens/s; None: report only
    max_memory_ratio: float | None = None       # run / baseline peak; None: report only


# Training-curve tolerances, by the precision both sides trained in. Measured margins, see docs/baseline.md
# "Tolerances": fp32 both sides agree to ~1e-5 relative on stories260K over 8 steps; the bounds leave room
# for longer runs and other BLAS libraries.
TRAINING_CURVE_TOLERANCES: dict[str, CurveTolerances] = {
    "float32": CurveTolerances(loss_rtol=1e-3, loss_atol=1e-4, logits_atol=2e-2),
    "bf16-mixed": CurveTolerances(loss_rtol=2e-2, loss_atol=1e-2, logits_atol=0.5),
    "bfloat16": CurveTolerances(loss_rtol=3e-2, loss_atol=2e-2, logits_atol=1.0),
    "float16": CurveTolerances(loss_rtol=2e-2, loss_atol=1e-2, logits_atol=0.5),
}


def curve_tolerances(dtype: str, **override: float | None) -> CurveTolerances:
    """The training-curve tolerances of a precision, with the given fields overridden (None: keep)."""
    if dtype not in TRAINING_CURVE_TOLERANCES:
        raise ConfigError(f"baseline dtype {dtype!r} has no tolerances; known: {', '.join(TRAINING_CURVE_TOLERANCES)}")
    return dataclasses.replace(TRAINING_CURVE_TOLERANCES[dtype], **{k: v for k, v in override.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class CurveGate:
    """The curve-level gate against an imported CUDA log (porting/baseline/curve.py says why each number)."""

    rtol: float = 0.01          # mean relative loss error, first steps and every window
    first_steps: int = 100
    window: int = 10            # logged points per window
    spike_k: float = 5.0


IMPORTED_CURVE_GATE = CurveGate()


def curve_gate(**override: float | int | None) -> CurveGate:
    """The imported-curve gate with the given fields overridden (None: keep the default)."""
    return dataclasses.replace(IMPORTED_CURVE_GATE, **{k: v for k, v in override.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class FieldGates:
    """The acceptance gates teams sign a migrated fine-tune with (porting/baseline/gates.py computes them; docs/baseline.md
    "The field's gates" defines each). A window is (first step, last step), both included; None: every compared step.

    - ``mean_rel_max``: loss mean relative error <= 5%, the community task pool for NPU ports of training recipes
      ("平均误差小于5%", verl-project/verl-ascend-recipe issues #14, #74 and siblings, 2026);
    - ``weighted_max``: loss-weighted per-step relative error <= 2%, the gate of a Qwen3.5-35B-A3B LoRA port to 8 A3
      against 8 H200 (ByteDance-Seed/VeOmni#1034: 1.063% measured);
    - ``eval_max``: evaluation loss within 5%, the same task pool's "下游评测误差5%内" applied to the held-out loss;
    - ``throughput_min``: tokens/s per device-equivalent >= 0.7x the baseline's, the task pool's "A2上达成A100的0.7倍以上"
      (one 910C die counts as one A2 card: Huawei's ModelArts sizing guide, modelarts_llm_train_590604).
    """

    mean_rel_max: float = 0.05
    mean_rel_steps: tuple[int, ...] | None = None
    weighted_max: float = 0.02
    weighted_steps: tuple[int, ...] | None = None
    eval_max: float = 0.05
    throughput_min: float = 0.7
    # a run on the CPU is not the target: its throughput row is shown, judged only when the bound was asked for
    judge_cpu_throughput: bool = False


FIELD_GATES = FieldGates()


def field_gates(**override: float | bool | tuple[int, ...] | None) -> FieldGates:
    """The field's gates with the given fields overridden (None: keep the shipped default)."""
    return dataclasses.replace(FIELD_GATES, **{k: v for k, v in override.items() if v is not None})


LR_RTOL = 1e-3   # an imported log's learning rates, printed with 4+ significant digits, agree to this

# --------------------------------------------------------------------------- parallel layouts
# The same fp32 run at another TP/DP layout: the reductions only reorder sums
# (tests/train/test_tensor_parallel.py measures 1e-5 on the loss).
LAYOUT_TOLERANCES: dict[str, float] = {"loss_atol": 1e-4, "grad_norm_rtol": 1e-3}


# --------------------------------------------------------------------------- the difference function
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
    mean_abs: float        # mean |ms - ref|

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


FLOOR = 1e-6       # the denominator floor of the elementwise relative difference
_CHUNK = 1 << 20   # elements per pass: the float64 temporaries stay a few MiB whatever the tensor's size


def compare(ms: np.ndarray, ref: np.ndarray) -> Stats:
    """The statistics of ``ms`` against ``ref`` (same shape), accumulated in float64 over chunks. A
    non-finite value on either side makes every difference NaN (so no tolerance passes it)."""
    a_all, b_all = np.asarray(ms).reshape(-1), np.asarray(ref).reshape(-1)
    nf_a = nf_b = 0
    max_abs = max_rel = peak = dot = na2 = nb2 = nd2 = sum_abs = 0.0
    for i in range(0, a_all.size, _CHUNK):
        a = a_all[i:i + _CHUNK].astype(np.float64)
        b = b_all[i:i + _CHUNK].astype(np.float64)
        nf_a += int(a.size - np.count_nonzero(np.isfinite(a)))
        nf_b += int(b.size - np.count_nonzero(np.isfinite(b)))
        if nf_a or nf_b:
            continue
        d = np.abs(a - b)
        max_abs = max(max_abs, float(d.max()))
        sum_abs += float(d.sum())
        max_rel = max(max_rel, float((d / np.maximum(np.abs(b), FLOOR)).max()))
        peak = max(peak, float(np.abs(b).max()))
        dot, na2, nb2, nd2 = dot + float(a @ b), na2 + float(a @ a), nb2 + float(b @ b), nd2 + float(d @ d)
    shape = tuple(np.shape(ms))
    if nf_a or nf_b or a_all.size == 0:
        nan = float("nan")
        return Stats(nan, nan, nan, nan, nan, nf_a, nf_b, shape, nan)
    na, nb, nd = math.sqrt(na2), math.sqrt(nb2), math.sqrt(nd2)
    cos = dot / (na * nb) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    return Stats(max_abs, max_rel, max_abs / peak if peak > 0 else max_abs, nd / nb if nb > 0 else nd, cos, 0, 0, shape,
                 sum_abs / a_all.size)
