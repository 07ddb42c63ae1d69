"""The plan's word on how the step runs (recipe key ``execution``); the run side is porting/train/run/execution.py."""

from __future__ import annotations

from porting.train.recipe.schema import Recipe

GRAPH, PYNATIVE = "graph", "pynative"


def describe(recipe: Recipe) -> str:
    """The plan's line: which mode runs and why."""
    if recipe.execution == PYNATIVE:
        return ("pynative (recipe: execution=pynative): the step cells run op by op, nothing is compiled; same "
                "step semantics as graph mode, slower per step on the CPU (BENCHMARKS.md)")
    return ("graph (the default): one compiled graph per input shape holds forward, backward, all-reduce, clip and "
            "AdamW; if the compile fails, --set execution=pynative runs the same step without it")
