"""Every graph of a run compiled before step 1, on every rank, with MindSpore's compile cache under the run.

Why: a graph-mode step compiles on the first call of each input shape. When one data-parallel
rank meets a new shape at step N, it compiles while the others already wait in the gradient all-reduce,
and on a busy machine (or with a 40-layer model on Ascend) they give up first (`HCCL_EXEC_TIMEOUT`; on
the CPU the collective's own receive timeout) and the run dies. So:

- the batch plan pads every rank of a step to one shape (porting/train/data/batching.py, step 4), and
  :meth:`BatchSchedule.run_shapes` lists the shapes the run's steps use;
- :func:`precompile` compiles each step cell for each of them with ``Cell.compile(*inputs)``, which
  builds the graph a call with those shapes and dtypes would build, without running it (weights and
  optimizer state untouched): ``Cell.compile`` in
  https://mindspore.cn/docs/en/r2.7.0/api_python/nn/mindspore.nn.Cell.html and
  https://mindspore.cn/docs/en/r2.10.0/api_python/nn/mindspore.nn.Cell.html ("Compile Cell as a
  computation graph, the input must be consistent with the input defined in construct"; a later call
  with the same shapes and dtypes finds the graph in the cell's ``compile_cache``). The ranks then meet, so
  step 1 starts together, and a step that still compiles is logged as a warning on its rank;
- MindSpore's graph compile cache (``MS_COMPILER_CACHE_ENABLE=1``, ``MS_COMPILER_CACHE_PATH``; 2.10
  deprecates the older ``set_context(enable_compile_cache=, compile_cache_path=)`` in favour of these
  variables, mindspore/context.py; https://www.mindspore.cn/docs/en/r2.2/note/env_var_list.html) keeps
  the frontend graphs in ``RUN/compile_cache/<key>/rank_<r>/graph_cache`` for a resume or a rerun. MindSpore
  names cached graphs by compile order and checks only its Python sources' hash ("Be aware of correctness
  risks", mindspore/ccsrc/pipeline/jit/compile_cache_manager.cc; on 2.10 a cell whose constant changed loads
  the old graph), so the cache is on
  only while precompile runs (a fixed order), only for a process's first run (MindSpore fixes the folder
  and goes on counting at the process's first cached compile: an in-process second run would not match),
  and ``<key>`` hashes everything that shapes the graphs: the recipe, the model's config, the shapes, the
  world size, the MindSpore version, port's own graph-building sources (model_zoo/, porting/train/run/) and
  the paths of port's C++ CPU kernel libraries the graphs load (model_zoo/cpu_kernels.py ``handed_out``).
  A process-wide ``MS_COMPILER_CACHE_ENABLE`` set by the user (every graph, by order, one folder) is
  refused for that reason (porting/train/plan/execution.py). MindSpore binds a loaded graph to the cell's
  own parameters: a step cell must hold the model as a sub-cell (run/step/cells.py AccumGradStep), or the cached
  graph trains on zeros (measured: loss ln(vocab) at every step; tests/train/test_precompile.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import mindspore as ms
import numpy as np

from model_zoo import cpu_kernels
from porting.train.plan.comm import HCCL_EXEC_FLOOR_S
from porting.train.plan.execution import GRAPH
from porting.train.data.batching import BatchSchedule
from porting.train.recipe.schema import Recipe
from porting.train.run.step import execution
from porting.train.run.step import ready
from porting.train.run.step import shared_cache
from porting.train.run.step.cells import compiled_graphs

CACHE_DIR = "compile_cache"
_CACHE_ENV = ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH")
_ROOT = Path(__file__).resolve().parents[4]
_SOURCES = ("model_zoo", "porting/train/run")   # what builds the step graphs
_cache_used: list[Path] = []                    # the folder this process's cached compiles went to
IR_DIR = "ir"                                   # RUN/logs/ir: MindSpore's IR dumps (ir_dumps)
_IR_ENV = ("MS_OM_PATH", "MS_DEV_SAVE_GRAPHS_PATH")


@dataclass(frozen=True)
class CompileReport:
    """What was compiled before step 1 on this rank."""

    shapes: tuple[tuple[int, int], ...]   # (micro_batch, seq) shapes
    graphs: int                           # graphs of the step cells after precompile
    seconds: float                        # wall time of the compiles (and the cache's loads)
    cache_dir: str | None                 # the compile cache's folder, None when off

    def describe(self) -> str:
        cache = f"; compile cache {self.cache_dir}" if self.cache_dir else "; compile cache off"
        return (f"precompile: {self.graphs} graphs for shapes {[list(s) for s in self.shapes]} in "
                f"{self.seconds:.1f}s before step 1{cache}")


def cache_key(recipe_doc: dict, model_config: dict, shapes: list[tuple[int, int]], world_size: int) -> str:
    """A digest of everything the step graphs are built from (the cache's correctness depends on it)."""
    # a graph of port's C++ CPU kernels holds their library's path (ops.Custom aot): a cache of graphs that load
    # a library elsewhere (another PORT_KERNEL_CACHE or HOME, one since removed) must not be taken
    doc = {"recipe": recipe_doc, "model": model_config, "shapes": [list(s) for s in shapes],
           "world_size": world_size, "mindspore": ms.__version__, "cpu_kernels": cpu_kernels.handed_out()}
    h = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode())
    for folder in _SOURCES:
        for f in sorted((_ROOT / folder).rglob("*.py")):
            h.update(f.relative_to(_ROOT).as_posix().encode() + f.read_bytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def compile_cache(folder: Path | None) -> Iterator[None]:
    """MindSpore's graph compile cache in ``folder`` for the compiles inside the block (off when None, or
    when this process used it already); the variables are restored after it, so no later compile (eval,
    barrier) is saved or loaded. Off too in a process with no main script file (``python -c``, a pytest-xdist
    worker): MindSpore keys the cache on the files its entry script imports (``entry_script_path``, taken
    from ``sys.argv[0]`` when MindSpore is imported; mindspore/graph/api.py ``_get_compile_cache_dep_files``)
    and raises FileNotFoundError without one."""
    if folder is None or _cache_used or not _entry_script_is_a_file():
        yield
        return
    _cache_used.append(folder)
    old = {k: os.environ.get(k) for k in _CACHE_ENV}
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    os.environ["MS_COMPILER_CACHE_PATH"] = str(folder) + os.sep
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def ir_dumps(run_dir: Path | None) -> Iterator[Path | None]:
    """MindSpore's IR dumps of the compiles inside the block go to ``RUN/logs/ir`` (yielded), not the user's
    working directory. A graph that fails to compile makes MindSpore write ``<MS_OM_PATH>/rank_<r>/om/
    analyze_fail.ir``, ``MS_OM_PATH`` defaulting to ``.`` (measured on 2.7.2 and 2.10.0: neither
    ``set_context(save_graphs_path=)`` nor ``MS_DEV_SAVE_GRAPHS_PATH`` moves it; ``MS_OM_PATH`` does, read at
    the moment of the dump, tests/attacks/test_ir_dumps.py); ``MS_DEV_SAVE_GRAPHS_PATH`` is where the graphs a
    user asks for with ``MS_DEV_SAVE_GRAPHS`` go (default ``.``, mindspore/context.py ``save_graphs_path``; measured
    honoured on 2.7.2 and 2.10.0: 103 and 107 files there, none in the working directory). A value the user set is
    kept; both are restored after the block."""
    if run_dir is None:
        yield None
        return
    where = Path(run_dir) / "logs" / IR_DIR
    old = {k: os.environ.get(k) for k in _IR_ENV}
    for k, v in old.items():
        if v is None:
            os.environ[k] = str(where)
    try:
        yield Path(os.environ["MS_OM_PATH"])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)


