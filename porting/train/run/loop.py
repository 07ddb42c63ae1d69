"""The training run: one rank's loop, from a validated recipe to checkpoints, metrics and an HF export.

World size 1 runs in the calling process; more ranks run this same function inside `msrun` workers
(porting/launch/workers/train.py). Every rank logs to ``logs/rank_<r>.log``; rank 0 writes
``metrics.jsonl``, ``manifest.json``, checkpoints and the HF export. Tensor parallel's pieces (the rank
grid, its groups, slicing and merging) live in :mod:`porting.train.run.step.grid`; what stays here is the loop
and its Trainer (with ZeRO's and packing's inputs); what a rank builds before step 1 is
:mod:`porting.train.run.step.setup`, what it records :mod:`porting.train.run.records`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import ParameterTuple

from model_zoo.errors import PortingError
from porting import rundir
from porting.model_paths import resolve_hf
from porting.rundir import ranklog
from porting.rundir.heartbeat import Heartbeat
from porting.train.data.batching import BatchSchedule, Step
from porting.train.recipe.schedule import lr_at
from porting.train.recipe.schema import Recipe
from porting.train.run.checkpoint import save as ckpt
from porting.train.run.checkpoint import read as ckpt_read
from porting.train.run.step import execution
from porting.train.run import faults
from porting.train.run import fingerprint
from porting.train.run.checkpoint.lora_export import export_final as lora_export_final
from porting.train.run.step import grid as grid_mod
from porting.train.run.step import nonfinite
from porting.train.run.step import precompile as pre
from porting.train.run.step import probes
from porting.train.plan.comm import fusion_words
from porting.train.run.checkpoint import resume_check
from porting.train.run.step import setup
from porting.train.run.step import cells as train_step
from porting.train.run.step import zero
from porting.train.run.step.breakdown import StepSampler
from porting.train.run.step.commwait import CommWait
from porting.train.run.checkpoint.export import export_hf
from porting.train.run.step.grid import Grid
from porting.train.run.heldout import eval_record
from porting.train.run.step.loss_scale import LossScaler
from porting.train.run.records import Provenance, comm_record, run_manifest, step_record, summarize
from porting.train.run.step.runtime import configure_mindspore
from porting.train.run.step.cells import compiled_graphs
from porting.train.run.step.result import StepResult
from porting.train.run.watch import Watch
from porting.rundir.paths import RunDir


class DivergenceError(PortingError):
    """The loss or the gradients became NaN/inf."""
    exit_code = 3


@dataclass
class RunResult:
    run_dir: Path
    steps_done: int
    last_loss: float
    compiled_graphs: int
    shapes_seen: int




# --------------------------------------------------------------------------- the loop
class Trainer:
    def __init__(self, recipe: Recipe, run_dir: Path, rank: int, world_size: int, model, tokenizer_dir: Path,
                 plan: BatchSchedule, log: logging.Logger, grid: Grid | None = None):


        self.ms = ms
        self.packed_inputs = train_step.packed_inputs
        self.recipe, self.run_dir, self.rank, self.world = recipe, run_dir, rank, world_size
        self.model, self.tokenizer_dir, self.plan, self.log = model, tokenizer_dir, plan, log
        params = list(model.trainable_params())
        opt = recipe.optimizer
        # Data parallel (and optimizer sharding) run over the ranks with the same tensor-parallel slice.
        self.grid = grid = grid or Grid(rank, world_size)
        dp = grid.dp
        self.shards = dp if recipe.parallel.optimizer_sharding and dp > 1 else 1
        self.accum = recipe.batching.grad_accum_steps
        grad_fp32 = recipe.precision.grad_reduce_dtype == "float32"
        groups = grid_mod.step_groups(model, grid)
        self.layout = groups.pop("layout", {})
        groups["comm_fusion"] = recipe.parallel.comm_fusion   # port's gradient buckets (run/step/buckets.py)
        self.zero = None
        if world_size > 1:   # every rank writes its own checkpoint file, between two barriers
            self.barrier_cell = train_step.Barrier()
        if self.shards > 1:

            tp = {} if grid.tp == 1 else dict(tp_group=grid.tp_group, tp_rank=grid.tp_rank,
                                             tp_sharded=groups["tp_sharded"])
            self.optimizer, self.zero = zero.optimizer_for(recipe, model.config, params, grid.dp_rank, dp,
                                                           group=grid.dp_group, **tp)
            log.info(f"optimizer sharding: {self.zero.describe()}")
        else:
            self.optimizer = train_step.AdamW(params, tuple(opt.betas), opt.eps, opt.weight_decay)
        if self.accum == 1:
            self.fused = train_step.FusedTrainStep(model, self.optimizer, dp, opt.grad_clip, grad_fp32, **groups)
            self.cells = [self.fused]
        elif self.zero is not None and self.zero.stage == 2:
            self.buffers = self.optimizer.shard_buffers(grad_fp32)
            self.grad_step = zero.ShardedAccumGradStep(model, self.optimizer, self.buffers)
            self.apply = train_step.ApplyStep(self.optimizer, self.buffers, dp, opt.grad_clip, grad_fp32, **groups)
            self.cells = [self.grad_step, self.apply]
        else:
            self.buffers = train_step.accumulation_buffers(ParameterTuple(params), grad_fp32)
            self.grad_step = train_step.AccumGradStep(model, self.optimizer.params, self.buffers)
            self.apply = train_step.ApplyStep(self.optimizer, self.buffers, dp, opt.grad_clip, grad_fp32, **groups)
            self.cells = [self.grad_step, self.apply]
        reducer = getattr(self.cells[-1], "reducer", None)
        if reducer is not None:
            log.info(f"data parallel {dp}: {reducer.describe()}")
        # fp32 master weights (bf16/fp16 parameters) are optimizer state: saved and restored with m and v
        self.state_params = params + list(self.optimizer.masters) + list(self.optimizer.m) + list(self.optimizer.v)
        self.scaler = LossScaler(recipe.precision.loss_scale)
        self.adam_t = 0           # optimizer updates applied (bias correction)
        self.faults = faults.active()   # test hooks (porting/train/run/faults.py), off unless set
        self.shapes_seen: set[tuple] = set()
        self.sampler: StepSampler | None = None   # logging.breakdown_every: times the cells of a sampled step
        self.prints = fingerprint.attach(self, self.faults, log)   # logging.fingerprint_every (None: off)

    # -- one optimizer step
    def run_step(self, step: Step, lr: float) -> StepResult:
        ms = self.ms
        t = self.adam_t + 1
        b1, b2 = self.recipe.optimizer.betas
        f32 = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
        scale = self.scaler.scale / step.global_tokens
        if self.faults.nonfinite is not None and self.faults.nan_at(step.index + 1, self.rank):   # off: nothing done
            scale = math.nan
        scale = f32(scale)
        unscale = f32(1.0 / self.scaler.scale)
        hyper = (f32(lr), f32(1 - b1 ** t), f32(1 - b2 ** t))
        new_shapes = {mb.shape for mb in step.micro_batches} - self.shapes_seen
        self.shapes_seen |= new_shapes
        graphs = compiled_graphs(*self.cells)   # precompile made them all: a new one is a compile in the step
        t0 = time.perf_counter()
        if self.prints is not None:
            self.prints.begin(step)
        try:
            total, count, norm, finite = self._step_cells(step, scale, unscale, hyper)
        except (RuntimeError, TypeError, ValueError) as e:   # MindSpore's compile errors; see run/step/execution.py
            failure = execution.compile_failure(self.recipe, e, sorted(new_shapes)) if new_shapes else None
            if failure is None:
                raise
            raise failure from e
        loss_sum, n_tok = float(total.asnumpy()), float(count.asnumpy())
        norm_v, finite_v = float(norm.asnumpy()), bool(finite.asnumpy())
        if self.prints is not None:   # its cost is in the step's time
            self.prints.end()
        dt = time.perf_counter() - t0
        scale_used = self.scaler.scale
        applied = self.scaler.update(finite_v and math.isfinite(loss_sum))
        if applied:
            self.adam_t = t
        return StepResult(loss=loss_sum / max(n_tok, 1.0), grad_norm=norm_v, finite=finite_v and math.isfinite(loss_sum),
                          applied=applied, scale_used=scale_used, step_time_s=dt,
                          compile=compiled_graphs(*self.cells) > graphs, tokens=int(n_tok))

    def _step_cells(self, step: Step, scale, unscale, hyper: tuple) -> tuple:
        ms = self.ms
        call = self.sampler.call if self.sampler is not None else (lambda _name, fn, *a: fn(*a))
        if self.accum == 1:
            mb = step.micro_batches[0]
            return call("step", self.fused, ms.Tensor(mb.input_ids), ms.Tensor(mb.labels), scale, unscale, *hyper,
                        *self.packed_inputs(mb))
        # the micro-batches' sums stay on the device (no host sync per micro-batch), come to the host once a step
        # and are added there in float64 (exact for these float32 values, so in any order; CANN's float64
        # coverage is partial, so no float64 runs on the device)
        sums = [call("forward_backward", self.grad_step, ms.Tensor(mb.input_ids), ms.Tensor(mb.labels), scale,
                     *self.packed_inputs(mb)) for mb in step.micro_batches]
        local = ms.ops.stack([v for pair in sums for v in pair]).asnumpy().reshape(-1, 2).astype(np.float64).sum(0)
        return call("update", self.apply, ms.Tensor(np.float32(local[0])), ms.Tensor(np.float32(local[1])), unscale,
                    *hyper)

    def state(self, step_done: int) -> ckpt.TrainState:
        return ckpt.TrainState(adam_t=self.adam_t, loss_scale=self.scaler.scale, good_steps=self.scaler.good,
                               next_step=step_done, world_size=self.world, seed=self.recipe.seed)

    def barrier(self) -> None:
        # .asnumpy() waits for the all-reduce: in PyNative the op is launched asynchronously and would return
        # before the other ranks arrive (graph mode happens to block), so rank 0 could read a sidecar not yet written
        self.barrier_cell(self.ms.Tensor(np.ones((1,), np.float32))).asnumpy()

    @property
    def graphs(self) -> int:
        """Graphs compiled so far by this rank's step cells."""
        return compiled_graphs(*self.cells)

    def save(self, root: Path, done: int, announce: Callable[[int, str], None] | None = None) -> Path:
        """Every rank writes what it owns; rank 0 adds the layout record (no merge inside the job). ``announce(step,
        part)``: each part of the save on the rank log and heartbeat (ranklog.RankLog.save_part)."""
        return ckpt.save_ranks(self, root, done, announce)

    def restore(self, path: Path, opened: tuple[ckpt_read.Source, dict] | None = None) -> int:
        """This rank's share of the per-rank checkpoint ``path``, in this run's layout; the step to continue from.
        ``opened``: ``path`` as the model's build left it, the weights read (setup.build_model)."""
        ckpt_read.restore(self, path, opened)
        st = ckpt.TrainState.read(path / ckpt.STATE_FILE)
        self.adam_t = st.adam_t
        self.scaler = LossScaler(self.recipe.precision.loss_scale, st)
        return st.next_step


