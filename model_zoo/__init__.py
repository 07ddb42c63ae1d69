"""Model definitions (MindSpore cells) and named sizes of the Llama family.

    from model_zoo import build, presets, LlamaConfig
    model = build(presets.config("stories260k"))
"""

from model_zoo import presets
from model_zoo.config import LlamaConfig
from model_zoo.errors import PortingError
from model_zoo.kernels import KernelPlan, select_kernels
from model_zoo.llama import LlamaForCausalLM, build

__all__ = ["LlamaConfig", "LlamaForCausalLM", "KernelPlan", "PortingError", "build", "presets", "select_kernels"]
