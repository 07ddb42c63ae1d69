"""The result of `port compare` as records (format ``port-compare``, version 1; docs/baseline.md lists every field).

Two kinds, as the baseline file has two (:mod:`porting.baseline.document`):

* :class:`Comparison` -- against a measured baseline (:func:`porting.baseline.compare.compare`): the settings
  checked, the loss per step, the probe logits, the throughput and memory ratios and the memory estimator;
* :class:`CurveComparison` -- against an imported CUDA log (:func:`porting.baseline.curve.compare_imported`): the
  like-for-like checks, the aligned points and the curve gate.

Both carry the field's gates (``field``: :class:`FieldVerdict`, porting/baseline/gates.py) and both sides'
effective settings (``settings_table``: :class:`SettingRow`, porting/baseline/effective.py), and
the verdict as the one result row of every verification (``checks``:
:class:`porting.verify.check.Check`), the failures in words and ``ok``. `port compare` prints them
(:mod:`porting.baseline.render`) or writes :meth:`to_dict` as JSON (``--json``, ``--out``); `port report` reads
that file back with :func:`from_json` (the reading rules of :mod:`model_zoo.typed`: every key's type
checked, every problem in one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from model_zoo import typed
from model_zoo.typed import spec
from porting.verify.check import Check
from porting.verify.stats import CurveGate, CurveTolerances, FieldGates

FORMAT = "port-compare"
FORMAT_VERSION = 1


# ------------------------------------------------------------------------------- the field's verdict, both kinds
@dataclass(frozen=True)
class GateRow:
    """One of the field's gates (porting/baseline/gates.py): the value, the bound it is held to, PASS, FAIL or N/A
    (``status``; N/A says why in ``figures``), the numbers behind it and where the bound comes from."""

    name: str
    value: float | None
    threshold: float
    bound: str               # "<=" or ">="
    status: str              # "PASS", "FAIL" or "N/A"
    figures: str
    source: str


@dataclass(frozen=True)
class FieldVerdict:
    """The field's gates as a team signs them: every row PASS or N/A (and at least one loss gate measured) is ok."""

    gates: FieldGates
    rows: tuple[GateRow, ...]
    ok: bool


@dataclass(frozen=True)
class SettingRow:
    """One setting that moves a loss curve, as each side really ran it (porting/baseline/effective.py): ``equal`` is
    None where one side's value cannot be known from its files; ``effect`` is the expected effect of a difference."""

    setting: str
    cuda: str
    port: str
    equal: bool | None
    effect: str
    cuda_source: str
    port_source: str


# ------------------------------------------------------------------------------- against a measured baseline
@dataclass(frozen=True)
class SettingDiff:
    key: str
    baseline: Any
    run: Any
    key_setting: bool        # one of document.KEY_SETTINGS: the runs are not like for like


@dataclass(frozen=True)
class SettingsCheck:
    differ: tuple[SettingDiff, ...]
    like_for_like: bool


@dataclass(frozen=True)
class StepDiff:
    step: int
    baseline: float          # NaN where the baseline's loss was not finite
    run: float
    abs_diff: float
    rel_diff: float | None
    grad_norm_baseline: float | None
    grad_norm_run: float | None
    grad_norm_rel_diff: float | None
    ok: bool


@dataclass(frozen=True)
class LossCheck:
    steps_compared: int
    baseline_steps: int
    steps_missing_in_run: tuple[int, ...]
    max_abs_diff: float | None
    max_rel_diff: float | None
    max_grad_norm_rel_diff: float | None
    failing_steps: tuple[int, ...]
    per_step: tuple[StepDiff, ...]
    ok: bool


@dataclass(frozen=True)
class ProbeCheck:
    """The run's logits on the baseline's probe batch; ``reason`` when not available, ``source`` (where the run's
    weights came from) and the differences when they are."""

    after_step: int | None
    tolerance_max_abs: float
    available: bool
    reason: str | None = spec(omit_none=True)
    source: str | None = spec(omit_none=True)
    max_abs_diff: float | None = spec(omit_none=True)
    mean_abs_diff: float | None = spec(omit_none=True)
    argmax_agreement: float | None = spec(omit_none=True)
    ok: bool | None = None   # None: not checked (skipped or nothing to load)


@dataclass(frozen=True)
class ThroughputCheck:
    baseline_tokens_per_s: float | None
    run_tokens_per_s: float | None
    ratio_run_over_baseline: float | None
    baseline_device: str | None
    min_ratio: float | None
    ok: bool | None          # None: no bound asked for


@dataclass(frozen=True)
class MemoryCheck:
    baseline_peak_gib: float | None
    baseline_kind: str | None
    baseline_peak_by_phase_gib: dict[str, float | None] | None
    run_peak_gib: float | None
    run_kind: str | None
    ratio_run_over_baseline: float | None
    same_kind: bool
    max_ratio: float | None
    ok: bool | None


