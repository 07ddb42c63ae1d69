"""`port train` after its plan: what is checked and written before anything starts (:func:`prepare`), then the one
launch the job asks for (:func:`run`): one device in this process, msrun on more, or the supervised session, each
ending in one :class:`Result`.

Nothing here imports MindSpore: one device trains in this process (MindSpore loads there, in porting/train/run/),
more devices train in msrun's workers, and the launcher only checks, writes the job and waits. What only the CLI may
import (`port diagnose`, `port doctor`, the preflight) comes down in :class:`~porting.job.Hooks`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import click

from model_zoo.errors import RecipeError
from model_zoo.files import write_atomic
from porting.job import Hooks, Job
from porting.job.spec import newest_revision
from porting.launch.options import Launch
from porting.launch.outcome import after_finished
from porting.rundir import check_side_paths
from porting.train.plan.execution import GraphCompileError, compile_cache_problem
from porting.train.run import faults


@dataclass(frozen=True)
class Result:
    """How a launch ended, whichever path ran it."""

    launched: bool                 # False: a multi-node job's commands were printed, nothing ran here
    world_size: int
    steps: int | None = None       # steps trained in this process (one device, unsupervised)
    last_loss: float | None = None
    restarts: int | None = None    # a supervised run's relaunches (None: not supervised)

    def line(self, run_dir: Path) -> str:
        """The line `port train` ends with."""
        if self.restarts is not None:
            return f"done: {self.world_size} worker(s), {self.restarts} restart(s); run directory {run_dir}"
        if self.steps is None:
            return f"done: {self.world_size} workers; run directory {run_dir}"
        if self.steps == 0:   # resumed at its last step: there is no loss to report
            return f"done: nothing to train, the run was already complete; run directory {run_dir}"
        return f"done: {self.steps} steps, final loss {self.last_loss:.4f}; run directory {run_dir}"


def prepare(job: Job, launch: Launch, hooks: Hooks) -> tuple[Job, str | None]:
    """Every refusal that can come before a worker starts, each one line here instead of one in every worker's log:
    a test hook that does not parse, a run directory that cannot be resumed or would be overwritten, MindSpore's
    process-wide compile cache, the preflight, a side path in the way. Then the run directory, its plan.json and
    the job document: the revision this launch runs (a resume with an edited recipe writes the next one, and the
    difference is returned with the run-directory check's note to be printed), with the environment report taken
    once here."""
    from porting.train.run.checkpoint.resume_check import check_run_dir

    faults.active()
    out = job.run.path
    notes = [check_run_dir(out, launch.resume, job.recipe, job.plan_model_config())]
    # the launcher's own MindSpore context is untouched, so the environment says all (the workers check the
    # context too, porting/train/run/step/runtime.py)
    problem = compile_cache_problem(job.recipe, os.environ)
    if problem:
        raise GraphCompileError(problem)
    only_prints = job.recipe.cluster.nodes > 1 and launch.node is None   # node 0's launcher prints every command
    if hooks.preflight is not None and not only_prints:
        hooks.preflight(job, launch.node or 0)
    _make_run_dir(out)
    check_side_paths(out, ("logs", "checkpoints") + (("tensorboard",) if job.recipe.logging.tensorboard else ())
                     + (("hf",) if job.recipe.checkpointing.export_hf else ())
                     + (("incidents", "supervise") if launch.supervision is not None else ()))
    if newest_revision(job.run) is not None:
        job = job.resumed(Job.read(job.run))
        if job.start.changes:
            notes.append(f"{'resume' if launch.resume else 'start'}: the recipe differs from the run's job document "
                         f"({len(job.start.changes)} change(s): {'; '.join(job.start.changes)}); written as revision "
                         f"{job.revision}")
    job = job.with_environment(hooks.doctor())
    job.write()
    write_atomic(job.run.plan, json.dumps(job.plan.to_dict(), indent=2), error=RecipeError)
    return job, "\n".join(n for n in notes if n) or None


def run(job: Job, hooks: Hooks, launch: Launch) -> Result:
    """The launch of a prepared job: the supervised session, one device in this process, or this node's msrun; its
    line printed, then (node 0 of a multi-worker run) the HF export the recipe asks for."""
    from porting.train.run.lifeline import watch_parent

    watch_parent()   # started by a rehearsal or a supervisor (PORT_PARENT): this launch ends when it is gone
    if launch.supervision is not None:
        from porting.launch.session import run_supervised

        restarts, job = run_supervised(job, hooks, launch)   # the revision the last launch ran (a shrink's)
        res = Result(True, job.recipe.world_size, restarts=restarts)
    elif job.recipe.world_size == 1:
        from porting.launch.workers.train import run_rank

        # the document as every rank reads it, not the object that wrote it
        done = run_rank(Job.read(job.run, job.revision), launch.resume, distributed=False)
        res = Result(True, 1, done.steps_done, done.last_loss)
    else:
        from porting.launch.msrun import launch_msrun

        res = Result(launch_msrun(job, launch.node, launch.resume), job.recipe.world_size)
    if res.launched:
        click.echo(res.line(job.run.path))
        after_finished(job.recipe, job.run.path, launch.node or 0, click.echo)
    return res


def _make_run_dir(out: Path) -> None:
    """Create the run directory, or say in one line why it cannot be (a file in the way, read-only disk)."""
    if out.exists() and not out.is_dir():
        raise RecipeError(f"{out}: exists and is not a directory; choose another --run-dir (or output_dir)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RecipeError(f"{e.filename or out}: cannot create the run directory ({e.strerror}); choose a "
                          "--run-dir on a writable disk") from None
