"""The fault-injection hooks, in one place: each a ``PORT_TEST_*`` environment variable, off unless set, for tests
and rehearsals only. :data:`HOOKS` is the registry; :func:`active` parses every hook at once into a
:class:`Faults`, which the code that injects reads; docs/test-hooks.md lists them (tests/train/test_faults.py
checks the page against :data:`HOOKS`).

A value that does not parse stops with one line naming the variable, the form expected and how to turn it off.
A hook that is off costs nothing: the step reads ``Faults.nonfinite is None`` once and feeds the loss scale it
always feeds (porting/train/run/loop.py), so a run without hooks computes exactly what it computed before.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from model_zoo.errors import PortingError


@dataclass(frozen=True)
class Hook:
    env: str
    form: str       # the value's form, with an example
    effect: str     # what it does
    where: str      # the module that injects it


HOOKS: tuple[Hook, ...] = (
    Hook("PORT_TEST_NONFINITE", "STEPS[@RANK]: STEPS is 3, 3,5, 4- (step 4 onwards) or * (every step), 1-based; "
         "@1: rank 1 only, else every rank",
         "the worker feeds a NaN loss scale into those steps, so that rank's gradients and, through the all-reduce, "
         "every rank's gradient norm are NaN; the graph, the all-reduce and the skip are the real ones",
         "porting/train/run/loop.py"),
    Hook("PORT_TEST_COMM_DELAY", "RANK:SECONDS, seconds 0..600, e.g. 1:0.5",
         "that rank sleeps before the timed all-reduce of every sampled step (a slow rank for the comm-wait "
         "measure)", "porting/train/run/step/commwait.py"),
    Hook("PORT_TEST_COMPILE_DELAY", "RANK:SECONDS, seconds 0..600, e.g. 1:12",
         "that rank marks itself ready SECONDS after the node's other ranks did, once its compiles before step 1 "
         "are done (a rank whose graphs compile longer than the collective timeout after the others')",
         "porting/train/run/step/ready.py"),
    Hook("PORT_TEST_SAVE_DELAY", "RANK:SECONDS, seconds 0..600, e.g. 1:30",
         "that rank sleeps SECONDS inside every checkpoint save, after its heartbeat says it is writing its file "
         "(a rank that freezes inside a save while the others wait at the save's barrier)",
         "porting/train/run/checkpoint/save.py"),
    Hook("PORT_TEST_CRASH_AT_EXIT", "RANK, e.g. 1",
         "that rank's msrun worker dies by SIGSEGV after its run ended, as MindSpore's teardown at exit sometimes "
         "does (the launch must still count as finished)", "porting/launch/workers/train.py"),
    Hook("PORT_TEST_BAD_DEVICES", "ID[,ID...], e.g. 2,5",
         "the device probe of those ids fails without touching the device (a CPU has no device that can break)",
         "porting/launch/device_probe.py"),
    Hook("PORT_TEST_REFUSE_STATIC_PARALLEL", "1",
         "MindSpore's static-graph distributed parallel API, which MindSpore retires after 2.11 (the auto-parallel "
         "context's setter and resetter, nn's gradient reducers, mindspore.parallel.auto_parallel.AutoParallel), "
         "raises when code outside MindSpore calls it: the proof that port's parallel runs do without it. On in "
         "the whole test suite (tests/conftest.py), so every msrun test runs with it",
         "porting/train/run/step/probes.py"),
    Hook("PORT_TEST_COLLECTIVE_TRACE", "DIR, an absolute path, e.g. /tmp/trace",
         "every collective a rank launches from Python (PyNative: each call is one launch) is appended to "
         "DIR/rank_<r>.jsonl as {op, shape, group}: the PyNative op trace that counts the gradient buckets",
         "porting/train/run/step/probes.py"),
    Hook("PORT_TEST_PLANT_DIVERGENCE", "STEP:HF_NAME:PHASE:RELATIVE, PHASE forward, collective, gradient or "
         "update, |RELATIVE| <= 1, e.g. 3:model.layers.1.mlp.up_proj.weight:gradient:0.01 (forward: HF_NAME "
         "model.layers.<i>)",
         "that tensor (a decoder layer's output, a parameter's gradient or its update) is multiplied by 1+RELATIVE "
         "at that 1-based step, on every rank: the divergence `port diverge` must name exactly. collective: the "
         "all-reduce output of the gradient bucket holding HF_NAME's gradient (its inputs untouched); with port's "
         "overlapped buckets (PyNative, data parallel) a gradient is multiplied before the all-reduce, on every rank",
         "porting/train/run/fingerprint.py"),
)
_PLANT = re.compile(r"([0-9]{1,9}):([A-Za-z0-9_.]{1,200}):(forward|collective|gradient|update):([-+0-9.eE]{1,24})")
_NONFINITE = re.compile(r"(\*|[0-9]+-|[0-9]+(?:,[0-9]+)*)(?:@([0-9]+))?")
_INTS = re.compile(r"[0-9]+(?:,[0-9]+)*")


class FaultHookError(PortingError):
    """A ``PORT_TEST_*`` variable does not parse."""


@dataclass(frozen=True)
class Faults:
    """The hooks that are on (all off: ``Faults()``)."""

    nonfinite: tuple[str, int | None] | None = None   # (steps, only this rank or None)
    comm_delay: tuple[int, float] | None = None       # (rank, seconds)
    compile_delay: tuple[int, float] | None = None    # (rank, seconds)
    save_delay: tuple[int, float] | None = None       # (rank, seconds)
    crash_at_exit: int | None = None                  # rank
    bad_devices: frozenset[int] = field(default_factory=frozenset)
    refuse_static_parallel: bool = False
    collective_trace: str | None = None               # the folder of the per-rank traces
    plant: tuple[int, str, str, float] | None = None  # (step, HF name, phase, relative)

    def nan_at(self, step_no: int, rank: int) -> bool:
        """Whether rank ``rank``'s loss scale is NaN at step ``step_no`` (1-based)."""
        if self.nonfinite is None:
            return False
        steps, only = self.nonfinite
        if only is not None and only != rank:
            return False
        if steps == "*" or (steps.endswith("-") and step_no >= int(steps[:-1])):
            return True
        return not steps.endswith("-") and str(step_no) in steps.split(",")

    def delay_for(self, rank: int) -> float:
        """Seconds rank ``rank`` sleeps before the timed all-reduce (0.0: none)."""
        return _seconds_of(self.comm_delay, rank)

    def compile_delay_for(self, rank: int) -> float:
        """Seconds rank ``rank`` marks itself ready after the node's other ranks, before step 1 (0.0: none)."""
        return _seconds_of(self.compile_delay, rank)

    def save_delay_for(self, rank: int) -> float:
        """Seconds rank ``rank`` sleeps inside each checkpoint save, writing its file (0.0: none)."""
        return _seconds_of(self.save_delay, rank)


