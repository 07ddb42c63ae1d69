"""The rank's side of ``determinism: bitwise`` (the switches and their sources: porting/train/recipe/determinism.py).

:func:`apply` runs first in the rank's MindSpore setup (porting/train/run/step/runtime.py), before the device and
the collectives are initialised, as ``mindspore.set_deterministic``'s documentation asks: it refuses an environment
that undoes a switch, exports the switches the launcher's plan did not (a one-device run starts no child), turns on
MindSpore's deterministic mode, requests CANN's batch-consistent level where the installed CANN has it, and sets the
global seeds. :func:`in_force` reads back what this process really runs with, for manifest.json (the settings table's
port side shows it): the recipe's intent is never recorded as a fact.
"""

from __future__ import annotations

import os
from typing import Any

import mindspore as ms
import numpy as np

from model_zoo.errors import RecipeError
from porting.env import cann_version
from porting.train.recipe import determinism as rules
from porting.train.recipe.schema import Recipe


def apply(recipe: Recipe) -> None:
    """Set every switch of a bitwise recipe in this process (nothing when ``determinism: default``)."""
    if recipe.determinism != "bitwise":
        return
    device = recipe.cluster.device
    bad = rules.environment_conflicts(recipe.determinism, device, os.environ)
    if bad:
        raise RecipeError("determinism: bitwise: " + "; ".join(bad))
    for name, value in rules.launch_env(recipe.determinism, device).items():
        os.environ.setdefault(name, value)   # read by CANN and HCCL when they initialise, after this
    _deterministic_mode()
    level, _ = rules.cann_level(_cann(), device)
    if level is not None:
        ms.set_context(ascend_config={"ge_options": {"global": {rules.GE_LEVEL_OPTION: level}}})
    ms.set_seed(recipe.seed)
    np.random.seed(recipe.seed)


def _deterministic_mode() -> None:
    """``mindspore.set_deterministic(True)`` once per process: a second call raises in MindSpore 2.10, so a process
    that already runs deterministic (an earlier in-process run) keeps it, and one set to OFF is refused."""
    if ms.get_context("deterministic") == "ON":
        return
    try:
        ms.set_deterministic(True)
    except RuntimeError as e:
        raise RecipeError(f"determinism: bitwise: MindSpore's deterministic mode was already set OFF in this process "
                          f"({e}); start `port train` in a new process") from None


def _cann() -> str | None:
    return cann_version()


def in_force(recipe: Recipe) -> dict[str, Any] | None:
    """The switches this process runs with (read back, not assumed); None when ``determinism: default``."""
    if recipe.determinism != "bitwise":
        return None
    device = recipe.cluster.device
    out: dict[str, Any] = {"mindspore_deterministic": ms.get_context("deterministic")}
    out.update({s.name: os.environ.get(s.name, "unset") for s in rules.switches_for(device)})
    out["cann_batch_consistency"] = rules.cann_level(_cann(), device)[1]
    out["seed"] = recipe.seed
    out["data_order"] = (f"seeded permutation (seed {recipe.seed})" if recipe.data.shuffle else "file order")
    out["host_cpus"] = os.cpu_count()
    return out