def _with_dump(err: Exception | None, dumps: Path | None) -> Exception | None:
    """The compile error naming MindSpore's analysis file when it wrote one (None stays None: PyNative)."""
    found = sorted(dumps.glob("rank_*/om/analyze_fail.ir"), key=lambda f: f.stat().st_mtime) \
        if err is not None and dumps is not None and dumps.is_dir() else []
    return execution.GraphCompileError(f"{err}; MindSpore's analysis: {found[-1]}") if found else err


def _entry_script_is_a_file() -> bool:
    for name in ("mindspore.graph.api", "mindspore.common.api"):   # 2.10; 2.7-2.9
        try:
            path = getattr(importlib.import_module(name), "entry_script_path", None)
        except ImportError:
            continue
        return bool(path) and os.path.isfile(path)
    return False


def cache_wanted(recipe: Recipe) -> bool:
    """``cluster.compile_cache``: unset (auto), on for the CPU and off on Ascend. MindSpore documents
    ``MS_COMPILER_CACHE_ENABLE`` as the cache of the front-end graphs (the backend, with its kernels, is
    built again on Ascend: https://www.mindspore.cn/docs/en/r2.2/note/env_var_list.html), no device run has
    compared losses with and without it, and a stale graph trains on wrong weights (see above); so on Ascend
    it is off until the rehearsal's device rung compares them (docs/rundir.md). ``true`` turns it on."""
    chosen = getattr(recipe.cluster, "compile_cache", None)
    return chosen if chosen is not None else recipe.cluster.device == "cpu"


def _scalar() -> ms.Tensor:
    return ms.Tensor(np.float32(0.0))   # the step's scalars (scale, lr, bias corrections) are float32 tensors


