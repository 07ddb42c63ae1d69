"""How long a supervisor may wait for the next log line of a `port train` run before it calls a stall, from
what the run does between lines (the coordinator wires this into porting/supervise.py ``derive_limits``).

Between two log lines a worker does one of (each logs a line when it ends):
- compile one graph before step 1 (porting/train/run/precompile.py: one line per graph);
- restore one parameter group (porting/train/run/ckpt_read.py ``Progress``: one line per decoder layer, per
  ZeRO bucket of each optimizer state);
- write its rank file (porting/train/run/checkpoint.py ``save_ranks``: one line per rank file);
- run one step.
So the allowance is the longest of these, with a factor for a slow day, not their sum: the silent windows
are one graph, one group or one file long. The totals (all graphs, the whole restore, the whole save) are
given too, for a supervisor that watches the phases instead.

Inputs and their sources:
- graphs: the step cells times the run's shapes, plus the update graph with accumulation (precompile.py
  ``precompile``); ``seconds_per_graph``: a measured compile (``precompile: graph N of M: ... in S s`` in a
  rank log) when there is one, else ``COMPILE_S_PER_LAYER`` x layers, an assumption (no Ascend measurement
  of a whole-model graph's compile is held here);
- bytes to restore: each rank reads its shard (porting/train/plan/comm.py ``checkpoint_bytes``), all ranks
  at once through the filesystem's aggregate bandwidth (``checkpointing.fs_gib_per_s``, measured by
  porting/train/plan/fs_speed.py);
- save: the whole checkpoint through the same bandwidth (comm.py ``save_seconds``).
"""

from __future__ import annotations

import math

from model_zoo.config import LlamaConfig
from porting.train.plan.comm import checkpoint_bytes, save_seconds
from porting.train.plan.layout import Layout
from porting.train.recipe.schema import Recipe

COMPILE_S_PER_LAYER = {"ascend": 15.0, "cpu": 2.0}   # an assumption until a device run measures it
SLACK = 3.0          # a slow day: 3x the prediction before a silent worker is called stalled
FLOOR_S = 120.0      # never less than two minutes of silence


def graph_count(recipe: Recipe, shapes: int) -> int:
    """Graphs compiled before step 1: one step cell per shape, plus the update graph with accumulation."""
    return shapes + (1 if recipe.batching.grad_accum_steps > 1 else 0)


def allowances(recipe: Recipe, cfg: LlamaConfig, layout: Layout, shapes: int,
               seconds_per_graph: float | None = None) -> dict:
    """Per-line and per-phase allowances in seconds, each with the formula that gave it."""
    per_graph = seconds_per_graph if seconds_per_graph is not None else \
        COMPILE_S_PER_LAYER[recipe.cluster.device] * cfg.num_hidden_layers
    graphs = graph_count(recipe, shapes)
    bw = recipe.checkpointing.fs_gib_per_s * (1 << 30)
    restore_s = recipe.world_size * checkpoint_bytes(recipe, layout) / bw   # every rank reads its shard at once
    group_s = restore_s / (cfg.num_hidden_layers + 1)                      # one line per layer (+ the rest)
    save_s = save_seconds(recipe, layout)
    line = max(FLOOR_S, SLACK * max(per_graph, group_s, save_s))
    return {"line_s": math.ceil(line), "compile_s": math.ceil(max(FLOOR_S, SLACK * graphs * per_graph)),
            "restore_s": math.ceil(max(FLOOR_S, SLACK * restore_s)), "save_s": math.ceil(max(FLOOR_S, SLACK * save_s)),
            "graphs": graphs, "seconds_per_graph": per_graph,
            "formula": f"line = max({FLOOR_S:g}, {SLACK:g} x max(one graph {per_graph:.0f} s, one restored group "
                       f"{group_s:.0f} s, the save {save_s:.0f} s)); compile = {SLACK:g} x {graphs} graphs x "
                       f"{per_graph:.0f} s; restore = {SLACK:g} x world x shard bytes / fs_gib_per_s; save = "
                       f"{SLACK:g} x checkpoint bytes / fs_gib_per_s"}
