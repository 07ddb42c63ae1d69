"""How long a supervisor may wait for a sign of life (a heartbeat record or a log line) from a rank of a
`port train` run before it calls a stall, from what the run does in each phase. The plan holds the result
(``TrainPlan.allowances``, plan.json) and the supervisor's watch takes its per-phase allowances from it
(porting/launch/watch.py ``derive_limits``); nothing else decides them.

A phase's allowance is the longest silence the plan expects in it (its own planned figure) times a stated margin,
never less than :data:`FLOOR_S`; a phase that logs as it goes is allowed one of its silent windows, not its total:

- ``init``: joining the cluster (msrun's scheduler, HCCL's communicators) before the rank's first line. Nothing
  measures its length here; its bound is the plan's own: ``HCCL_CONNECT_TIMEOUT`` (comm.py ``hccl_env``) and
  ``cluster.cluster_time_out`` (msrun), after which HCCL or msrun fail by themselves. The allowance is the larger of
  them plus :data:`INIT_MARGIN_S`, so their own error is in the logs when the supervisor looks. One device: none.
- ``hf_load``: the HF checkpoint read, one log line per decoder layer (converters/loading.py ``load_hf_dir``): one
  group (the largest of a layer, the embedding and the head: checkpoint_io.py ``group_bytes``) of this rank's TP
  slice in the parameter dtype (the HF file's, for the shipped recipes), every rank reading at once through
  ``checkpointing.fs_gib_per_s``: ``world x group bytes / bandwidth``.
- ``compile``: one graph (porting/train/run/step/precompile.py logs a line per graph): ``seconds_per_graph``, a
  measured compile (``precompile: graph N of M: ... in S s`` in a rank log) when there is one, else
  ``COMPILE_S_PER_LAYER`` x layers, an assumption (no Ascend measurement of a whole-model graph's compile is held).
- ``restore``: one parameter group (checkpoint/read.py ``Progress``: a layer's weights, one ZeRO bucket's shard of one
  optimizer state) at the same shared bandwidth; the whole restore is planned from the bytes a rank READS
  (checkpoint_io.py ``read_bytes``: its whole TP slice of the weights and its share of the states).
- ``save``: the whole save (all ranks write their one file at once; comm.py ``save_seconds``).
- ``step``: ``STEP_FACTOR`` x the plan's estimated step, at least ``STEP_FLOOR_S``, and with more than one device at
  most half of ``HCCL_EXEC_TIMEOUT`` (comm.py ``hccl_env``), so a stalled rank is named while the others still
  wait in their collective with its evidence live.

The margin of the planned phases is :data:`SLACK` (a slow day, a filesystem 3x slower than planned). The rank's
heartbeat phases (porting/rundir/heartbeat.py) are ``setup`` (init, data, HF load), ``restore``, ``compile``,
``step``, ``save``: ``setup_s`` is the larger of init's and one HF-load group's allowances; the watch allows its
setup and compile phases the larger of ``setup_s`` and ``compile_s``. ``line_s`` is the longest one-line silence
(one graph, one group, the save) times the margin; ``compile_total_s`` the whole time before step 1 (all graphs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from model_zoo.config import LlamaConfig
from porting.train.plan.checkpoint_io import GIB, group_bytes, read_bytes, restore_seconds
from porting.train.plan.comm import hccl_env, save_seconds
from porting.train.plan.layout import DTYPE_BYTES, Layout
from porting.train.recipe.schema import Recipe

COMPILE_S_PER_LAYER = {"ascend": 15.0, "cpu": 2.0}   # an assumption until a device run measures it
SLACK = 3.0          # a slow day: 3x the prediction before a silent worker is called stalled
FLOOR_S = 120.0      # never less than two minutes of silence
INIT_MARGIN_S = 60.0  # past HCCL's and msrun's own timeouts: their error is written first
STEP_FACTOR = 20.0   # a logged step may take 20x its estimate (data stalls, a slow host) before it is a stall
STEP_FLOOR_S = 300.0  # and never less than five minutes: CPU runs and unestimated plans


@dataclass(frozen=True)
class Phase:
    """One phase's planned silence, its margin and the allowance they give (plan.json ``allowances.phases``)."""

    name: str                # init, hf_load, compile, restore, save, step
    planned_s: float         # the longest silence the plan expects in the phase
    margin: str              # how the allowance is made from it
    allowance_s: int
    whole_s: float           # the whole phase as planned (init: its bound; step: one step)
    inputs: str


@dataclass(frozen=True)
class Allowances:
    """Seconds without a sign of life the supervisor allows per line and per phase, each with the inputs and the
    formula that gave it (plan.json ``allowances``; porting/launch/watch.py ``derive_limits`` reads them).
    ``compile_s`` and ``restore_s`` are one graph's and one group's silence (they were the whole phase's until
    issue 47, which let a hung compile run 9,000 s at 13B); ``setup_s`` and ``phases`` are new."""

    line_s: int
    compile_s: int
    restore_s: int
    save_s: int
    step_s: int
    graphs: int
    shapes: int
    seconds_per_graph: float
    formula: str
    setup_s: int = 0
    compile_total_s: int = 0
    restore_read_bytes: int = 0      # what one rank reads to resume (checkpoint_io.py read_bytes)
    phases: tuple[Phase, ...] = ()


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