def _run_or_skip(trainer: Trainer, step: Step, lr: float, guard: nonfinite.SkipGuard, last_good) -> StepResult:
    """Run ``step``, or pass over it when its data is in a ``nonfinite.skip_steps`` window; count a skipped
    update against the caps, and stop the run with the reason past them (porting/train/run/step/nonfinite.py)."""
    recipe, n = trainer.recipe, step.index + 1
    window = nonfinite.in_window(recipe, n)
    if window is not None:   # the data is consumed, nothing is computed: no loss, no update
        return StepResult.nothing_run(trainer.scaler.scale, nonfinite.WINDOW_SKIP)
    r = trainer.run_step(step, lr)
    # Dynamic loss scaling skips an overflowing step and lowers the scale; once the scale is down to 1 an
    # overflow is not a scaling problem any more, and it counts as a non-finite step like fp32's.
    dynamic = recipe.precision.loss_scale.kind == "dynamic"
    r = dataclasses.replace(r, skip_reason=guard.classify(r, dynamic))
    reason = guard.after(n, r, dynamic)
    if reason is not None:
        where = f"last good checkpoint: {last_good[1]}" if last_good else "no checkpoint was written yet"
        scale = f" at loss scale {r.scale_used:g}" if dynamic else ""
        raise DivergenceError(f"{reason}{scale}; {where}. Lower optimizer.lr, enable optimizer.grad_clip, or check "
                              "the data (a supervised run rolls back once and skips that window)")
    return r


