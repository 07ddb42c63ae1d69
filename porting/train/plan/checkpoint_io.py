"""A run's checkpoints as the plan sees them: the bytes a rank reads back, the disk the run directory needs, and the
share of wall time the saves take.

Restore (porting/train/run/checkpoint/read.py ``restore``, format.py ``needed``): a resuming rank reads its whole
tensor-parallel slice of the weights (every data-parallel rank holds all of them) and its share of the optimizer
state: its ZeRO shard of the fp32 masters (bf16/fp16 parameters only), AdamW m and v, or all of them without ZeRO::

    read_bytes = P_local x param bytes + P_local x (4 masters + 8 m, v) / (dp with ZeRO, else 1)

which is not what a rank writes (format.py ``owned``: 1/dp of the weights too with ZeRO, comm.py
``checkpoint_bytes``): at 13B TP 8 x DP 8 a rank reads 2x what it writes. Every rank reads at once through the
filesystem the checkpoints live on, so ``restore_s = world x read_bytes / checkpointing.fs_gib_per_s`` (its
aggregate bandwidth, measured for writes by porting/train/plan/fs_speed.py and taken for reads too: a filesystem
reads at least as fast as it writes on the products named there; ranks of one node that read the same weights may
be served by the page cache, so this is an upper bound).

Disk (the run directory's filesystem; every node's, as the checkpoints need one shared filesystem):

- a checkpoint: every rank's file together (comm.py ``checkpoint_total_bytes``);
- retention: ``checkpointing.keep_last`` are kept, and a save writes the new one whole before the oldest is removed
  (porting/train/run/checkpoint/save.py ``save``: the temporary directory renamed into place, then the pruning), so
  ``keep_last + 1`` exist while a save completes;
- the HF export (``checkpointing.export_hf``): the full model in the parameter dtype (``port convert --ms`` keeps
  the dtype), plus, while it is made, the MindSpore weights it is staged from (porting/train/run/checkpoint/export.py
  ``_stage``) and the previous export until the new one replaces it (converters/atomic.py);
- the token files: one per node, 8 bytes a token (porting/train/data/token_file.py), estimated as 2 x the data
  file's bytes (host_memory.py ``data_bytes``; 0 when the data is not where the plan runs).

``need = max(save: (keep_last + 1) x checkpoint + export, export: keep_last x checkpoint + 3 x export) + token files``.

Save overhead: ``share = saves x save_s / (steps x step_s + saves x save_s)`` with ``saves`` the checkpoints of the
run (one every ``checkpointing.every_steps`` and the final one: porting/train/run/loop.py); without a step count
(``schedule.epochs``: the steps follow from the data) the same per checkpoint interval, ``save_s / (every_steps x
step_s + save_s)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_zoo.config import LlamaConfig
from porting.train.plan.comm import checkpoint_total_bytes, parameter_numels, save_seconds
from porting.train.plan.host_memory import data_bytes, state_bytes_per_element
from porting.train.plan.layout import DTYPE_BYTES, Layout
from porting.train.recipe.schema import Recipe

GIB = float(1 << 30)


def read_bytes(recipe: Recipe, layout: Layout) -> float:
    """Bytes one rank reads to resume (module docstring)."""
    p = float(layout.parameters)
    share = recipe.data_parallel_size if layout.sharded else 1
    return p * DTYPE_BYTES[recipe.precision.param_dtype] + p * state_bytes_per_element(recipe) / share


def restore_seconds(recipe: Recipe, layout: Layout) -> float:
    """Every rank reading its bytes at once through the filesystem's aggregate bandwidth."""
    return recipe.world_size * read_bytes(recipe, layout) / (recipe.checkpointing.fs_gib_per_s * GIB)


