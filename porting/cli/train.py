"""`port train`: full fine-tuning on MindSpore from a recipe (one device in-process, more under msrun)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import click

from model_zoo.errors import RecipeError
from porting.cluster import hccl_timeouts
from porting import train as T   # the face: names load on first use, a dry run never loads MindSpore


@click.command("train", epilog="""\b
Examples:
  port train recipes/tiny-cpu.yaml
  port train recipes/tiny-cpu.yaml --set batching.grad_accum_steps=2 --set schedule.max_steps=10
  port train recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --run-dir runs/dp2   # 2 msrun workers
  port train recipes/tiny-cpu.yaml --resume                  # continue from the last checkpoint
  port train recipes/7b-8card.yaml --dry-run                 # plan, memory by phase, msrun command
  port train recipes/13b-32card.yaml --dry-run --json        # the plan as JSON
  port train recipes/7b-8card.yaml --dry-run --calibration runs/rehearse-7b   # step from measured pieces
  port train recipes/13b-32card.yaml --launch-node 2         # run node 2's msrun command here
  port train recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --supervise   # watch, diagnose, resume""")
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe key, e.g. --set optimizer.lr=1e-4 (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the plan (memory by phase, msrun commands) and stop.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print the plan as JSON.")
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in the run directory.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Where the run writes (default: the recipe's output_dir).")
@click.option("--launch-node", type=int, default=None,
              help="Multi-node recipes: run this node's msrun command on this machine.")
@click.option("--supervise", is_flag=True,
              help="Watch every rank of this node; on a crash, hang or divergence keep the evidence in "
                   "RUN/incidents/N, diagnose it and resume from the last checkpoint (porting/launch/supervise.py).")
@click.option("--stall-timeout", type=click.FloatRange(1, 86_400), default=None,
              help="With --supervise: seconds without a log line before a rank counts as stalled "
                   "(default: from the plan's step time, under HCCL_EXEC_TIMEOUT).")
@click.option("--max-restarts", type=click.IntRange(0, 100), default=3, show_default=True,
              help="With --supervise: relaunches allowed before the run stops with its diagnosis.")
@click.option("--shrink", is_flag=True,
              help="With --supervise: when a rank's device fails its probe after an incident, relaunch on the node's "
                   "other devices with the same global batch (porting/launch/shrink.py).")
@click.option("--calibration", type=click.Path(file_okay=False), default=None, metavar="REHEARSAL",
              help="With --dry-run: predict the step from a `port rehearse` folder's measured pieces (its compute and "
                   "links rungs) instead of the roofline at peak, and rank layouts on them.")
@click.option("--no-preflight", is_flag=True,
              help="Launch without the preflight (stale processes, master port/address, rank table; see "
                   "`port doctor --cluster`).")
def command(recipe: str, overrides: tuple[str, ...], dry_run: bool, as_json: bool, resume: bool,
            run_dir: str | None, launch_node: int | None, supervise: bool, stall_timeout: float | None,
            max_restarts: int, no_preflight: bool, shrink: bool, calibration: str | None) -> None:
    """Fine-tune the model of RECIPE (all weights) with the recipe's data, batching and parallelism."""
    if shrink and not supervise:
        raise RecipeError("--shrink moves a supervised run onto fewer devices after a fault: add --supervise")
    # A dry run plans for a cluster, so the data and checkpoint may live only there: missing files become
    # warnings. A real run needs both and refuses with every missing path at once.
    rec = T.load_recipe(recipe, list(overrides), check_files=not dry_run)
    if shrink and rec.cluster.nodes > 1:
        raise RecipeError(f"--shrink relaunches one node's ranks on fewer devices; a {rec.cluster.nodes}-node run "
                          "would need every node relaunched together: drop --shrink")
    from porting.train.recipe.determinism import environment_conflicts, launch_problems

    bad = launch_problems(rec.determinism, shrink) + environment_conflicts(rec.determinism, rec.cluster.device,
                                                                           os.environ)
    if bad:   # determinism: bitwise, refused before anything starts (porting/train/recipe/determinism.py)
        raise RecipeError(f"{recipe}: determinism: bitwise: " + "; ".join(bad))
    if launch_node is not None:   # before the preflight waits for node 0 or a worker starts
        T.check_node_rank(launch_node, rec.cluster.nodes, "--launch-node")
    if rec.cluster.device == "ascend":   # an inference chip (310P/310B) stops here, dry run or not: one line
        from porting.diagnostics.doctor import require_training_device

        require_training_device()
    out = Path(run_dir or rec.output_dir)
    if dry_run:
        cal = None
        if calibration is not None:
            from porting.train.plan.calibrated import load

            cal = load(calibration)
        plan, _ = T.plan_run(rec, str(out), resume, dry_run, calibration=cal)
        padding, padding_line = T.dry_run_padding(rec)   # padding of bucketing vs packing on the recipe's data
        plan = dataclasses.replace(plan, padding=padding)
        timeouts = "\n" + hccl_timeouts.plan_line(os.environ, plan.launch.env) if plan.launch else ""
        click.echo(json.dumps(plan.to_dict(), indent=2) if as_json else T.format_plan(plan) + timeouts + "\n" + padding_line)
        T.check_fits(plan, recipe)
        return
    if calibration is not None:
        raise RecipeError("--calibration predicts a step for the plan: add --dry-run")
    from porting.cli._hooks import hooks
    from porting.job import Job, Source
    from porting.job.spec import file_sha256
    from porting.launch import start
    from porting.launch.options import Launch, Supervision

    # the recipe is resolved here once: every rank, relaunch and shrink reads the job document written from it
    job = Job.of(rec, out, Source(recipe, file_sha256(Path(recipe)), tuple(overrides), tuple(sys.argv)))
    T.check_fits(job.plan, recipe)
    launch = Launch(launch_node, resume, Supervision(stall_timeout, max_restarts, shrink) if supervise else None)
    hk = hooks(preflight=not no_preflight)
    job, note = start.prepare(job, launch, hk)
    if note:
        click.echo(note, err=True)
    start.run(job, hk, launch)
