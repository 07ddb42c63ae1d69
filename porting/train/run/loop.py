"""The training run: one rank's loop, from a validated recipe to checkpoints, metrics and an HF export.

World size 1 runs in the calling process; more ranks run this same function inside `msrun` workers
(:mod:`porting.train.run.worker`). Every rank logs to ``logs/rank_<r>.log``; rank 0 writes
``metrics.jsonl``, ``manifest.json``, checkpoints and the HF export. Tensor parallel's pieces (the rank
grid, its groups, slicing and merging) live in :mod:`porting.train.run.grid`; what stays here is the loop
and its Trainer (with ZeRO's and packing's inputs), kept in one module of about 500 lines so one
rank's life reads top to bottom.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import ParameterTuple
from mindspore.communication import get_group_size, get_rank

from converters.loading import load_hf_dir
from model_zoo.config import LlamaConfig
from model_zoo.errors import PortingError, RecipeError
from model_zoo.llama import build
from porting import rundir
from porting.env import versions
from porting.train.run.heldout import eval_record
from porting.model_paths import resolve_hf
from porting.tokenizer import load_tokenizer
from porting.train.data import token_file
from porting.train.data.batching import BatchSchedule, Step, build_plan
from porting.train.plan.make import check_tensor_parallel
from porting.train.recipe.schedule import lr_at
from porting.train.recipe.schema import Recipe, recipe_dict
from porting.train.run import checkpoint as ckpt
from porting.train.run import ckpt_read
from porting.train.run import resume_check
from porting.train.run import execution
from porting.train.run import nonfinite
from porting.train.run import grid as grid_mod
from porting.train.run import lifeline
from porting.train.run import precompile as pre
from porting.train.run import step as train_step
from porting.train.run import zero
from porting.train.run.breakdown import StepSampler
from porting.train.run.commwait import CommWait
from porting.train.run.export import export_hf
from porting.train.run.grid import Grid
from porting.train.run.runtime import configure_mindspore
from porting.train.run.step import compiled_graphs
from porting.train.run.watch import Watch


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


# --------------------------------------------------------------------------- logging
class _Formatter(logging.Formatter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        t = _dt.datetime.fromtimestamp(record.created)
        return f"{t.strftime('%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d} rank={self.rank} {record.levelname} {record.getMessage()}"


def rank_logger(run_dir: Path, rank: int, echo: bool) -> logging.Logger:
    log = logging.getLogger(f"port.train.rank{rank}.{id(run_dir)}")
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(run_dir / "logs" / f"rank_{rank}.log")
    fh.setFormatter(_Formatter(rank))
    log.addHandler(fh)
    if echo:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(_Formatter(rank))
        log.addHandler(sh)
    return log


def build_model(recipe: Recipe, model_dir: Path, grid: Grid | None = None):
    """The model of ``model_dir`` with its HF weights; with tensor parallel, this rank's shard of each."""
    cfg = LlamaConfig.from_hf(model_dir)
    if recipe.data.max_seq_length > cfg.max_position_embeddings:
        raise RecipeError(f"data.max_seq_length={recipe.data.max_seq_length} exceeds the model's "
                          f"max_position_embeddings={cfg.max_position_embeddings} ({model_dir}/config.json); "
                          f"set data.max_seq_length <= {cfg.max_position_embeddings}")
    check_tensor_parallel(recipe, cfg, model_dir)
    tp = grid_mod.tensor_parallel(recipe, grid)
    model = build(cfg, param_dtype=recipe.precision.param_dtype, compute_dtype=recipe.precision.compute_dtype,
                  seed=recipe.seed, tp=tp)
    load_hf_dir(model, model_dir, shard=grid_mod.shard_fn(model, grid.tp_rank, grid.tp) if tp else None)
    if recipe.memory.recompute:
        for layer in model.model.layers:
            layer.recompute()
    return cfg, model


