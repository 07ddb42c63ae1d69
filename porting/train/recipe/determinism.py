"""``determinism: bitwise``: everything that makes two launches of the same recipe give the same bits on the target.

What port sets, each with its source (docs/training.md "Determinism"):

- MindSpore's deterministic mode, ``mindspore.set_deterministic(True)`` (the successor of ``set_context(
  deterministic="ON")``), before the device and the collectives are initialised, as its documentation asks: operators
  pick their deterministic kernels (CANN ``ACL_OPT_DETERMINISTIC``), and MindSpore itself exports
  ``HCCL_DETERMINISTIC=true`` and ``TE_PARALLEL_COMPILER=1`` (mindspore/context.py ``set_deterministic``);
- ``HCCL_DETERMINISTIC=true``: reductions of the collectives in a fixed order (CANN HCCL environment variables); in
  the plan's launch environment, so every node exports it (porting/train/plan/comm.py ``launch_plan``);
- on Ascend, the matmul K-shift switches an NPU precision-alignment guide sets, ``CLOSE_MATMUL_K_SHIFT=1`` and
  ``ATB_MATMUL_SHUFFLE_K_ENABLE=0`` (volcengine/verl docs/ascend_tutorial/dev_guide/precision_analysis/
  precision_alignment_zh.md);
- on Ascend with CANN >= 9.2, its batch-consistent mode, GE's deterministic level 3 (bitwise-identical outputs
  whatever the batch position), passed as MindSpore's ``ascend_config`` ``ge_options`` ``ge.deterministicLevel``;
  below 9.2 it is recorded as not available;
- the data order and the seeds: port's data order is already a function of ``seed`` alone (porting/train/data/
  batching.py ``plan_epoch``: ``default_rng([seed, epoch])``; no other random draw in the data or the step), and the
  rank sets MindSpore's and NumPy's global seeds to ``seed`` before the model is built.

What it refuses, with the reason (:func:`environment_conflicts`, :func:`launch_problems`): an environment variable the
user set to a value that undoes a switch (the user's environment wins over the plan's, porting/launch/children.py),
and a supervised ``--shrink``, which relaunches on fewer devices: another data-parallel layout sums in another order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

Mode = Literal["default", "bitwise"]
CANN_BATCH_CONSISTENT = (9, 2)          # the first CANN with GE's deterministic level 3 (ASCEND_FACTS)
GE_LEVEL_OPTION, GE_LEVEL = "ge.deterministicLevel", "3"
GUIDE = "volcengine/verl docs/ascend_tutorial/dev_guide/precision_analysis/precision_alignment_zh.md"


@dataclass(frozen=True)
class Switch:
    """One environment switch: its value, where it applies and where it is documented."""

    name: str
    value: str
    ascend_only: bool
    accepts: tuple[str, ...]            # values a user may have set that keep it deterministic
    source: str


SWITCHES: tuple[Switch, ...] = (
    Switch("HCCL_DETERMINISTIC", "true", False, ("true", "strict"),
           "CANN HCCL environment variables; mindspore.set_deterministic exports it"),
    Switch("TE_PARALLEL_COMPILER", "1", False, ("1",), "mindspore.set_deterministic requires it (context.py)"),
    Switch("CLOSE_MATMUL_K_SHIFT", "1", True, ("1",), GUIDE),
    Switch("ATB_MATMUL_SHUFFLE_K_ENABLE", "0", True, ("0",), GUIDE),
)


def switches_for(device: str) -> tuple[Switch, ...]:
    """The environment switches of ``device`` ("cpu" or "ascend")."""
    return tuple(s for s in SWITCHES if device == "ascend" or not s.ascend_only)


def launch_env(mode: str, device: str) -> dict[str, str]:
    """The environment a bitwise run's children get (the plan's launch environment); empty when off."""
    return {s.name: s.value for s in switches_for(device)} if mode == "bitwise" else {}


def environment_conflicts(mode: str, device: str, environ: Mapping[str, str]) -> list[str]:
    """Each switch the user's environment sets to a value that breaks bitwise runs, with the reason and the fix."""
    if mode != "bitwise":
        return []
    return [f"{s.name}={environ[s.name]!r} in the environment undoes determinism: bitwise (it needs "
            f"{' or '.join(s.accepts)}: {s.source}); unset it or set {s.name}={s.value}"
            for s in switches_for(device) if s.name in environ and environ[s.name] not in s.accepts]


def launch_problems(mode: str, shrink: bool) -> list[str]:
    """What a launch option would break (the recipe's own keys keep the bits: the data order is seeded)."""
    if mode == "bitwise" and shrink:
        return ["--shrink relaunches on fewer devices after a fault: another data-parallel layout sums the gradients "
                "in another order, so the bits differ from an unshrunk launch; drop --shrink or set determinism: default"]
    return []


def cann_level(cann: str | None, device: str) -> tuple[str | None, str]:
    """(GE's deterministic level to request or None, the words the record keeps) for the installed CANN."""
    if device != "ascend":
        return None, "not applicable (CPU)"
    if not cann:
        return None, "not available: no CANN version found"
    parts = []
    for p in cann.replace("RC", ".").split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) >= CANN_BATCH_CONSISTENT:
        return GE_LEVEL, f"level {GE_LEVEL} requested ({GE_LEVEL_OPTION}, CANN {cann})"
    return None, f"not available: CANN {cann} is older than 9.2"
