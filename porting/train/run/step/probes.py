"""Test probes a training process installs when their ``PORT_TEST_*`` hook is on (porting/train/run/faults.py;
docs/test-hooks.md), before it builds anything: :func:`install` is the first thing
:func:`porting.train.run.step.runtime.configure_mindspore` does. Off, nothing is installed and nothing is patched.

- ``PORT_TEST_REFUSE_STATIC_PARALLEL``: MindSpore retires static-graph distributed parallel after 2.11
  (docs/versions.md). The probe replaces that family of API with versions that raise when code outside MindSpore's
  own package calls them: every ``<verb>_auto_parallel_context`` function but the getter on ``mindspore`` and
  ``mindspore.context`` (setting or resetting it), every ``...GradReducer`` cell of ``mindspore.nn`` (the
  data-parallel and pipeline gradient reducers), and ``mindspore.parallel.auto_parallel.AutoParallel``. MindSpore's
  own calls go through (its internals may use them), so the suite shows that port and the model zoo never do.
  The getter is left alone: MindSpore reads the context everywhere, and reading it needs nothing retired.
- ``PORT_TEST_COLLECTIVE_TRACE=DIR``: every collective launched from Python (``ops.AllReduce``,
  ``ops.ReduceScatter``, ``ops.AllGather`` called op by op, and ``mindspore.mint.distributed``'s all_reduce,
  reduce_scatter_tensor and all_gather_into_tensor) is appended to ``DIR/rank_<r>.jsonl`` as one line
  ``{"op", "shape", "group"}``. In PyNative each call is one launch, so the file is the rank's collective trace,
  in launch order; in graph mode a primitive is called once while its graph is built (the compiled graph's IR is
  the trace there, tests/train/test_comm_fusion.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import importlib
from pathlib import Path

import mindspore
from mindspore import ops
from mindspore.mint import distributed

from model_zoo.errors import PortingError
from porting.train.run.faults import Faults

_CONTEXT_CALL = re.compile(r"^(?!get_)[a-z]+_auto_parallel_context$")   # set_/reset_, never the getter
_REDUCER = re.compile(r"GradReducer$")


class StaticParallelCalled(PortingError):
    """Code outside MindSpore called the static-graph parallel API while PORT_TEST_REFUSE_STATIC_PARALLEL is on."""


def install(faults: Faults, rank: int | None) -> None:
    """Installs the probes ``faults`` turns on (none when every hook is off); the trace once ``rank`` is known."""
    if faults.refuse_static_parallel:
        refuse_static_parallel()
    if faults.collective_trace and rank is not None:
        trace_collectives(Path(faults.collective_trace) / f"rank_{rank}.jsonl")


def installed() -> str:
    """The rank log's words for the probes in place in this process ("" when none)."""
    refused = any(getattr(getattr(mindspore.context, n), "port_refused", False) for n in dir(mindspore.context)
                  if _CONTEXT_CALL.match(n))
    return "; test probe: static-graph parallel API refused (PORT_TEST_REFUSE_STATIC_PARALLEL)" if refused else ""


def _outside_mindspore(depth: int = 2) -> bool:
    caller = sys._getframe(depth).f_code.co_filename
    return not os.path.abspath(caller).startswith(os.path.dirname(os.path.abspath(mindspore.__file__)) + os.sep)


def _refusing(name: str, original):
    @functools.wraps(original)
    def refused(*args, **kwargs):
        if _outside_mindspore():
            raise StaticParallelCalled(f"{name} was called: MindSpore retires static-graph distributed parallel after "
                                       "2.11 and port must run without it (PORT_TEST_REFUSE_STATIC_PARALLEL is on; "
                                       "docs/versions.md)")
        return original(*args, **kwargs)
    refused.port_refused = True
    return refused


def _refusing_class(name: str, cls: type) -> type:
    def __init__(self, *args, **kwargs):
        if _outside_mindspore():
            raise StaticParallelCalled(f"{name} was built: MindSpore retires static-graph distributed parallel "
                                       "after 2.11 and port must run without it (PORT_TEST_REFUSE_STATIC_PARALLEL "
                                       "is on; docs/versions.md)")
        cls.__init__(self, *args, **kwargs)
    return type(cls.__name__, (cls,), {"__init__": __init__, "port_refused": True})


def refuse_static_parallel() -> list[str]:
    """Patches the static-graph parallel API (module docstring); returns what it patched, ``module.name``."""
    done = []
    for mod in (mindspore, mindspore.context):
        for name in filter(_CONTEXT_CALL.match, dir(mod)):
            fn = getattr(mod, name)
            if callable(fn) and not getattr(fn, "port_refused", False):
                setattr(mod, name, _refusing(f"mindspore.{name}", fn))
                done.append(f"{mod.__name__}.{name}")
    for path, pattern in (("mindspore.nn", _REDUCER), ("mindspore.nn.wrap", _REDUCER),
                          ("mindspore.nn.wrap.grad_reducer", _REDUCER),
                          ("mindspore.parallel.auto_parallel", re.compile(r"^AutoParallel$"))):
        try:
            mod = importlib.import_module(path)
        except ImportError:   # an older MindSpore without it: nothing to refuse there
            continue
        for name in filter(pattern.search, dir(mod)):
            cls = getattr(mod, name)
            if isinstance(cls, type) and not getattr(cls, "port_refused", False):
                setattr(mod, name, _refusing_class(f"{path}.{name}", cls))
                done.append(f"{path}.{name}")
    return done


_PRIMITIVES = ("AllReduce", "ReduceScatter", "AllGather")
_FUNCTIONS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


def trace_collectives(path: Path) -> None:
    """Appends one line per collective launched from Python to ``path`` (module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = open(path, "a", buffering=1)   # one line at a time: a rank that dies keeps what it launched

    def record(op: str, tensor, group) -> None:
        shape = list(getattr(tensor, "shape", ()))
        out.write(json.dumps({"op": op, "shape": shape, "group": str(group)}) + "\n")

    for name in _PRIMITIVES:
        cls = getattr(ops, name)
        call = cls.__call__
        if getattr(call, "port_traced", False):
            continue

        def traced(self, *args, _call=call, _name=name, **kwargs):
            record(_name, args[0] if args else None, getattr(self, "group", None))
            return _call(self, *args, **kwargs)
        traced.port_traced = True
        cls.__call__ = traced
    for name in _FUNCTIONS:
        fn = getattr(distributed, name)
        if getattr(fn, "port_traced", False):
            continue

        def traced_fn(*args, _fn=fn, _name=name, **kwargs):
            tensor = args[1] if _name != "all_reduce" and len(args) > 1 else (args[0] if args else None)
            record(_name, tensor, kwargs.get("group"))
            return _fn(*args, **kwargs)
        traced_fn.port_traced = True
        setattr(distributed, name, traced_fn)