@dataclass(frozen=True)
class Comparison:
    """`port compare` against a measured baseline."""

    estimator: dict | None   # porting.baseline.estimate.check of the run's plan.json; None without one
    baseline: str | None     # the baseline file
    run: str                 # the run directory
    run_notes: tuple[str, ...]
    dtype: str | None
    tolerances: CurveTolerances
    settings: SettingsCheck
    loss: LossCheck
    probe: ProbeCheck
    throughput: ThroughputCheck
    memory: MemoryCheck
    checks: tuple[Check, ...]
    failures: tuple[str, ...]
    ok: bool
    breakdown: dict | None = None   # porting.baseline.profile.side_by_side: both sides' sampled step breakdowns
    field: FieldVerdict | None = spec(omit_none=True)    # the field's gates (porting/baseline/gates.py)
    settings_table: tuple[SettingRow, ...] = ()          # both sides' effective settings (porting/baseline/effective.py)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return _with_format(self)


# ---------------------------------------------------------------------------- against an imported curve
@dataclass(frozen=True)
class CurveSource:
    """What the imported log is (the baseline's ``imported`` section, as `port compare` prints it)."""

    from_: str | None = spec(key="from")
    format_name: str | None = None
    contains: tuple[str, ...] | None = None
    lacks: tuple[str, ...] | None = None
    logging_interval: int | None = None
    loss_is: str | None = None


@dataclass(frozen=True)
class GlobalBatch:
    baseline: int | None
    run: int | None


@dataclass(frozen=True)
class TokensSeen:
    """Tokens seen by the last aligned step (HF counts padded input tokens, port real ones)."""

    step: int
    baseline: int
    run: int | None
    ratio_run_over_baseline: float | None


@dataclass(frozen=True)
class CurvePoint:
    """One logged baseline point and the run's mean over the same window of steps."""

    steps: tuple[int, ...]   # [first, last] step of the window
    step: int
    baseline: float | None
    run: float               # NaN where a loss of the window was not finite
    grad_norm_baseline: float | None
    grad_norm_run: float | None
    lr_baseline: float | None
    lr_run: float | None
    lr_run_next: float | None
    rel_diff: float          # inf where either side is not finite or the baseline is 0


@dataclass(frozen=True)
class Window:
    steps: tuple[int, ...]
    mean_rel_diff: float
    ok: bool


@dataclass(frozen=True)
class Spikes:
    """Spikes of one series on both sides; only ``available: false`` when a side did not log it."""

    available: bool
    baseline: int | None = spec(omit_none=True)
    run: int | None = spec(omit_none=True)
    baseline_steps: tuple[int, ...] | None = spec(omit_none=True)
    run_steps: tuple[int, ...] | None = spec(omit_none=True)
    ok: bool | None = spec(omit_none=True)


@dataclass(frozen=True)
class GateResult:
    gate: CurveGate
    points: int
    first_steps_mean_rel_diff: float | None
    run_mean_rel_diff: float | None
    max_rel_diff: float | None
    windows: tuple[Window, ...]
    spikes: dict[str, Spikes]
    failures: tuple[str, ...]
    ok: bool


@dataclass(frozen=True)
class CurveComparison:
    """`port compare` against an imported CUDA log: like for like, then the curve gate."""

    baseline: str | None
    run: str
    imported: CurveSource
    global_batch: GlobalBatch
    tokens: TokensSeen | None
    curve: GateResult
    per_point: tuple[CurvePoint, ...]
    notes: tuple[str, ...]
    not_available: tuple[str, ...]
    checks: tuple[Check, ...]
    failures: tuple[str, ...]
    ok: bool
    field: FieldVerdict | None = spec(omit_none=True)
    settings_table: tuple[SettingRow, ...] = ()
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    kind: str = "imported"

    def to_dict(self) -> dict[str, Any]:
        return _with_format(self, "kind")


AnyComparison = Union[Comparison, CurveComparison]


def rows(checks: list[Check]) -> tuple[Check, ...]:
    """The result rows as the file holds them (a value that is not finite is null, Check.to_dict), so a
    comparison read back from its JSON equals the one `port compare` made and prints the same table."""
    return tuple(Check.from_dict(c.to_dict()) for c in checks)


def _with_format(rec: AnyComparison, *head: str) -> dict[str, Any]:
    """The record with ``format``, ``format_version`` (and ``head``) first, as `port compare` has always written it."""
    first = ("format", "format_version", *head)
    rest = [typed.json_key(f) for f in typed.known_fields(type(rec)) if f.name not in first]
    return typed.write(rec, order=(*first, *rest))


def from_json(doc: Any, where: str) -> AnyComparison:
    """The comparison in a `port compare --json` file; ValueError naming ``where`` and every problem."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: top level is {type(doc).__name__}, expected an object")
    if doc.get("format") != FORMAT or doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{where}: format {str(doc.get('format'))[:40]!r} version "
                         f"{str(doc.get('format_version'))[:10]}, expected {FORMAT!r} version {FORMAT_VERSION}")
    cls = CurveComparison if doc.get("kind") == "imported" else Comparison
    out: list[str] = []
    typed.problems(cls, doc, "", out)
    if out:
        raise ValueError(f"{where}: not a {FORMAT} v{FORMAT_VERSION} file: {'; '.join(out[:8])}"
                         + (f" (and {len(out) - 8} more)" if len(out) > 8 else ""))
    return typed.build(cls, doc)
