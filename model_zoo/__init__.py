"""Model definitions (MindSpore cells) and named sizes of the Llama family.

    from model_zoo import build, presets, LlamaConfig
    model = build(presets.config("stories260k"))

The MindSpore cells are imported on first use (PEP 562), so code that only needs configs, presets or
errors (the CLI's start-up, `port convert`) does not pay for importing MindSpore (~1 s, ~0.5 GiB RSS).
"""

from __future__ import annotations

import importlib

from model_zoo import presets
from model_zoo.config import LlamaConfig
from model_zoo.errors import PortingError

_LAZY = {"KernelSelection": "model_zoo.kernels", "select_kernels": "model_zoo.kernels",
         "LlamaForCausalLM": "model_zoo.llama", "build": "model_zoo.llama"}

__all__ = ["LlamaConfig", "LlamaForCausalLM", "KernelSelection", "PortingError", "build", "presets", "select_kernels"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'model_zoo' has no attribute {name!r}")