class LossScaler:
    """Static or dynamic loss scaling (fp16/bf16 on Ascend); ``none`` is a scale of 1."""
    def __init__(self, cfg, state: ckpt.TrainState | None = None):
        self.kind = cfg.kind
        self.scale = 1.0 if cfg.kind == "none" else float(cfg.init)
        self.factor, self.window = cfg.factor, cfg.window
        self.good = 0
        if state:
            self.scale, self.good = state.loss_scale, state.good_steps

    def update(self, finite: bool) -> bool:
        """True when the step counts; False when it was skipped for overflow (dynamic scaling)."""
        if self.kind != "dynamic":
            return finite
        if not finite:
            self.scale = max(1.0, self.scale / self.factor)
            self.good = 0
            return False
        self.good += 1
        if self.good >= self.window:
            self.scale *= self.factor
            self.good = 0
        return True



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
        # fp32 master weights (bf16/fp16 parameters) are optimizer state: saved and restored with m and v
        self.state_params = params + list(self.optimizer.masters) + list(self.optimizer.m) + list(self.optimizer.v)
        self.scaler = LossScaler(recipe.precision.loss_scale)
        self.adam_t = 0           # optimizer updates applied (bias correction)
        self.hook = nonfinite.hook_from_env()   # test hook: a NaN loss scale on chosen steps (off unless set)
        self.shapes_seen: set[tuple] = set()
        self.sampler: StepSampler | None = None   # logging.breakdown_every: times the cells of a sampled step

    # -- one optimizer step
    def run_step(self, step: Step, lr: float) -> dict:
        ms = self.ms
        t = self.adam_t + 1
        b1, b2 = self.recipe.optimizer.betas
        f32 = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
        scale = f32(self.scaler.scale / step.global_tokens * nonfinite.poison(step.index + 1, self.rank, self.hook))
        unscale = f32(1.0 / self.scaler.scale)
        hyper = (f32(lr), f32(1 - b1 ** t), f32(1 - b2 ** t))
        new_shapes = {mb.shape for mb in step.micro_batches} - self.shapes_seen
        self.shapes_seen |= new_shapes
        graphs = compiled_graphs(*self.cells)   # precompile made them all: a new one is a compile in the step
        t0 = time.perf_counter()
        try:
            total, count, norm, finite = self._step_cells(step, scale, unscale, hyper)
        except (RuntimeError, TypeError, ValueError) as e:   # MindSpore's compile errors; see run/execution.py
            failure = execution.compile_failure(self.recipe, e, sorted(new_shapes)) if new_shapes else None
            if failure is None:
                raise
            raise failure from e
        loss_sum, n_tok = float(total.asnumpy()), float(count.asnumpy())
        norm_v, finite_v = float(norm.asnumpy()), bool(finite.asnumpy())
        dt = time.perf_counter() - t0
        scale_used = self.scaler.scale
        applied = self.scaler.update(finite_v and math.isfinite(loss_sum))
        if applied:
            self.adam_t = t
        return {"loss": loss_sum / max(n_tok, 1.0), "grad_norm": norm_v, "finite": finite_v and math.isfinite(loss_sum),
                "applied": applied, "scale_used": scale_used, "step_time_s": dt, "compile": compiled_graphs(*self.cells) > graphs, "tokens": int(n_tok)}

    def _step_cells(self, step: Step, scale, unscale, hyper: tuple) -> tuple:
        ms = self.ms
        call = self.sampler.call if self.sampler is not None else (lambda _name, fn, *a: fn(*a))
        if self.accum == 1:
            mb = step.micro_batches[0]
            return call("step", self.fused, ms.Tensor(mb.input_ids), ms.Tensor(mb.labels), scale, unscale, *hyper,
                        *self.packed_inputs(mb))
        # the micro-batches' sums stay on the device (no host sync per micro-batch) and are added once, in
        # float64 (exact for these float32 values, so in any order): the logged loss is what the host's float64
        # sum gave, bit for bit; a handful of launches a step, not one per micro-batch
        sums = [call("forward_backward", self.grad_step, ms.Tensor(mb.input_ids), ms.Tensor(mb.labels), scale,
                     *self.packed_inputs(mb)) for mb in step.micro_batches]
        local = ms.ops.stack([v for pair in sums for v in pair]).reshape(-1, 2).astype(ms.float64).sum(0)
        local = local.astype(ms.float32)
        return call("update", self.apply, local[0], local[1], unscale, *hyper)

    def state(self, step_done: int) -> ckpt.TrainState:
        return ckpt.TrainState(adam_t=self.adam_t, loss_scale=self.scaler.scale, good_steps=self.scaler.good,
                               next_step=step_done, world_size=self.world, seed=self.recipe.seed)

    def barrier(self) -> None:
        # .asnumpy() waits for the all-reduce: in PyNative the op is launched asynchronously and would return
        # before the other ranks arrive (graph mode happens to block), so rank 0 could read a sidecar not yet written
        self.barrier_cell(self.ms.Tensor(np.ones((1,), np.float32))).asnumpy()

    @property
    def writes_checkpoints(self) -> bool:
        """Every rank: each writes what it owns (porting/train/run/ckpt_shards.py) and meets the others."""
        return True

    def save(self, root: Path, done: int) -> Path:
        """Every rank writes what it owns; rank 0 adds the layout record (no merge inside the job)."""
        return ckpt.save_ranks(self, root, done)

    def restore(self, path: Path) -> int:
        if (path / "layout.json").is_file():   # per-rank format: this rank's share, in this run's layout
            ckpt_read.restore(self, path)
            st = ckpt.TrainState.read(path / ckpt.STATE_FILE)
        elif self.grid.tp > 1:   # one full file: every rank takes its slices (and its own optimizer states)
            args = grid_mod.restore_args(self.model, self.grid)
            if self.zero is not None:   # ZeRO flat shards are kept as they are, one name per rank
                args["allowed"] |= self.optimizer.state_names(self.grid.tp)
            st = ckpt.load(path, self.state_params, 0, **args)
        else:
            st = ckpt.load(path, self.state_params, self.rank if self.shards > 1 else 0)
        self.adam_t = st.adam_t
        self.scaler = LossScaler(self.recipe.precision.loss_scale, st)
        return st.next_step