def _planned(name: str, silence: float, whole: float, inputs: str) -> Phase:
    """A phase allowed SLACK x its planned silence, at least FLOOR_S."""
    return Phase(name, round(silence, 3), f"{SLACK:g} x the planned silence, at least {FLOOR_S:g} s",
                 math.ceil(max(FLOOR_S, SLACK * silence)), round(whole, 3), inputs)


def phases(recipe: Recipe, cfg: LlamaConfig, layout: Layout, per_graph: float, graphs: int,
           step_s: float | None) -> tuple[Phase, ...]:
    """Every phase's planned silence and allowance (module docstring)."""
    bw, world = recipe.checkpointing.fs_gib_per_s * GIB, recipe.world_size
    weights, states = group_bytes(recipe, cfg, layout)
    env = hccl_env(recipe, layout)
    connect = float(env["HCCL_CONNECT_TIMEOUT"])
    bound = max(connect, float(recipe.cluster.cluster_time_out)) if world > 1 else 0.0
    init = Phase("init", bound, f"the larger of HCCL_CONNECT_TIMEOUT and cluster.cluster_time_out + {INIT_MARGIN_S:g} s",
                 math.ceil(bound + INIT_MARGIN_S) if world > 1 else 0, bound,
                 f"HCCL_CONNECT_TIMEOUT {connect:.0f} s (plan), cluster_time_out {recipe.cluster.cluster_time_out} s"
                 if world > 1 else "one device: no cluster to join")
    hf_whole = world * float(layout.parameters) * DTYPE_BYTES[recipe.precision.param_dtype] / bw
    step = max(STEP_FLOOR_S, STEP_FACTOR * (step_s or 0.0))
    cap = ""
    if world > 1:
        half = max(60.0, float(env["HCCL_EXEC_TIMEOUT"]) / 2)
        step, cap = min(step, half), f", at most HCCL_EXEC_TIMEOUT / 2 = {half:.0f} s"
    save = save_seconds(recipe, layout)
    return (init,
            _planned("hf_load", world * weights / bw, hf_whole, f"{world} ranks x one group's {weights / 1e6:.1f} MB "
                     "(the largest of a layer, the embedding, the head; this rank's TP slice) / fs_gib_per_s"),
            _planned("compile", per_graph, graphs * per_graph, f"one graph {per_graph:.0f} s; {graphs} graph(s)"),
            _planned("restore", world * max(weights, states) / bw, restore_seconds(recipe, layout),
                     f"{world} ranks x one group's {max(weights, states) / 1e6:.1f} MB / fs_gib_per_s; whole restore "
                     f"{world} x {read_bytes(recipe, layout) / GIB:.2f} GiB read a rank / fs_gib_per_s"),
            _planned("save", save, save, "all ranks' checkpoint bytes / fs_gib_per_s"),
            Phase("step", round(step_s or 0.0, 4), f"max({STEP_FLOOR_S:g}, {STEP_FACTOR:g} x the estimated step){cap}",
                  math.ceil(step), round(step_s or 0.0, 4), "the plan's estimated step"))


def allowances(recipe: Recipe, cfg: LlamaConfig, layout: Layout, shapes: int,
               seconds_per_graph: float | None = None, step_s: float | None = None) -> Allowances:
    """Per-line and per-phase allowances in seconds, each with the formula that gave it (``step_s``: the plan's
    estimated step, when it has one)."""
    per_graph = seconds_per_graph if seconds_per_graph is not None else \
        COMPILE_S_PER_LAYER[recipe.cluster.device] * cfg.num_hidden_layers
    graphs = graph_count(recipe, shapes)
    ph = {p.name: p for p in phases(recipe, cfg, layout, per_graph, graphs, step_s)}
    line = max(FLOOR_S, SLACK * max(ph["compile"].planned_s, ph["restore"].planned_s, ph["hf_load"].planned_s,
                                    ph["save"].planned_s))
    setup = max(ph["init"].allowance_s, ph["hf_load"].allowance_s)
    return Allowances(
        line_s=math.ceil(line), compile_s=ph["compile"].allowance_s, restore_s=ph["restore"].allowance_s,
        save_s=ph["save"].allowance_s, step_s=ph["step"].allowance_s, graphs=graphs, shapes=shapes,
        seconds_per_graph=per_graph, setup_s=setup,
        compile_total_s=math.ceil(max(FLOOR_S, SLACK * graphs * per_graph)),
        restore_read_bytes=int(read_bytes(recipe, layout)), phases=tuple(ph.values()),
        formula="; ".join(f"{p.name} {p.allowance_s} s = {p.margin} (planned {p.planned_s:g} s: {p.inputs})"
                          for p in ph.values()) + f"; setup = max(init, hf_load) = {setup} s")
