"""What one rank builds before its first step: its place in the job (msrun's rank and world size, checked
against the recipe), the run's data as a batch schedule over the data-parallel ranks, and the model with its
weights (this rank's tensor-parallel slices), each logged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mindspore.communication import get_group_size, get_rank

from converters.loading import load_hf_dir
from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from model_zoo.llama import build
from porting.train.data import token_cache, token_file
from porting.train.data.batching import build_plan
from porting.train.plan.make import check_tensor_parallel
from porting.train.recipe.schema import Recipe
from porting.train.run import lora
from porting.train.run.checkpoint import read as ckpt_read
from porting.train.run.step import execution
from porting.train.run.step import grid as grid_mod
from porting.train.run.step.grid import Grid


def build_model(recipe: Recipe, model_dir: Path, grid: Grid | None = None, weights_from: Path | None = None, log=None,
                run_dir: Path | None = None):
    """(config, model, opened): the model of ``model_dir`` with its HF weights, or a resume's from its per-rank
    checkpoint ``weights_from`` (the HF checkpoint then is not read; ``opened`` is that checkpoint, still open
    for the optimizer state, ``ckpt_read.restore``; else None); with tensor parallel, this rank's shard of each."""
    cfg = LlamaConfig.from_hf(model_dir)
    if recipe.data.max_seq_length > cfg.longest_sequence:   # dynamic NTK: max_position_embeddings x factor
        raise RecipeError(f"data.max_seq_length={recipe.data.max_seq_length} exceeds the model's longest sequence "
                          f"{cfg.longest_sequence} (max_position_embeddings={cfg.max_position_embeddings}, "
                          f"{model_dir}/config.json); set data.max_seq_length <= {cfg.longest_sequence}")
    check_tensor_parallel(recipe, cfg, model_dir)
    tp = grid_mod.tensor_parallel(recipe, grid)
    model = build(cfg, param_dtype=recipe.precision.param_dtype, compute_dtype=recipe.precision.compute_dtype,
                  seed=recipe.seed, tp=tp, defer_init=True)   # no random draw: the HF load sets every weight
    opened = None
    if recipe.lora is not None:   # adapters first (their names exist), then the frozen base, always from model.source
        lora.attach(model, recipe, cfg)
        load_hf_dir(model, model_dir, shard=grid_mod.shard_fn(model, grid.tp_rank, grid.tp) if tp else None, log=log)
    if weights_from is not None:   # a LoRA checkpoint holds the trainable parameters only
        opened = ckpt_read.restore_weights(model, weights_from, grid.tp if tp else 1, grid.tp_rank if tp else 0, log)
    elif recipe.lora is not None:
        lora.start(model, recipe, cfg, model_dir, run_dir, log or (lambda s: None))
    else:
        load_hf_dir(model, model_dir, shard=grid_mod.shard_fn(model, grid.tp_rank, grid.tp) if tp else None, log=log)
    if recipe.memory.recompute:
        for layer in model.model.layers:
            layer.recompute()
    return cfg, model, opened


def join(recipe: Recipe, distributed: bool, rank: int, world_size: int) -> tuple[int, int]:
    """This process's (rank, world size): msrun's under ``distributed``, checked against the recipe."""
    if not distributed:
        return rank, world_size

    rank, world_size = get_rank(), get_group_size()
    if world_size != recipe.world_size:
        raise RecipeError(f"msrun started {world_size} workers but the recipe's world size is {recipe.world_size} "
                          "(cluster.nodes x cluster.devices_per_node); use the command `port train --dry-run` prints")
    return rank, world_size


def data_and_model(recipe: Recipe, model_dir: Path, grid: Grid, log: logging.Logger, run_dir: Path,
                   weights_from: Path | None = None):
    """The batch schedule of the run's data and the model built from ``model_dir`` (both logged), and the
    checkpoint the weights came from, still open (:func:`build_model`). Data is
    planned over the data-parallel ranks: the tensor-parallel ranks of one group see the same batches. An
    msrun worker reads the tokens its launcher wrote (porting/train/data/token_file.py) when told to; a
    one-process run takes them from PORT_TOKEN_CACHE when set and holding them (token_cache.py)."""
    launched = os.environ.get(token_file.ENV)
    if launched:
        data = token_file.read(launched, run_dir, token_file.identity(recipe, model_dir))
        plan = build_plan(recipe, None, grid.dp, data=data)
        origin = f"; tokenised once by the launcher ({launched.partition(':')[2]})"
    else:
        tokens = token_cache.tokenised(recipe, model_dir, log.warning)
        plan = build_plan(recipe, None, grid.dp, data=tokens.data)
        origin = f"; tokens from {tokens.origin}" if tokens.origin != "tokenised" else ""
    rep = plan.data.report
    log.info(f"data {rep.path}: {rep.examples} examples from {rep.rows} rows, {rep.bad_rows} malformed rows "
             f"skipped, {rep.truncated} truncated, {rep.split_windows} extra windows; sha256 {rep.sha256[:12]}"
             f"{origin}")
    for s in rep.bad_row_samples:
        log.warning(f"malformed row skipped: {s}")
    log.info(f"{'packing' if plan.rows is not None else 'bucketing'}: shapes {plan.boundaries}; {plan.steps_per_epoch} "
             f"steps per epoch; {plan.total_steps} steps")
    if recipe.lora is not None and weights_from is not None:
        lora.check_base(run_dir, model_dir)
    cfg, model, opened = build_model(recipe, model_dir, grid, weights_from, log.info,
                                     run_dir if grid.rank == 0 else None)
    if recipe.memory.recompute:
        flagged = sum(1 for layer in model.model.layers if getattr(layer, "_has_config_recompute", False))
        log.info(f"recompute: {flagged} of {cfg.num_hidden_layers} decoder layers recompute their activations in backward")
    return plan, cfg, model, opened


def log_mode(recipe: Recipe, grid: Grid, log: logging.Logger) -> None:
    """How the step runs: graph or PyNative, what the installed MindSpore falls back on, the TP loss."""
    log.info(f"execution: {execution.describe(recipe)}")
    for note in execution.runtime_fallbacks(recipe):
        log.warning(f"fallback: {note}")
    if grid.tp > 1:
        log.info(grid_mod.loss_note(recipe, grid))
