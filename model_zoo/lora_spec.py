"""The numbers of a LoRA adapter and its initial draw, without MindSpore (the plan, the recipe, the PEFT reader
and the PyTorch baseline use them; the cells are model_zoo/lora.py). Sources: model_zoo/lora.py's docstring."""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from model_zoo.errors import ConfigError

MAX_RANK = 4096            # far past any published adapter (PEFT's examples: 4 to 256)


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """The numbers of one LoRA adapter (PEFT ``LoraConfig``'s ``r``, ``lora_alpha``, ``lora_dropout``,
    ``use_rslora``)."""

    r: int
    alpha: float
    dropout: float = 0.0
    use_rslora: bool = False

    def __post_init__(self):
        if isinstance(self.r, bool) or not isinstance(self.r, int) or not 1 <= self.r <= MAX_RANK:
            raise ConfigError(f"LoRA r {self.r!r}: expected an integer in [1, {MAX_RANK}]")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ConfigError(f"LoRA alpha {self.alpha!r}: expected a finite number > 0")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ConfigError(f"LoRA dropout {self.dropout!r}: expected a number in [0, 1)")

    @property
    def scaling(self) -> float:
        """PEFT ``update_layer``: lora_alpha / sqrt(r) with use_rslora, else lora_alpha / r."""
        return self.alpha / math.sqrt(self.r) if self.use_rslora else self.alpha / self.r


def kaiming_bound(in_features: int) -> float:
    """PEFT's ``nn.init.kaiming_uniform_(lora_A.weight, a=math.sqrt(5))`` bound: 1 / sqrt(fan_in)."""
    gain = math.sqrt(2.0 / (1.0 + 5.0))
    return gain * math.sqrt(3.0 / in_features)


def draw_initial(shapes: Mapping[str, tuple[int, int]], seed: int) -> dict[str, np.ndarray]:
    """The initial adapter of a run, drawn once in float32 by NumPy (the same numbers on every machine and
    layout): for each ``lora_A`` name (sorted) U(-b, b) with PEFT's Kaiming bound over its full input width,
    every ``lora_B`` zeros. ``shapes``: full (unsharded) shape by parameter name."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        if ".lora_A." in name:
            b = kaiming_bound(shape[1])
            out[name] = rng.uniform(-b, b, size=shape).astype(np.float32)
        else:
            out[name] = np.zeros(shape, np.float32)
    return out