def cell_calls(trainer, template, shape: tuple[int, int]) -> list[tuple[object, tuple]]:
    """(cell, inputs) for each step cell at ``shape``, with the dtypes and shapes ``Trainer.run_step``
    passes (``template``: one of the run's micro-batches, for its dtypes and packed inputs)."""
    ids = ms.Tensor(np.zeros(shape, template.input_ids.dtype))
    labels = ms.Tensor(np.zeros(shape, template.labels.dtype))
    packed = trainer.packed_inputs(template)   # packing has one shape: the template's own
    hyper = (_scalar(), _scalar(), _scalar())
    if trainer.accum == 1:
        return [(trainer.fused, (ids, labels, _scalar(), _scalar(), *hyper, *packed))]
    return [(trainer.grad_step, (ids, labels, _scalar(), *packed))]


def precompile(trainer, shapes: list[tuple[int, int]], template, cache: Path | None, log=None) -> CompileReport:
    """Compiles every step cell of ``trainer`` for every shape in ``shapes`` (nothing runs), the cache on;
    one log line per graph (its cell, shape and seconds) as it finishes, so the compiles before step 1 are
    never a silent window (a 13B graph compiles for minutes on Ascend)."""
    t0 = time.perf_counter()
    calls = [(shape, call) for shape in shapes for call in cell_calls(trainer, template, shape)]
    if trainer.accum > 1:   # the update graph has no sequence dimension: one compile
        calls.append((None, (trainer.apply, tuple(_scalar() for _ in range(6)))))
    with compile_cache(cache), ir_dumps(getattr(trainer, "run_dir", None)) as dumps:
        for n, (shape, (cell, args)) in enumerate(calls, 1):
            t1 = time.perf_counter()
            try:
                cell.compile(*args)
            except (RuntimeError, TypeError, ValueError) as e:   # MindSpore's compile errors (run/step/execution.py)
                raise _with_dump(execution.compile_failure(trainer.recipe, e, [shape or shapes[-1]]), dumps) from e
            if log is not None:
                what = f"shape {list(shape)}" if shape else "the update (no sequence dimension)"
                log(f"precompile: graph {n} of {len(calls)}: {type(cell).__name__} {what} in "
                    f"{time.perf_counter() - t1:.1f} s")
    used = cache is not None and _cache_used[:1] == [cache]
    return CompileReport(tuple(shapes), compiled_graphs(*trainer.cells), round(time.perf_counter() - t0, 3),
                         str(cache) if used else None)


def before_step_one(trainer, plan: BatchSchedule, model_config: dict, start: int, cache_on: bool, log) -> CompileReport | None:
    """Compiles the shapes of steps ``start ..`` on this rank (the cache under ``RUN/compile_cache`` when
    ``cache_on``), logs it, and meets the other ranks; None in PyNative mode or with no step left."""
    recipe = trainer.recipe
    if recipe.execution != GRAPH or start >= plan.total_steps:
        return None
    shapes = plan.run_shapes(start)
    template = plan.step(start, trainer.grid.dp_rank).micro_batches[0]
    cache = shared = ident = None
    if cache_on and cache_wanted(recipe):
        doc = recipe.model_dump(mode="json")
        cache = trainer.run_dir / CACHE_DIR / cache_key(doc, model_config, shapes, trainer.world)
        # PORT_COMPILE_CACHE_SHARED: another run's graphs of the same key, checked before use (run/step/shared_cache.py)
        key = cache_key(shared_cache.graph_doc(doc), model_config, shapes, trainer.world)
        ident, shared = shared_cache.Identity.of(key, doc, model_config, shapes, trainer.world), shared_cache.folder(key)
        _, note = shared_cache.adopt(shared, cache, trainer.rank, ident)
        if note:
            log.info(f"precompile: {note}")
    report = precompile(trainer, shapes, template, cache, log.info)
    log.info(report.describe())
    if report.cache_dir is not None and ident is not None:
        _, note = shared_cache.publish(shared, cache, trainer.rank, ident)
        if note:
            log.info(f"precompile: {note}")
    if trainer.world > 1:   # step 1 starts when every rank has compiled: nobody waits in a gradient all-reduce
        late = trainer.faults.compile_delay_for(trainer.rank)   # test hook, off unless set (read once by the Trainer)
        workers = min(trainer.world, recipe.cluster.devices_per_node)
        waited = ready.meet_node(trainer.run_dir, trainer.rank, workers, _wait_limit_s(), log.info, late_s=late)
        trainer.barrier()   # across nodes (this node's ranks are all ready: run/step/ready.py)
        if trainer.rank == 0:
            ready.clear(trainer.run_dir, workers)
        log.info(f"precompile: every rank is ready (waited {waited:.1f} s for this node's others)")
    return report


def _wait_limit_s() -> float:
    """How long a compiled rank waits for its node's others: the collective timeout the plan gives a step on
    Ascend (``HCCL_EXEC_TIMEOUT``, porting/train/plan/comm.py ``hccl_env``), at least its floor of 1836 s."""
    try:
        return max(float(HCCL_EXEC_FLOOR_S), float(os.environ.get("HCCL_EXEC_TIMEOUT", "0")))
    except ValueError:
        return float(HCCL_EXEC_FLOOR_S)