def _seconds_of(hook: tuple[int, float] | None, rank: int) -> float:
    """A (rank, seconds) hook's seconds for ``rank``: 0.0 when off or for another rank."""
    return hook[1] if hook is not None and hook[0] == rank else 0.0


def _bad(env: str, value: str) -> FaultHookError:
    hook = next(h for h in HOOKS if h.env == env)
    return FaultHookError(f"{env}={value[:40]!r}: expected {hook.form}; it is a test hook, unset it for a real run")


def _rank_seconds(env: str, v: str) -> tuple[int, float]:
    r, sep, s = v.partition(":")
    try:
        rank, seconds = int(r), float(s)
    except ValueError:
        rank, seconds = -1, -1.0
    if not sep or rank < 0 or not 0 <= seconds <= 600:
        raise _bad(env, v)
    return rank, seconds


def parse(environ: Mapping[str, str]) -> Faults:
    """Every hook of ``environ``; :class:`FaultHookError` for the first that does not parse."""
    out: dict = {}
    raw = {h.env: environ.get(h.env, "").strip() for h in HOOKS}
    if v := raw["PORT_TEST_NONFINITE"]:
        m = _NONFINITE.fullmatch(v)
        if m is None:
            raise _bad("PORT_TEST_NONFINITE", v)
        out["nonfinite"] = (m.group(1), int(m.group(2)) if m.group(2) is not None else None)
    for env, key in (("PORT_TEST_COMM_DELAY", "comm_delay"), ("PORT_TEST_COMPILE_DELAY", "compile_delay"),
                     ("PORT_TEST_SAVE_DELAY", "save_delay")):
        if v := raw[env]:
            out[key] = _rank_seconds(env, v)
    if v := raw["PORT_TEST_CRASH_AT_EXIT"]:
        if not _INTS.fullmatch(v) or "," in v:
            raise _bad("PORT_TEST_CRASH_AT_EXIT", v)
        out["crash_at_exit"] = int(v)
    if v := raw["PORT_TEST_BAD_DEVICES"]:
        if not _INTS.fullmatch(v):
            raise _bad("PORT_TEST_BAD_DEVICES", v)
        out["bad_devices"] = frozenset(int(x) for x in v.split(","))
    if v := raw["PORT_TEST_REFUSE_STATIC_PARALLEL"]:
        if v != "1":
            raise _bad("PORT_TEST_REFUSE_STATIC_PARALLEL", v)
        out["refuse_static_parallel"] = True
    if v := raw["PORT_TEST_COLLECTIVE_TRACE"]:
        if not v.startswith("/") or len(v) > 4096 or "\n" in v:
            raise _bad("PORT_TEST_COLLECTIVE_TRACE", v)
        out["collective_trace"] = v
    if v := raw["PORT_TEST_PLANT_DIVERGENCE"]:
        out["plant"] = _plant(v)
    return Faults(**out)


def _plant(v: str) -> tuple[int, str, str, float]:
    m = _PLANT.fullmatch(v)
    try:
        rel = float(m.group(4)) if m else math.nan
    except ValueError:
        rel = math.nan
    if m is None or int(m.group(1)) < 1 or not abs(rel) <= 1.0:
        raise _bad("PORT_TEST_PLANT_DIVERGENCE", v)
    return int(m.group(1)), m.group(2), m.group(3), rel


def active() -> Faults:
    """The hooks this process's environment turns on."""
    return parse(os.environ)