def group_bytes(recipe: Recipe, cfg: LlamaConfig, layout: Layout) -> tuple[float, float]:
    """(the largest group of weights one rank reads between two log lines: a decoder layer, the embedding or the
    head, its TP slice in the parameter dtype (HF load and restore log one line per group: converters/loading.py,
    checkpoint/read.py ``Progress``); the largest group of optimizer state: one ZeRO bucket's shard of one kind,
    or one group's state of one kind without ZeRO)."""
    numels = parameter_numels(cfg, recipe.parallel.tensor_parallel)
    per_layer = (len(numels) - 2 - (0 if cfg.tie_word_embeddings else 1)) // cfg.num_hidden_layers
    layer = sum(numels[1:1 + per_layer])
    largest = max(layer, numels[0], sum(numels[1 + per_layer * cfg.num_hidden_layers:]))
    states = max((b.shard(layout.dp) for b in layout.buckets), default=0) if layout.sharded else largest
    return largest * DTYPE_BYTES[recipe.precision.param_dtype], 4.0 * states


def gib_text(gib: float) -> str:
    """GiB as a person reads them: MiB below one GiB."""
    return f"{gib:,.1f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB"


@dataclass(frozen=True)
class DiskPlan:
    """GiB the run directory's filesystem needs (plan.json ``disk``; module docstring)."""

    checkpoint_gib: float
    keep_last: int
    checkpoints_at_peak: int
    hf_export_gib: float
    token_files_gib: float
    need_gib: float
    peak_during: str                 # "a save" or "the HF export"
    formula: str


def disk_plan(recipe: Recipe, cfg: LlamaConfig, layout: Layout) -> DiskPlan:
    """The disk a run needs at its peak (module docstring)."""
    ck = checkpoint_total_bytes(recipe, layout) / GIB   # the final one is written whatever every_steps says
    k = recipe.checkpointing.keep_last
    export = cfg.num_parameters() * DTYPE_BYTES[recipe.precision.param_dtype] / GIB if recipe.checkpointing.export_hf \
        else 0.0
    tokens = recipe.cluster.nodes * data_bytes(recipe) / GIB
    at_save, at_export = (k + 1) * ck + export, k * ck + 3 * export
    need = max(at_save, at_export) + tokens
    return DiskPlan(
        checkpoint_gib=round(ck, 3), keep_last=k, checkpoints_at_peak=k + 1 if at_save >= at_export else k,
        hf_export_gib=round(export, 3), token_files_gib=round(tokens, 3), need_gib=round(need, 3),
        peak_during="a save" if at_save >= at_export else "the HF export",
        formula=f"max(a save: (keep_last {k} + 1) x checkpoint {ck:.2f} GiB + HF export {export:.2f} GiB, the export: "
                f"{k} x checkpoint + 3 x export) + token files {tokens:.2f} GiB (porting/train/plan/checkpoint_io.py)")


@dataclass(frozen=True)
class SaveOverhead:
    """The saves' share of wall time (plan.json ``save_overhead``; module docstring)."""

    save_s: float
    every_steps: int
    steps: int | None                # None: the steps follow from the data (schedule.epochs)
    saves: int | None
    step_s: float | None             # the plan's estimated step (None: no estimate)
    share: float | None
    formula: str


def save_overhead(recipe: Recipe, layout: Layout, step_s: float | None) -> SaveOverhead:
    """The share of wall time spent saving, from the plan's save and step estimates (module docstring)."""
    save_s, every, steps = save_seconds(recipe, layout), recipe.checkpointing.every_steps, recipe.schedule.max_steps
    saves = (((steps - 1) // every if every else 0) + 1) if steps else None
    share, how = None, "no step estimate (a CPU without --calibration): no share"
    if step_s and steps and saves:
        share = saves * save_s / (steps * step_s + saves * save_s)
        how = f"{saves} saves x {save_s:.1f} s / ({steps} steps x {step_s:.4g} s + {saves} saves x {save_s:.1f} s)"
    elif step_s and every:
        share = save_s / (every * step_s + save_s)
        how = (f"per checkpoint interval (steps follow from the data): {save_s:.1f} s / ({every} steps x {step_s:.4g} s "
               f"+ {save_s:.1f} s)")
    elif step_s:
        how = "only the final checkpoint (checkpointing.every_steps 0) and no step count: no share"
    return SaveOverhead(save_s=round(save_s, 1), every_steps=every, steps=steps, saves=saves,
                        step_s=round(step_s, 4) if step_s else None, share=round(share, 4) if share is not None else None,
                        formula=how)
