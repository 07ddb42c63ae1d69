"""A multi-device training launch: this node's msrun of the job (an :class:`~porting.launch.jobs.MsrunJob` of kind
"training", its workers reading ``RUN/job.json``), or every node's command printed for a multi-node job that names
no node."""

from __future__ import annotations

import os
import shlex

import click

from model_zoo.errors import PortingError, RecipeError
from porting.job import Job
from porting.launch.jobs import MsrunJob
from porting.launch.outcome import launch_outcome, mark
from porting.train.data import token_cache
from porting.train.plan.launch import msrun_argv, train_spec, worker_args
from porting.train.recipe.schema import Recipe


def training_job(job: Job, node: int, resume: bool, extra: dict[str, str] | None = None) -> MsrunJob:
    """Node ``node``'s msrun of ``job`` (``resume``: the workers continue the last checkpoint), with the plan's
    HCCL timeouts where the user set none and ``extra`` on top of the child environment (the data's token file,
    a shrink's devices)."""
    if not 0 <= node < job.recipe.cluster.nodes:
        raise RecipeError(f"--launch-node {node}: the recipe has nodes 0..{job.recipe.cluster.nodes - 1}")
    spec = train_spec(job.recipe, job.run.path, node, worker_args(job.run.path, resume, job.revision))
    return MsrunJob.make("training", spec, defaults=job.plan.launch.env if job.plan.launch else {}, overrides=extra)


def launch_msrun(job: Job, node: int | None, resume: bool) -> bool:
    """Run this node's msrun of ``job`` to its end (True), or print every node's command when a multi-node job
    names no node (False). msrun and its workers die with this process (porting/launch/lifeline.py)."""
    rec, out = job.recipe, job.run.path
    if rec.cluster.nodes > 1 and node is None:
        click.echo(f"{rec.cluster.nodes} nodes: run on each node (same paths on every node):")
        for i in range(rec.cluster.nodes):
            spec = train_spec(rec, out, i, worker_args(out, resume, job.revision))
            click.echo(f"node {i}: " + " ".join(shlex.quote(a) for a in msrun_argv(spec)))
        return False
    node = node or 0
    msrun = training_job(job, node, resume, token_cache.for_workers(rec, out, node))   # tokenised here once
    click.echo(f"launching: {' '.join(shlex.quote(a) for a in msrun_argv(msrun.spec))}", err=True)
    before = mark(out)
    rc = msrun.run().code
    done = launch_outcome(out, before, rc, node_ranks(rec, node), clean=node == 0)
    if done.crashed_at_exit:
        click.echo(f"warning: msrun exited with {rc} after every rank of this node had logged the end of its run "
                   f"(a worker crashed at exit, in MindSpore's teardown; {out}/logs/msrun/worker_*.log); the run's "
                   "files are complete", err=True)
    if not done.finished:
        if done.stop is not None:   # the workers' own reason, when they stopped past the non-finite caps
            raise PortingError(f"msrun exited with {rc}: {done.stop[0]}")
        raise PortingError(f"msrun exited with {rc}; see {out}/logs/rank_*.log and {out}/logs/msrun/worker_*.log "
                           "(scheduler.log names ranks that timed out)")
    return True


def node_ranks(rec: Recipe, node: int) -> list[int]:
    """The global ranks node ``node`` runs."""
    per = rec.cluster.devices_per_node
    return list(range(node * per, (node + 1) * per))


def launch_devices(recipe: Recipe) -> list[int] | None:
    """The NPUs this node's job opens: ASCEND_RT_VISIBLE_DEVICES, else 0..devices_per_node-1 (Ascend)."""
    if recipe.cluster.device != "ascend":
        return None
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
    ids = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return ids or list(range(recipe.cluster.devices_per_node))
