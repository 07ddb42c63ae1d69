"""How long a supervisor may wait for a sign of life (a heartbeat record or a log line) from a rank of a
`port train` run before it calls a stall, from what the run does in each phase. The plan holds the result
(``TrainPlan.allowances``, plan.json) and the supervisor's watch takes its per-phase allowances from it
(porting/launch/watch.py ``derive_limits``); nothing else decides them.

Between two log lines a worker does one of (each logs a line when it ends):
- compile one graph before step 1 (porting/train/run/step/precompile.py: one line per graph);
- restore one parameter group (porting/train/run/checkpoint/read.py ``Progress``: one line per decoder layer, per
  ZeRO bucket of each optimizer state);
- write its rank file (porting/train/run/checkpoint/save.py ``save_ranks``: one line per rank file);
- run one step.
``line_s`` is the longest of these, with a factor for a slow day, not their sum: the silent windows are one
graph, one group or one file long. The watch allows each phase its total instead (``compile_s``: all
graphs, with the set-up before them; ``restore_s``: the whole restore; ``save_s``: the whole save;
``step_s``: one logged step), an upper bound on any silence inside it.

Inputs and their sources:
- graphs: the step cells times the run's shapes, plus the update graph with accumulation (precompile.py
  ``precompile``); the shapes are at most :func:`plan_shapes` (the data may use fewer);
  ``seconds_per_graph``: a measured compile (``precompile: graph N of M: ... in S s`` in a
  rank log) when there is one, else ``COMPILE_S_PER_LAYER`` x layers, an assumption (no Ascend measurement
  of a whole-model graph's compile is held here);
- bytes to restore: each rank reads its shard (porting/train/plan/comm.py ``checkpoint_bytes``), all ranks
  at once through the filesystem's aggregate bandwidth (``checkpointing.fs_gib_per_s``, measured by
  porting/train/plan/fs_speed.py);
- save: the whole checkpoint through the same bandwidth (comm.py ``save_seconds``);
- step: ``STEP_FACTOR`` x the plan's estimated step (the roofline, Ascend only), at least ``STEP_FLOOR_S``, and
  with more than one device at most half of ``HCCL_EXEC_TIMEOUT`` (comm.py ``hccl_env``), so a stalled rank is
  named while the others still wait in their collective with its evidence live.
  Compile and restore run before the ranks' first collective (the precompile barrier bounds only the skew
  between ranks, which compile the same graphs at once), and the HCCL timeouts are derived from the save
  time (3 x save + 600 s), so none of the three is capped by them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model_zoo.config import LlamaConfig
from porting.train.plan.comm import checkpoint_bytes, hccl_env, save_seconds
from porting.train.plan.layout import Layout
from porting.train.recipe.schema import Recipe

COMPILE_S_PER_LAYER = {"ascend": 15.0, "cpu": 2.0}   # an assumption until a device run measures it
SLACK = 3.0          # a slow day: 3x the prediction before a silent worker is called stalled
FLOOR_S = 120.0      # never less than two minutes of silence
STEP_FACTOR = 20.0   # a logged step may take 20x its estimate (data stalls, a slow host) before it is a stall
STEP_FLOOR_S = 300.0  # and never less than five minutes: CPU runs and unestimated plans


@dataclass(frozen=True)
class Allowances:
    """Seconds without a sign of life the supervisor allows per line and per phase, each with the inputs and the
    formula that gave it (plan.json ``allowances``; porting/launch/watch.py ``derive_limits`` reads them)."""

    line_s: int
    compile_s: int
    restore_s: int
    save_s: int
    step_s: int
    graphs: int
    shapes: int
    seconds_per_graph: float
    formula: str


def plan_shapes(recipe: Recipe) -> int:
    """The most sequence shapes the run can compile (porting/train/data/batching.py ``bucket_boundaries``): one
    with packing or without bucketing; the given boundaries plus the maximum length the batcher may append,
    at most ``max_shapes``; else ``max_shapes`` (chosen from the data, which may need fewer)."""
    b = recipe.batching
    if b.packing or not b.bucketing.enabled:
        return 1
    if b.bucketing.boundaries:
        return min(b.bucketing.max_shapes, len(set(b.bucketing.boundaries)) + 1)
    return b.bucketing.max_shapes


def graph_count(recipe: Recipe, shapes: int) -> int:
    """Graphs compiled before step 1: one step cell per shape, plus the update graph with accumulation."""
    return shapes + (1 if recipe.batching.grad_accum_steps > 1 else 0)


def allowances(recipe: Recipe, cfg: LlamaConfig, layout: Layout, shapes: int,
               seconds_per_graph: float | None = None, step_s: float | None = None) -> Allowances:
    """Per-line and per-phase allowances in seconds, each with the formula that gave it (``step_s``: the plan's
    estimated step, when it has one)."""
    per_graph = seconds_per_graph if seconds_per_graph is not None else \
        COMPILE_S_PER_LAYER[recipe.cluster.device] * cfg.num_hidden_layers
    graphs = graph_count(recipe, shapes)
    bw = recipe.checkpointing.fs_gib_per_s * (1 << 30)
    restore_s = recipe.world_size * checkpoint_bytes(recipe, layout) / bw   # every rank reads its shard at once
    group_s = restore_s / (cfg.num_hidden_layers + 1)                      # one line per layer (+ the rest)
    save_s = save_seconds(recipe, layout)
    line = max(FLOOR_S, SLACK * max(per_graph, group_s, save_s))
    step = max(STEP_FLOOR_S, STEP_FACTOR * (step_s or 0.0))
    cap = ""
    if recipe.world_size > 1:
        half = max(60.0, float(hccl_env(recipe, layout)["HCCL_EXEC_TIMEOUT"]) / 2)
        step, cap = min(step, half), f", at most HCCL_EXEC_TIMEOUT / 2 = {half:.0f} s"
    return Allowances(
        line_s=math.ceil(line), compile_s=math.ceil(max(FLOOR_S, SLACK * graphs * per_graph)),
        restore_s=math.ceil(max(FLOOR_S, SLACK * restore_s)), save_s=math.ceil(max(FLOOR_S, SLACK * save_s)),
        step_s=math.ceil(step), graphs=graphs, shapes=shapes, seconds_per_graph=per_graph,
        formula=f"line = max({FLOOR_S:g}, {SLACK:g} x max(one graph {per_graph:.0f} s, one restored group "
                f"{group_s:.0f} s, the save {save_s:.0f} s)); compile = {SLACK:g} x {graphs} graphs x "
                f"{per_graph:.0f} s; restore = {SLACK:g} x world x shard bytes / fs_gib_per_s; save = "
                f"{SLACK:g} x checkpoint bytes / fs_gib_per_s; step = max({STEP_FLOOR_S:g}, "
                f"{STEP_FACTOR:g} x estimated step {step_s or 0.0:.2f} s){cap}; compile, restore and save at least "
                f"{FLOOR_S:g} s")
