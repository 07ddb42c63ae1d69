"""What one rank's run records: the typed result of an optimizer step, the metrics line made from it, the
communication-wait sample, the summary and the manifest, as the run-directory format defines them
(porting/rundir/records.py). The loop (porting/train/run/loop.py) calls these; nothing here runs a step.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from porting import rundir
from porting.env import versions
from porting.train.data.batching import BatchSchedule, Step
from porting.train.recipe.schema import Recipe, recipe_dict
from porting.train.run.step import deterministic
from porting.train.run.step.commwait import CommWait
from porting.train.run.step.nonfinite import WINDOW_SKIP
from porting.train.run.step.result import StepResult


def host_rss_gib() -> float | None:
    try:
        import psutil  # deferred: optional; without it the field is left out

        return round(psutil.Process().memory_info().rss / (1 << 30), 3)
    except Exception:  # psutil missing or unsupported platform: the field is simply left out
        return None


def step_record(step: Step, r: StepResult, lr: float, loss_scale: float) -> rundir.StepRecord:
    """One metrics.jsonl line from the step's plan and what ``Trainer.run_step`` measured."""
    tokens_per_s = step.global_real_tokens / r.step_time_s if r.step_time_s > 0 else 0.0
    return rundir.StepRecord(
        step=step.index + 1, epoch=step.epoch, loss=r.loss, lr=lr, grad_norm=r.grad_norm,
        tokens=step.global_real_tokens, loss_tokens=step.global_tokens, padded_tokens=step.global_padded_tokens,
        tokens_per_s=round(tokens_per_s, 2), step_time_s=round(r.step_time_s, 5),
        padding_fraction=round(step.padding_fraction, 5), compile=r.compile,
        shapes=tuple(sorted({list(mb.shape)[1] for mb in step.micro_batches})), loss_scale=loss_scale,
        skipped=not r.applied, skip_reason=r.skip_reason, host_rss_gib=host_rss_gib())


def comm_record(rec: rundir.StepRecord, comm: CommWait, log: logging.Logger) -> rundir.StepRecord:
    """On a sampled step: the timed all-reduce (every rank), its value logged; rank 0's record gets all ranks'."""
    waits = comm.measure(rec.step)
    if waits is None:
        return rec
    log.info(f"comm wait step {rec.step}: this rank {waits[comm.rank]:.4f}s; all ranks "
             + " ".join(f"{w:.4f}" for w in waits))
    if comm.rank != 0:
        return rec
    return dataclasses.replace(rec, comm_wait_s=waits[0], comm_wait_ranks_s=waits)


def summarize(records: list[rundir.StepRecord], plan: BatchSchedule, graphs: int, shapes_seen: int,
              compiled=None) -> rundir.SummaryRecord:
    """The summary line: steady speed apart from the compiles (before step 1 and any step's excess over the
    steady median). ``compiled``: precompile's report (porting/train/run/step/precompile.py), or None."""
    steady = [r for r in records if not r.compile and r.skip_reason != WINDOW_SKIP]   # those ran nothing
    comp = [r for r in records if r.compile]
    med = float(np.median([r.step_time_s for r in steady])) if steady else 0.0
    compile_time = sum(max(0.0, r.step_time_s - med) for r in comp) + (compiled.seconds if compiled else 0.0)
    st_time = sum(r.step_time_s for r in steady)
    padded = max(1, sum(r.padded_tokens for r in records))
    return rundir.SummaryRecord(
        steps=len(records), compile_steps=len(comp), compile_time_s=round(compile_time, 3),
        steady_tokens_per_s=round(sum(r.tokens for r in steady) / st_time, 2) if st_time else None,
        steady_step_time_s=round(med, 5) if steady else None, compiled_graphs=graphs,
        shapes_seen=shapes_seen, bucket_shapes=len(plan.boundaries),
        padding_fraction=round(1 - sum(r.tokens for r in records) / padded, 5),
        final_loss=records[-1].loss if records else None,
        precompile_s=compiled.seconds if compiled else None, precompiled_graphs=compiled.graphs if compiled else None)


@dataclass(frozen=True)
class Provenance:
    """What a rank records of where its run came from (the launcher's job document, porting/job/): the user's
    command, the environment report the launcher took once, and which document the ranks ran."""

    command: tuple[str, ...] = ()
    environment: Mapping[str, Any] | None = None
    job: str | None = None


def run_manifest(recipe: Recipe, model_dir: Path, cfg, plan: BatchSchedule, world_size: int, start: int,
                 prov: Provenance) -> rundir.RunManifest:
    """What this run is (manifest.json), as the run-directory format defines it."""
    command = prov.command
    return rundir.RunManifest(
        recipe=recipe_dict(recipe), versions=versions(),
        doctor=dict(prov.environment) if prov.environment is not None else None,
        model=rundir.ModelInfo(source=recipe.model.source, dir=str(model_dir), config=cfg.to_hf(),
                               parameters=cfg.num_parameters()),
        data=plan.data.report.as_dict(), bucketing=plan.describe(), seed=recipe.seed, world_size=world_size,
        command=tuple(command or sys.argv), started=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        resumed_from_step=start or None, job=prov.job, determinism=deterministic.in_force(recipe))