def _finish(recipe: Recipe, trainer: Trainer, plan: BatchSchedule, records: list, metrics, model_dir: Path, run_dir: Path,
            start: int, command: tuple[str, ...], rl: ranklog.RankLog, compiled: pre.CompileReport | None) -> None:
    """The final checkpoint, the summary record and the HF export, after the last step."""
    if plan.total_steps <= start:
        return
    ck_root, log = RunDir(run_dir).checkpoints, rl.log
    rl.saving(plan.total_steps)   # every rank writes what it owns (porting/train/run/checkpoint/format.py)
    final = trainer.save(ck_root, plan.total_steps, rl.save_part)
    rl.saved(plan.total_steps, final)
    if trainer.rank != 0:
        return
    summary = summarize(records, plan, trainer.graphs, len(trainer.shapes_seen), compiled)
    metrics.summary(summary)
    log.info(f"summary: {json.dumps(summary.to_dict())}")
    if recipe.lora is not None and trainer.world == 1:   # the adapter (PEFT) and the merged base (porting/train/run/lora.py)
        rl.phase("save", plan.total_steps)
        lora_export_final(recipe, final, model_dir, run_dir, log.info, list(command or sys.argv))
    elif recipe.checkpointing.export_hf and trainer.world > 1:   # the launcher merges after the workers exit
        log.info("HF export: made by the launcher once every worker has exited (porting/train/run/checkpoint/export.py "
                 f"export_after_exit), or by hand: port ckpt merge {final} --out {RunDir(run_dir).hf}")
    elif recipe.checkpointing.export_hf:
        rl.phase("save", plan.total_steps)   # the export writes the whole model again: a save's allowance
        out = export_hf(final, model_dir, RunDir(run_dir).hf, command=list(command))
        log.info(f"HF export {out} (from {final}, with port_manifest.json)")


