"""Ranks as a (data parallel x tensor parallel) grid, and what tensor parallel needs around the loop.

Megatron's order: rank = dp_rank x tp + tp_rank, so the ``tp`` ranks of a tensor-parallel group are
neighbours on one node (the recipe keeps ``parallel.tensor_parallel`` within ``devices_per_node``):
their per-layer all-reduces stay on the intra-node links, and the gradient all-reduce runs across the
data-parallel group (the ranks with the same ``tp_rank``). Groups are made with
``mindspore.communication.create_group``, which works on the CPU backend under msrun (AllReduce SUM on
a sub-group; AllGather only on the world group), so the same code runs there and on Ascend (HCCL).
"""

from __future__ import annotations

import dataclasses
from model_zoo.errors import CheckpointError
from porting.train.recipe.schema import Recipe



@dataclasses.dataclass(frozen=True)
class Grid:
    """This rank's coordinates. ``dp_group`` None: the world group (no tensor parallel)."""
    rank: int
    world: int
    tp: int = 1
    tp_group: str | None = None
    dp_group: str | None = None

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    def describe(self) -> str:
        if self.tp == 1:
            return f"data parallel {self.dp}"
        return (f"data parallel {self.dp} x tensor parallel {self.tp}: dp rank {self.dp_rank}, tp rank "
                f"{self.tp_rank}; tp group {self.tp_group}, dp group {self.dp_group or 'world'}")


def tp_ranks(rank: int, tp: int) -> list[int]:
    first = rank // tp * tp
    return list(range(first, first + tp))


def dp_ranks(rank: int, world: int, tp: int) -> list[int]:
    return list(range(rank % tp, world, tp))


def make_grid(recipe: Recipe, rank: int, world: int) -> Grid:
    """The grid of this run; with tensor parallel, creates this rank's TP and DP groups (collective:
    every rank calls it in the same order)."""
    tp = recipe.parallel.tensor_parallel
    if tp == 1:
        return Grid(rank, world)
    from mindspore.communication import create_group  # deferred: the grid arithmetic (Grid, tp_ranks) is read without MindSpore

    tp_group = f"tp_{tp_ranks(rank, tp)[0]}"
    create_group(tp_group, tp_ranks(rank, tp))
    dp_group = None
    if world // tp > 1:
        dp_group = f"dp_{rank % tp}"
        create_group(dp_group, dp_ranks(rank, world, tp))
    return Grid(rank, world, tp, tp_group, dp_group)


def shard_fn(model, tp_rank: int, tp: int):
    """``(name, full array) -> this rank's slice``: the loader's and the checkpoint's slicing of full tensors
    (AdamW states ``adam_m.<p>``, ``adam_v.<p>``, ``master.<p>`` sliced like ``<p>``)."""
    from model_zoo.parallel import shard_layout, split_shard  # deferred: imports MindSpore; the grid arithmetic is read without it

    layout = shard_layout(model)

    def shard(name: str, full):
        axis = layout.get(param_of(name))
        try:
            return split_shard(full, axis, tp_rank, tp)
        except ValueError as e:
            raise CheckpointError(f"{name}: {e}; the checkpoint does not fit parallel.tensor_parallel: {tp}") from None
    return shard


STATE_PREFIXES = ("adam_m.", "adam_v.", "master.")


def param_of(name: str) -> str:
    """The model parameter an optimizer state belongs to (the name itself for a parameter)."""
    for pre in STATE_PREFIXES:
        if name.startswith(pre):
            return name[len(pre):]
    return name


def tensor_parallel(recipe: Recipe, grid: Grid | None):
    """The model's :class:`model_zoo.parallel.TensorParallel` for this rank, or None (no tensor parallel)."""
    from model_zoo.parallel import TensorParallel  # deferred: imports MindSpore; the grid arithmetic is read without it

    if grid is None or grid.tp == 1:
        return None
    # The CPU's AllReduce has SUM only: the loss's row maximum is emulated with a SUM (model_zoo/parallel.py).
    return TensorParallel(grid.tp, grid.tp_rank, grid.tp_group, max_by_sum=recipe.cluster.device == "cpu")


def loss_note(recipe: Recipe, grid: Grid) -> str:
    how = "AllReduce SUM of per-rank slots (the CPU's AllReduce has SUM only)" \
        if recipe.cluster.device == "cpu" else "AllReduce MAX"
    return f"tensor parallel {grid.tp}: vocab-parallel loss, row max by {how}"


def step_groups(model, grid: Grid) -> dict:
    """The training step's group arguments (porting/train/run/step/cells.py ``_Update``) and the shard ``layout``."""
    from model_zoo.parallel import shard_layout  # deferred: imports MindSpore; the grid arithmetic is read without it

    if grid.tp == 1:
        return {}
    layout = shard_layout(model)
    return dict(dp_group=grid.dp_group, tp_group=grid.tp_group, layout=layout,
                tp_sharded=[p.name in layout for p in model.trainable_params()])
