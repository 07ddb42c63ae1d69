"""The run directory's checkpoints, checked in `port train`'s own process before any worker starts.

A run directory with checkpoints is continued only with ``--resume``, and only from a checkpoint that
continues this run exactly. Everything here runs before msrun, so a refusal is one line on the terminal,
not a worker's traceback with the reason in its log. What is checked, on the newest ``step_<n>`` (the
one every rank would load, :func:`porting.train.run.checkpoint.save.latest`):

* it is whole: ``state.json`` in range (:class:`~porting.train.run.checkpoint.save.TrainState`), its ``step``
  and ``next_step`` equal to the directory's ``n`` (a renamed directory, or one from another run, is
  refused), the layout record (porting/train/run/checkpoint/format.py; a directory without one is not a
  checkpoint port reads, porting/train/run/checkpoint/record.py ``require_layout``), every rank file of its
  size with a valid safetensors header (a truncated file), and ``state.json``'s ``world_size``,
  ``shards`` and ``seed`` equal to the record's (a forged state);
* with ``--resume``, it is this run: same model, seed, global batch and recipe
  (:func:`porting.train.run.checkpoint.read.check_same_run`), ``next_step`` within ``schedule.max_steps``; a
  checkpoint written in another layout (world size, TP, ZeRO) is re-cut exactly
  (tests/train/test_ckpt_layouts.py compares the losses) and that is said.

A damaged newest checkpoint gets the same advice with and without ``--resume``
(:func:`porting.train.run.checkpoint.save.damaged_advice`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from converters.safetensors_io import read_header
from model_zoo.errors import CheckpointError, RecipeError
from porting.rundir.paths import RunDir
from porting.train.recipe.schema import Recipe
from porting.train.run.checkpoint import save as ckpt
from porting.train.run.checkpoint.read import check_same_run, read_record
from porting.train.run.checkpoint.format import identity_of


def _newest(root: Path) -> Path | None:
    """The step directory with the highest step, complete or not."""
    dirs = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := ckpt.STEP_DIR.match(p.name))] \
        if root.is_dir() else []
    return max(dirs)[1] if dirs else None


def validate(ckdir: Path) -> tuple[ckpt.TrainState, Any, dict]:
    """(state, layout, identity) of ``ckdir`` after the wholeness checks of the docstring."""
    fix = ckpt.damaged_advice(ckdir)
    if not (ckdir / ckpt.STATE_FILE).is_file():
        raise CheckpointError(f"{ckdir}: has no {ckpt.STATE_FILE} (an incomplete or foreign directory); {fix}")
    st = ckpt.TrainState.read(ckdir / ckpt.STATE_FILE)
    n = int(ckpt.STEP_DIR.match(ckdir.name).group(1))
    if st.step != n or st.next_step != n:
        raise CheckpointError(f"{ckdir / ckpt.STATE_FILE}: step {st.step}, next_step {st.next_step} in a directory "
                              f"named {ckdir.name}: renamed, or taken from another run; {fix}")
    layout, ident, table = read_record(ckdir)
    for key, mine, theirs in (("world_size", st.world_size, layout.world), ("shards", st.shards, layout.world),
                              ("seed", st.seed, ident.get("seed"))):
        if mine != theirs:
            raise CheckpointError(f"{ckdir / ckpt.STATE_FILE}: key '{key}' is {mine}, the layout record says "
                                  f"{str(theirs)[:40]}: the state was edited or mixed with another run's; {fix}")
    for name, entry in sorted(table.items()):
        path = ckdir / name
        size = path.stat().st_size if path.is_file() else None
        if size != entry["bytes"]:
            found = "missing" if size is None else f"{size} bytes"
            raise CheckpointError(f"{path}: {found}, the layout record says {entry['bytes']} bytes (truncated or "
                                  f"replaced); {fix}")
        read_header(path)   # bounded: the header only
    return st, layout, ident


def check_run_dir(out: Path, resume: bool, recipe: Recipe, model_config: dict | None = None) -> str | None:
    """Refuse, in one line, a run directory this launch cannot start or continue exactly (see the module
    docstring); with ``--resume`` returns what the terminal should know (a layout change made exact).
    ``model_config``: the model's HF config, compared with the checkpoint's (None: not compared)."""
    root = RunDir(out).checkpoints
    leftovers = set(ckpt.interrupted_saves(root))
    others = sorted(set(root.iterdir()) - leftovers) if root.is_dir() else []
    if not others:
        if resume:
            raise ckpt.CheckpointError(f"{root}: --resume but no complete checkpoint there; run without --resume")
        return None
    newest = _newest(root)
    if newest is None:
        raise RecipeError(f"{out}: holds checkpoints of an earlier run ({others[0].name} in {root}); pass --resume to "
                          "continue it, or --run-dir NEW_DIR to start another run")
    try:
        st, layout, ident = validate(newest)
    except CheckpointError as e:
        raise CheckpointError(f"{out}: holds checkpoints of an earlier run, and the newest cannot be continued: "
                              f"{e}") from None
    if not resume:
        raise RecipeError(f"{out}: holds checkpoints of an earlier run; pass --resume to continue it, or "
                          "--run-dir NEW_DIR to start another run")
    return check_continues(newest, st, layout, ident, recipe, model_config)


def check_continues(ckdir: Path, st: ckpt.TrainState, layout: Any, ident: dict, recipe: Recipe,
                    model_config: dict | None) -> str | None:
    """``ckdir`` continues ``recipe``'s run exactly, or one line why not; the note on a layout change."""
    max_steps = recipe.schedule.max_steps
    if max_steps is not None and st.next_step > max_steps:
        raise CheckpointError(f"{ckdir / ckpt.STATE_FILE}: next_step {st.next_step} is beyond schedule.max_steps "
                              f"{max_steps}: nothing to continue; raise schedule.max_steps to train further")
    if model_config is not None:
        check_same_run(ckdir, ident, identity_of(recipe, model_config))
    tp = recipe.parallel.tensor_parallel
    if (layout.world, layout.tp) == (recipe.world_size, tp):
        return None
    return (f"resume: {ckdir.name} was written by {layout.world} rank(s) (tp {layout.tp}, zero {layout.zero}); this "
            f"run has {recipe.world_size} (tp {tp}): the per-rank checkpoint is re-cut exactly for the new layout "
            "(same model, seed, global batch and recipe)")
