"""How the training step runs (recipe key ``execution``) and what the installed MindSpore lacks.

- ``graph`` (default): each step cell of :mod:`porting.train.run.step.cells` is compiled once per input shape into
  one graph (forward, backward, all-reduce, clip and AdamW together); on the CPU the fastest way
  (BENCHMARKS.md, "graph vs PyNative").
- ``pynative``: the SAME cells run op by op (MindSpore's PYNATIVE_MODE), nothing is compiled, so a team
  whose graph compile fails on its CANN still trains; accumulation, fp32 masters, ZeRO, tensor parallel,
  packing and resume are the same code. MindSpore Transformers 2.0.0 made PyNative its main path and
  deprecated static-graph training (mindspore.cn/mindformers/docs/en/r2.0.0/RELEASE.html, "Sunset static
  graph mode").

:func:`runtime_fallbacks` lists what an older MindSpore in the supported range lacks and what port uses
instead (the plan prints it); fused-kernel signatures have their own guards (model_zoo/kernels.py).
"""

from __future__ import annotations

import os
from typing import Any

import mindspore as ms

from porting.train.recipe.schema import Recipe

from porting.train.plan.execution import GRAPH, PYNATIVE, GraphCompileError, compile_cache_problem  # noqa: F401
from porting.train.plan.execution import describe  # noqa: F401  (the run logs it)


def set_mode(recipe: Recipe) -> None:
    """MindSpore's execution mode for this process, as the recipe says."""
    ms.set_context(mode=ms.PYNATIVE_MODE if recipe.execution == PYNATIVE else ms.GRAPH_MODE)


def refuse_compile_cache(recipe: Recipe) -> None:
    """Raises GraphCompileError when MindSpore's graph compile cache is on for a graph-mode run
    (porting/train/plan/execution.py says why)."""
    problem = compile_cache_problem(recipe, os.environ, bool(ms.get_context("enable_compile_cache")))
    if problem:
        raise GraphCompileError(problem)


def compile_failure(recipe: Recipe, error: BaseException, shape: Any) -> GraphCompileError | None:
    """The one-line error for a graph-mode step that failed on a new shape, naming the PyNative fallback;
    None in PyNative mode (nothing was compiled: the error is the op's own)."""
    if recipe.execution != GRAPH:
        return None
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    return GraphCompileError(f"graph mode: compiling or running the first step of shape {shape} failed "
                             f"({type(error).__name__}: {first[:300]}); PyNative runs the same step without a "
                             f"graph compile: `port train RECIPE --set execution=pynative` (recipe key execution)")


def runtime_fallbacks(recipe: Recipe, mindspore_module: Any = None) -> list[str]:
    """What the installed MindSpore lacks that this recipe would use, and what runs instead (the run logs it)."""
    mindspore_module = mindspore_module or ms
    out = []
    runtime = getattr(mindspore_module, "runtime", None)
    if recipe.cluster.device == "ascend" and not hasattr(runtime, "set_memory"):
        out.append(f"mindspore {mindspore_module.__version__} has no mindspore.runtime.set_memory: the device "
                   "memory cap is set with set_context(max_device_memory=...), the older API of the same cap")
    return out


def cap_device_memory(size: str, mindspore_module: Any = None) -> str:
    """Caps MindSpore's device memory pool at ``size`` ("58GB"); returns the API that did it."""
    mindspore_module = mindspore_module or ms
    runtime = getattr(mindspore_module, "runtime", None)
    if hasattr(runtime, "set_memory"):
        runtime.set_memory(max_size=size)
        return "mindspore.runtime.set_memory"
    mindspore_module.set_context(max_device_memory=size)
    return "mindspore.set_context(max_device_memory)"