def _host_rss_gib() -> float | None:
    try:
        import psutil  # deferred: optional; without it the field is left out

        return round(psutil.Process().memory_info().rss / (1 << 30), 3)
    except Exception:  # psutil missing or unsupported platform: the field is simply left out
        return None


def _join(recipe: Recipe, distributed: bool, rank: int, world_size: int) -> tuple[int, int]:
    """This process's (rank, world size): msrun's under ``distributed``, checked against the recipe."""
    if not distributed:
        return rank, world_size

    rank, world_size = get_rank(), get_group_size()
    if world_size != recipe.world_size:
        raise RecipeError(f"msrun started {world_size} workers but the recipe's world size is {recipe.world_size} "
                          "(cluster.nodes x cluster.devices_per_node); use the command `port train --dry-run` prints")
    return rank, world_size


def _data_and_model(recipe: Recipe, model_dir: Path, grid: Grid, log: logging.Logger, run_dir: Path):
    """The batch schedule of the run's data and the model built from ``model_dir`` (both logged). Data is
    planned over the data-parallel ranks: the tensor-parallel ranks of one group see the same batches. An
    msrun worker reads the tokens its launcher wrote (porting/train/data/token_file.py) when told to."""
    launched = os.environ.get(token_file.ENV)
    if launched:
        data = token_file.read(launched, run_dir, token_file.identity(recipe, model_dir))
        plan = build_plan(recipe, None, grid.dp, data=data)
    else:
        plan = build_plan(recipe, load_tokenizer(model_dir), grid.dp)
    rep, source = plan.data.report, (launched or "").partition(":")[2]
    log.info(f"data {rep.path}: {rep.examples} examples from {rep.rows} rows, {rep.bad_rows} malformed rows "
             f"skipped, {rep.truncated} truncated, {rep.split_windows} extra windows; sha256 {rep.sha256[:12]}"
             f"{f'; tokenised once by the launcher ({source})' if launched else ''}")
    for s in rep.bad_row_samples:
        log.warning(f"malformed row skipped: {s}")
    log.info(f"{'packing' if plan.rows is not None else 'bucketing'}: shapes {plan.boundaries}; {plan.steps_per_epoch} "
             f"steps per epoch; {plan.total_steps} steps")
    cfg, model = build_model(recipe, model_dir, grid)
    if recipe.memory.recompute:
        flagged = sum(1 for layer in model.model.layers if getattr(layer, "_has_config_recompute", False))
        log.info(f"recompute: {flagged} of {cfg.num_hidden_layers} decoder layers recompute their activations in backward")
    return plan, cfg, model


