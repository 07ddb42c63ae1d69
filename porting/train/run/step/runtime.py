"""MindSpore's process-wide setup for a training run: the device, graph mode, the device memory pool, and
under msrun the collectives. Nothing of MindSpore's static-graph parallel context is set: data parallel's
gradient buckets are port's own (porting/train/run/step/buckets.py; issue 48)."""

from __future__ import annotations

import os

import mindspore as ms
from mindspore.communication import get_rank, init
from mindspore.device_context.cpu.op_tuning import threads_num

from porting.train.run import faults
from porting.train.run.step import deterministic, execution, probes
from porting.train.plan.memory import usable_hbm_gib
from porting.train.recipe.schema import Recipe


def apply_memory_budget(recipe: Recipe) -> str | None:
    """On Ascend, cap MindSpore's device memory pool at the usable HBM; returns the size set."""
    if recipe.cluster.device != "ascend":
        return None
    size = f"{usable_hbm_gib(recipe):g}GB"
    execution.cap_device_memory(size)   # mindspore.runtime.set_memory, or the older set_context(max_device_memory)
    return size


def configure_mindspore(recipe: Recipe, distributed: bool) -> None:
    """The recipe's execution mode (graph or PyNative) on its device, the memory pool capped, and under msrun the
    collectives' init (the step cells issue every collective themselves, in their own groups)."""
    target = {"cpu": "CPU", "ascend": "Ascend"}[recipe.cluster.device]
    deterministic.apply(recipe)   # determinism: bitwise, before the device and the collectives initialise
    hooks = faults.active()
    probes.install(hooks, None)   # test probes (porting/train/run/step/probes.py): off unless a PORT_TEST_* hook is set
    execution.refuse_compile_cache(recipe)   # port keys MindSpore's compile cache itself (run/step/precompile.py)
    execution.set_mode(recipe)   # graph (default) or pynative: the same step cells either way
    # set_device may run once, before any kernel; a process that already runs on the target (a
    # second in-process run, a test session) keeps it.
    if ms.get_context("device_target") != target:
        ms.set_device(target)
    apply_memory_budget(recipe)   # Ascend: the pool capped at the usable HBM the plan budgets
    if distributed and recipe.cluster.device == "cpu":
        # Workers share the host's cores: without a cap each spawns a thread per core and they thrash.
        threads_num(max(1, (os.cpu_count() or 1) // recipe.cluster.devices_per_node))
    if distributed:
        init()
    probes.install(hooks, get_rank() if distributed else 0)
