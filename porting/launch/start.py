"""`port train` after its plan: what is checked before anything starts (:func:`prepare`), then the one launch the
recipe asks for (:func:`start`): one device in this process, msrun on more, or the supervised session.

Nothing here imports MindSpore: one device trains in this process (MindSpore loads there, in
porting/train/run/), more devices train in msrun's workers, and the launcher only checks, writes the plan and
waits. What only the CLI may import (`port diagnose`, `port doctor`, the preflight's explanation) is passed in.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from model_zoo.errors import RecipeError
from model_zoo.files import write_atomic
from porting.rundir import RunDir, check_side_paths
from porting.train.plan.execution import GraphCompileError, compile_cache_problem
from porting.train.plan.make import TrainPlan
from porting.train.recipe.schema import Recipe
from porting.train.run import faults


@dataclass(frozen=True)
class Supervision:
    """`port train --supervise`'s settings (porting/launch/session.py)."""

    stall_timeout: float | None
    max_restarts: int
    shrink: bool
    diagnose: Callable[[Path, int], dict]


def prepare(rec: Recipe, plan: TrainPlan, out: Path, *, resume: bool, model_config: dict,
            preflight: Callable[[Recipe], None] | None) -> str | None:
    """Every refusal that can come before a worker starts, each one line here instead of one in every worker's
    log: a test hook that does not parse, a run directory that cannot be resumed or would be overwritten,
    MindSpore's process-wide compile cache, the preflight, a side path in the way. Then the run directory and
    its plan.json. Returns the run-directory check's note (None when it has none)."""
    from porting.train.run.checkpoint.resume_check import check_run_dir

    faults.active()
    note = check_run_dir(out, resume, rec, model_config)
    # the launcher's own MindSpore context is untouched, so the environment says all (the workers check the
    # context too, porting/train/run/step/runtime.py)
    problem = compile_cache_problem(rec, os.environ)
    if problem:
        raise GraphCompileError(problem)
    if preflight is not None:
        preflight(rec)
    _make_run_dir(out)
    check_side_paths(out, ("logs", "checkpoints") + (("tensorboard",) if rec.logging.tensorboard else ())
                     + (("hf",) if rec.checkpointing.export_hf else ()))   # a file in the way, a full disk: now
    write_atomic(RunDir(out).plan, json.dumps(plan.to_dict(), indent=2), error=RecipeError)
    return note


def start(rec: Recipe, recipe_path: str, overrides: list[str], out: Path, plan: TrainPlan, *, resume: bool,
          launch_node: int | None, supervision: Supervision | None, preflight: Callable[[Recipe], None] | None,
          doctor: Callable[[], dict], command: list[str]):
    """The launch: the supervised session, one device in this process (its RunResult), or this node's msrun."""
    if supervision is not None:
        from porting.launch.session import run_supervised

        # where the supervisor writes: real directories and files of the run or absent, never a link planted there
        check_side_paths(out, ("incidents", "supervise"))

        return run_supervised(rec, recipe_path, overrides, out, resume, launch_node, plan, supervision.stall_timeout,
                              supervision.max_restarts, preflight=preflight, diagnose=supervision.diagnose,
                              shrink=supervision.shrink)
    if rec.world_size == 1:
        from porting.train import train
        from porting.train.run.lifeline import watch_parent

        watch_parent()   # started by a supervisor (PORT_PARENT): this run ends when the supervisor is gone
        return train(rec, out, resume=resume, command=command, doctor=doctor)
    from porting.launch.msrun import launch_msrun

    return launch_msrun(rec, recipe_path, overrides, out, resume, launch_node, plan.launch.env if plan.launch else {})


def _make_run_dir(out: Path) -> None:
    """Create the run directory, or say in one line why it cannot be (a file in the way, read-only disk)."""
    if out.exists() and not out.is_dir():
        raise RecipeError(f"{out}: exists and is not a directory; choose another --run-dir (or output_dir)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RecipeError(f"{e.filename or out}: cannot create the run directory ({e.strerror}); choose a "
                          "--run-dir on a writable disk") from None