def _run_or_skip(trainer: Trainer, step: Step, lr: float, guard: nonfinite.SkipGuard, last_good) -> dict:
    """Run ``step``, or pass over it when its data is in a ``nonfinite.skip_steps`` window; count a skipped
    update against the caps, and stop the run with the reason past them (porting/train/run/nonfinite.py)."""
    recipe, n = trainer.recipe, step.index + 1
    window = nonfinite.in_window(recipe, n)
    if window is not None:   # the data is consumed, nothing is computed: no loss, no update
        return {"loss": math.nan, "grad_norm": math.nan, "finite": True, "applied": False, "step_time_s": 0.0,
                "scale_used": trainer.scaler.scale, "compile": False, "tokens": 0, "skip_reason": nonfinite.WINDOW_SKIP}
    r = trainer.run_step(step, lr)
    # Dynamic loss scaling skips an overflowing step and lowers the scale; once the scale is down to 1 an
    # overflow is not a scaling problem any more, and it counts as a non-finite step like fp32's.
    dynamic = recipe.precision.loss_scale.kind == "dynamic"
    r["skip_reason"] = guard.classify(r, dynamic)
    reason = guard.after(n, r, dynamic)
    if reason is not None:
        where = f"last good checkpoint: {last_good[1]}" if last_good else "no checkpoint was written yet"
        scale = f" at loss scale {r['scale_used']:g}" if dynamic else ""
        raise DivergenceError(f"{reason}{scale}; {where}. Lower optimizer.lr, enable optimizer.grad_clip, or check "
                              "the data (a supervised run rolls back once and skips that window)")
    return r


def _finish(recipe: Recipe, trainer: Trainer, plan, records: list, metrics, model_dir: Path, run_dir: Path,
            start: int, command: list[str] | None, log: logging.Logger, compiled: pre.CompileReport | None) -> None:
    """The final checkpoint, the summary record and the HF export, after the last step."""
    if plan.total_steps <= start:
        return
    ck_root = run_dir / "checkpoints"
    if trainer.writes_checkpoints:
        log.info(f"saving checkpoint step_{plan.total_steps}")
        final = trainer.save(ck_root, plan.total_steps)
        log.info(f"checkpoint {final}")
    if trainer.rank != 0:
        return
    summary = summarize(records, trainer, plan, compiled)
    metrics.summary(summary)
    log.info(f"summary: {json.dumps(summary.to_dict())}")
    if recipe.checkpointing.export_hf:

        out = export_hf(final, model_dir, run_dir / "hf", command=list(command or sys.argv))
        log.info(f"HF export {out} (from {final}, with port_manifest.json)")


def _log_mode(recipe: Recipe, grid: Grid, log: logging.Logger) -> None:
    """How the step runs: graph or PyNative, what the installed MindSpore falls back on, the TP loss."""
    log.info(f"execution: {execution.describe(recipe)}")
    for note in execution.runtime_fallbacks(recipe):
        log.warning(f"fallback: {note}")
    if grid.tp > 1:
        log.info(grid_mod.loss_note(recipe, grid))


