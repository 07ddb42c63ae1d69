"""`port train`'s library, by job, each job importing only the ones below it:

- ``recipe/``: the recipe schema, bounded YAML, cluster shapes (no MindSpore);
- ``data/``: formats, chat templates, tokenising, bucketing, packing: NumPy arrays both `port train`
  (MindSpore) and `port baseline` (PyTorch) consume (no MindSpore);
- ``plan/``: layout arithmetic, memory, sharding, roofline, launch environment, the plan and its text
  (no MindSpore, no data);
- ``run/``: the training loop, steps, ZeRO, checkpoints, export, watching: the only part that imports
  MindSpore. Starting, watching and stopping processes (msrun, the supervisor) is porting/launch/, above this.

The names below are the face the CLI, the baseline and the benchmarks use. They are looked up on first
use (PEP 562), so ``import porting.train`` loads nothing, and a dry run never loads MindSpore.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it
_FACE: dict[str, str] = {
    "Recipe": "porting.train.recipe.schema",
    "load_recipe": "porting.train.recipe.schema",
    "validate_recipe": "porting.train.recipe.schema",
    "recipe_dict": "porting.train.recipe.schema",
    "build_plan": "porting.train.data.batching",
    "dry_run_padding": "porting.train.data.padding",
    "plan_config": "porting.train.plan.make",
    "make_plan": "porting.train.plan.make",
    "plan_run": "porting.train.plan.make",
    "check_node_rank": "porting.train.recipe.hardware",
    "check_fits": "porting.train.plan.make",
    "check_tensor_parallel": "porting.train.plan.make",
    "format_plan": "porting.train.plan.render",
    "estimate_memory": "porting.train.plan.memory",
    "train": "porting.train.run.loop",
    "interrupted_saves": "porting.train.run.checkpoint.save",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module 'porting.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_FACE[name]), name)
    globals()[name] = value
    return value
