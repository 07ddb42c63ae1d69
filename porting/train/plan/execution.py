"""The plan's word on how the step runs (recipe key ``execution``); the run side is porting/train/run/step/execution.py."""

from __future__ import annotations

import os
import stat
from typing import Mapping

from model_zoo.errors import PortingError
from porting.train.recipe.schema import Recipe

GRAPH, PYNATIVE = "graph", "pynative"
SHARED_CACHE_ENV = "PORT_COMPILE_CACHE_SHARED"   # porting/train/run/step/shared_cache.py


def describe(recipe: Recipe) -> str:
    """The plan's line: which mode runs and why."""
    if recipe.execution == PYNATIVE:
        return ("pynative (recipe: execution=pynative): the step cells run op by op, nothing is compiled; same "
                "step semantics as graph mode, slower per step on the CPU (BENCHMARKS.md)")
    return ("graph (the default): one compiled graph per input shape holds forward, backward, all-reduce, clip and "
            "AdamW; if the compile fails, --set execution=pynative runs the same step without it")


class GraphCompileError(PortingError):
    """The graph-mode step failed to compile or to run its first step of a shape, or cannot start (MindSpore's
    process-wide compile cache is on)."""

    exit_code = 1


def compile_cache_problem(recipe: Recipe, environ: Mapping[str, str], context_on: bool = False) -> str:
    """Why a graph-mode run must not start with MindSpore's compile cache on process-wide
    (``MS_COMPILER_CACHE_ENABLE``, or ``set_context(enable_compile_cache=True)``: ``context_on``), or "".
    MindSpore names cached graphs by compile order and checks only its Python sources, so a changed recipe
    constant (a clip norm, a group) loads a stale graph (measured on 2.10); port turns the cache on itself
    for the compiles before step 1, in a folder keyed by the recipe (porting/train/run/step/precompile.py)."""
    shared = shared_cache_problem(environ)
    if shared:
        return shared
    value = environ.get("MS_COMPILER_CACHE_ENABLE", "")
    if recipe.execution != GRAPH or not (context_on or value.strip() not in ("", "0")):
        return ""
    where = "set_context(enable_compile_cache=True)" if context_on else f"MS_COMPILER_CACHE_ENABLE={value}"
    return (f"{where}: a process-wide MindSpore compile cache matches graphs by compile order only and loads a "
            "stale one when a recipe value changes; unset it: port keeps its own compile cache per recipe "
            "under RUN/compile_cache (docs/training.md)")


def shared_cache_problem(environ: Mapping[str, str]) -> str:
    """Why ``PORT_COMPILE_CACHE_SHARED`` cannot be used as set, or "": it must name a folder (or a path where one
    can be made). One naming a file, a FIFO or a path the system cannot stat was ignored silently before; a
    user who set it expects graphs to be shared."""
    root = environ.get(SHARED_CACHE_ENV, "").strip()
    if not root:
        return ""
    shown = root if len(root) <= 120 else root[:60] + f"...({len(root):,} characters)"
    try:
        mode = os.stat(root).st_mode
    except FileNotFoundError:
        return ""   # made by the first run that publishes
    except (OSError, ValueError) as e:
        return f"{SHARED_CACHE_ENV}={shown}: {getattr(e, 'strerror', None) or e}; set it to a folder or unset it"
    if not stat.S_ISDIR(mode):
        return (f"{SHARED_CACHE_ENV}={shown}: not a folder (a file or something else is there); set it to a "
                "folder where runs may share their compiled graphs, or unset it")
    return ""