def _resume(trainer: Trainer, ck_root: Path, total_steps: int, log: logging.Logger) -> int:
    """Restore the newest complete checkpoint; the step to continue from."""
    last = ckpt.latest(ck_root)
    if last is None:
        raise ckpt.CheckpointError(f"{ck_root}: --resume but no complete checkpoint there; run without --resume")
    resume_check.validate(last[1])   # whole, in range, not renamed or forged (the CLI checked it too)
    start = trainer.restore(last[1])
    if start > total_steps:
        raise ckpt.CheckpointError(f"{last[1]}: next_step {start} is beyond this run's {total_steps} steps; "
                                   "raise schedule.max_steps (or epochs) to train further")
    log.info(f"resumed from {last[1]} at step {start}")
    return start


def train(recipe: Recipe, run_dir: str | Path, *, rank: int = 0, world_size: int = 1, resume: bool = False,
          distributed: bool = False, command: list[str] | None = None, echo: bool = True,
          doctor: Callable[[], dict] | None = None, compile_cache: bool = True) -> RunResult:
    """Run (or resume) the fine-tune of ``recipe`` on this rank; returns when the last step is done.
    ``doctor`` makes the environment report manifest.json keeps (the caller's: `port doctor` is above
    porting/train); rank 0 calls it once. ``compile_cache``: run/precompile.py's, under RUN/compile_cache."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    configure_mindspore(recipe, distributed)
    rank, world_size = _join(recipe, distributed, rank, world_size)
    log = rank_logger(run_dir, rank, echo and rank == 0)
    grid = grid_mod.make_grid(recipe, rank, world_size)
    if distributed:
        log.info(f"rank {rank} of {world_size} (pid {os.getpid()}): parallel_mode {ms.get_auto_parallel_context('parallel_mode')}, "
                 f"comm_fusion {ms.get_auto_parallel_context('comm_fusion')}, optimizer sharding "
                 f"{recipe.parallel.optimizer_sharding}; {grid.describe()}")
    _log_mode(recipe, grid, log)
    model_dir = resolve_hf(recipe.model.source)
    plan, cfg, model = _data_and_model(recipe, model_dir, grid, log, run_dir)
    trainer = Trainer(recipe, run_dir, rank, world_size, model, model_dir, plan, log, grid)
    ck_root = run_dir / "checkpoints"
    for p in ckpt.interrupted_saves(ck_root) if rank == 0 else ():
        log.warning(f"{p}: left by an interrupted checkpoint save, never loaded; remove it to free the space")
    start = 0
    if resume:
        start = _resume(trainer, ck_root, plan.total_steps, log)
    compiled = pre.before_step_one(trainer, plan, cfg.to_hf(), start, compile_cache, log)   # every shape, every rank
    if rank == 0:
        rundir.write_manifest(run_dir, run_manifest(recipe, model_dir, cfg, plan, world_size, command, start, doctor),
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
            last_loss = r["loss"]
            rec = step_record(step, r, lr, trainer.scaler.scale)
            if rank == 0:
                rec = dataclasses.replace(rec, **eval_record(model, plan, step.index + 1, recipe.data.eval_every_steps))
            rec = comm_record(rec, comm, log)
            records.append(rec)
            if metrics is not None:
                metrics.step(rec)
                watch.step(rec.to_dict())
            if (step.index + 1) % recipe.logging.every_steps == 0 or step.index + 1 == plan.total_steps:
                log.info(f"step {rec.step}/{plan.total_steps} loss {rec.loss:.5f} lr {lr:.3e} grad_norm "
                         f"{rec.grad_norm:.4f} tokens/s {rec.tokens_per_s:.0f} step {rec.step_time_s:.3f}s "
                         f"pad {rec.padding_fraction:.3f}" + (" (compile)" if rec.compile else "")
                         + f" shapes {list(rec.shapes)} graphs {trainer_graphs(trainer)}"
                         + (f" (skipped: {rec.skip_reason})" if rec.skipped else ""))
            if r["compile"]:   # every shape was compiled before step 1: a rank compiling alone stalls the others
                log.warning(f"step {rec.step}: compiled a graph during the step (shapes {list(rec.shapes)})")
            done = step.index + 1
            if trainer.writes_checkpoints and every and done % every == 0 and done < plan.total_steps:
                log.info(f"saving checkpoint step_{done}")   # a supervisor allows a save its own time (porting/supervise.py)
                path = trainer.save(ck_root, done)
                last_good = (done, path)
                log.info(f"checkpoint {path}")
        _finish(recipe, trainer, plan, records, metrics, model_dir, run_dir, start, command, log, compiled)
    except PortingError as exc:
        log.error(str(exc))
        raise
    finally:
        if metrics is not None:
            metrics.close()
        if watch is not None:
            watch.close()
    log.info(lifeline.FINISHED)   # the launcher's evidence that this rank's run ended (lifeline.all_finished)
    return RunResult(run_dir, len(records), last_loss, trainer_graphs(trainer), len(trainer.shapes_seen))


def run_manifest(recipe: Recipe, model_dir: Path, cfg, plan: BatchSchedule, world_size: int,
                 command: list[str] | None, start: int, doctor: Callable[[], dict] | None = None) -> rundir.RunManifest:
    """What this run is (manifest.json), as the run-directory format defines it."""
    return rundir.RunManifest(
        recipe=recipe_dict(recipe), versions=versions(), doctor=doctor() if doctor else None,
        model=rundir.ModelInfo(source=recipe.model.source, dir=str(model_dir), config=cfg.to_hf(),
                               parameters=cfg.num_parameters()),
        data=plan.data.report.as_dict(), bucketing=plan.describe(), seed=recipe.seed, world_size=world_size,
        command=tuple(command or sys.argv), started=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        resumed_from_step=start or None)


def step_record(step: Step, r: dict, lr: float, loss_scale: float) -> rundir.StepRecord:
    """One metrics.jsonl line from the step's plan and what ``Trainer.run_step`` measured."""
    tokens_per_s = step.global_real_tokens / r["step_time_s"] if r["step_time_s"] > 0 else 0.0
    return rundir.StepRecord(
        step=step.index + 1, epoch=step.epoch, loss=r["loss"], lr=lr, grad_norm=r["grad_norm"],
        tokens=step.global_real_tokens, loss_tokens=step.global_tokens, padded_tokens=step.global_padded_tokens,
        tokens_per_s=round(tokens_per_s, 2), step_time_s=round(r["step_time_s"], 5),
        padding_fraction=round(step.padding_fraction, 5), compile=r["compile"],
        shapes=tuple(sorted({list(mb.shape)[1] for mb in step.micro_batches})), loss_scale=loss_scale,
        skipped=not r["applied"], skip_reason=r.get("skip_reason"), host_rss_gib=_host_rss_gib())


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