def _resume(trainer: Trainer, last: tuple[int, Path] | None, ck_root: Path, total_steps: int, log: logging.Logger,
            opened: tuple[ckpt_read.Source, dict] | None) -> int:
    """Restore ``last``, the newest complete checkpoint (its weights already in the model when ``opened``); the
    step to continue from."""
    if last is None:
        raise ckpt.CheckpointError(f"{ck_root}: --resume but no complete checkpoint there; run without --resume")
    resume_check.validate(last[1])   # whole, in range, not renamed or forged (the CLI checked it too)
    start = trainer.restore(last[1], opened)
    if start > total_steps:
        raise ckpt.CheckpointError(f"{last[1]}: next_step {start} is beyond this run's {total_steps} steps; "
                                   "raise schedule.max_steps (or epochs) to train further")
    log.info(f"resumed from {last[1]} at step {start}")
    return start


def _close(*writers) -> None:
    """Close the rank's writers that are open (None: not made on this rank)."""
    for w in writers:
        if w is not None:
            w.close()


def train(recipe: Recipe, run_dir: str | Path, *, resume: bool = False, distributed: bool = False,
          echo: bool = True, provenance: Provenance | None = None) -> RunResult:
    """Run (or resume) the fine-tune of ``recipe`` on this rank; returns when the last step is done. A `port train`
    rank gets ``recipe`` from the run's job document (porting/launch/workers/train.py); ``provenance`` is what
    manifest.json records of it (the command, the launcher's environment report, the document)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    prov = provenance or Provenance(tuple(sys.argv))
    configure_mindspore(recipe, distributed)
    rank, world_size = setup.join(recipe, distributed, 0, 1)
    log = ranklog.open_log(run_dir, rank, echo and rank == 0)
    rl = ranklog.RankLog(log, Heartbeat(run_dir, rank))   # the lines others read, and the heartbeat beside them
    grid = grid_mod.make_grid(recipe, rank, world_size)
    rl.started(rank, world_size, os.getpid(), f"port's gradient buckets ({fusion_words(recipe.parallel.comm_fusion)}), "
               f"optimizer sharding {recipe.parallel.optimizer_sharding}; {grid.describe()}{probes.installed()}",
               distributed)
    setup.log_mode(recipe, grid, log)
    model_dir = resolve_hf(recipe.model.source)
    last = ckpt.latest(RunDir(run_dir).checkpoints) if resume else None   # the checkpoint gives the weights itself
    plan, cfg, model, opened = setup.data_and_model(recipe, model_dir, grid, log, run_dir, last[1] if last else None)
    trainer = Trainer(recipe, run_dir, rank, world_size, model, model_dir, plan, log, grid)
    ck_root = RunDir(run_dir).checkpoints
    for p in ckpt.interrupted_saves(ck_root) if rank == 0 else ():
        log.warning(f"{p}: left by an interrupted checkpoint save, never loaded; remove it to free the space")
    start = 0
    if resume:
        rl.phase("restore")
        start = _resume(trainer, last, ck_root, plan.total_steps, log, opened)
    rl.phase("compile")
    compiled = pre.before_step_one(trainer, plan, cfg.to_hf(), start, True, log)   # every shape, every rank
    if rank == 0:
        rundir.write_manifest(run_dir, run_manifest(recipe, model_dir, cfg, plan, world_size, start, prov),
                              resume_step=start if resume else 0)
    watch = Watch(recipe.logging, run_dir, plan.total_steps, start, recipe.model_dump(mode="json")) if rank == 0 else None
    metrics = rundir.MetricsWriter(run_dir, keep_through_step=start) if rank == 0 else None
    if metrics is not None and metrics.note:
        log.warning(f"resume: {metrics.note}; they are not kept")
    records: list[rundir.StepRecord] = []
    last_loss = float("nan")
    last_good, guard = ckpt.latest(ck_root), nonfinite.guard_for(recipe, run_dir, start)
    every = recipe.checkpointing.every_steps
    comm = CommWait(recipe.logging.comm_sample_every, rank, world_size, plan.total_steps)
    trainer.sampler = sampler = StepSampler(recipe.logging, run_dir, rank, plan.total_steps)
    try:
        for step in plan.steps(grid.dp_rank, start):
            lr = lr_at(recipe, step.index, plan.total_steps)
            r = sampler.around(step.index + 1, lambda: _run_or_skip(trainer, step, lr, guard, last_good), log)
            last_loss = r.loss
            rec = step_record(step, r, lr, trainer.scaler.scale)
            if rank == 0:
                rec = dataclasses.replace(rec, **eval_record(model, plan, step.index + 1, recipe.data.eval_every_steps))
            rec = comm_record(rec, comm, log)
            records.append(rec)
            if metrics is not None:
                metrics.step(rec)
                watch.step(rec.to_dict())
            if (step.index + 1) % recipe.logging.every_steps == 0 or step.index + 1 == plan.total_steps:
                rl.step(rec.step, plan.total_steps, loss=rec.loss, lr=lr, grad_norm=rec.grad_norm,
                        tokens_per_s=rec.tokens_per_s, step_time_s=rec.step_time_s, padding=rec.padding_fraction,
                        compile=rec.compile, shapes=rec.shapes, graphs=trainer.graphs,
                        skip_reason=rec.skip_reason if rec.skipped else None)
            if r.compile:   # every shape was compiled before step 1: a rank compiling alone stalls the others
                log.warning(f"step {rec.step}: compiled a graph during the step (shapes {list(rec.shapes)})")
            done = step.index + 1
            if every and done % every == 0 and done < plan.total_steps:
                rl.saving(done)   # a supervisor allows a save its own time (porting/launch/watch.py)
                path = trainer.save(ck_root, done, rl.save_part)
                last_good = (done, path)
                rl.saved(done, path)
        _finish(recipe, trainer, plan, records, metrics, model_dir, run_dir, start, prov.command, rl, compiled)
    except PortingError as exc:
        rl.failed(str(exc))
        raise
    finally:
        _close(trainer.prints, metrics, watch)
    rl.finished()   # the launcher's evidence that this rank's run ended (porting/launch/outcome.py)
    return RunResult(run_dir, len(records), last_loss, trainer.graphs, len(trainer.shapes_seen))