def trainer_graphs(trainer: Trainer) -> int:

    return compiled_graphs(*trainer.cells)


def summarize(records: list[rundir.StepRecord], trainer: Trainer, plan: BatchSchedule,
              compiled: pre.CompileReport | None = None) -> rundir.SummaryRecord:
    steady = [r for r in records if not r.compile and r.skip_reason != nonfinite.WINDOW_SKIP]   # those ran nothing
    comp = [r for r in records if r.compile]
    med = float(np.median([r.step_time_s for r in steady])) if steady else 0.0
    # compile time: the compiles before step 1, and any step's time beyond the steady median
    compile_time = sum(max(0.0, r.step_time_s - med) for r in comp) + (compiled.seconds if compiled else 0.0)
    st_time = sum(r.step_time_s for r in steady)
    padded = max(1, sum(r.padded_tokens for r in records))
    return rundir.SummaryRecord(
        steps=len(records), compile_steps=len(comp), compile_time_s=round(compile_time, 3),
        steady_tokens_per_s=round(sum(r.tokens for r in steady) / st_time, 2) if st_time else None,
        steady_step_time_s=round(med, 5) if steady else None, compiled_graphs=trainer_graphs(trainer),
        shapes_seen=len(trainer.shapes_seen), bucket_shapes=len(plan.boundaries),
        padding_fraction=round(1 - sum(r.tokens for r in records) / padded, 5),
        final_loss=records[-1].loss if records else None,
        precompile_s=compiled.seconds if compiled else None, precompiled_graphs=compiled.graphs if compiled else None)
