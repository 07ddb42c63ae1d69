"""A recipe's LoRA adapter without MindSpore: its PEFT config, the layers it reaches in a model, and the
initial adapter every side of a run starts from (`port train`'s ranks, `port baseline run`'s PEFT model).

The initial adapter is ``lora.init_from`` (a PEFT adapter folder, converters/peft_adapter.py: its config must
agree with the recipe's section) or, without it, one NumPy draw keyed by PEFT's names
(model_zoo/lora_spec.py ``draw_initial``: ``lora_A`` U(-1/sqrt(in), 1/sqrt(in)) as PEFT's Kaiming init,
``lora_B`` zeros, from the recipe's seed). Both sides write what they start from as a PEFT adapter folder
(`port train`: ``RUN/adapter_init/``; `port baseline run`: beside its file) and record its sha256, and
`port compare` refuses two runs whose initial adapters differ: the two frameworks never draw on their own.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from converters import lora_names, peft_adapter
from converters.peft_adapter import AdapterConfig
from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from model_zoo.lora_spec import LoraSpec, draw_initial
from porting.train.recipe.schema import Recipe

INIT_DIR = "adapter_init"      # RUN/adapter_init: the adapter a LoRA run started from
ADAPTER_DIR = "adapter"        # RUN/adapter: the trained adapter (PEFT format)


def adapter_config(recipe: Recipe) -> AdapterConfig:
    """The recipe's ``lora`` section as a PEFT adapter config."""
    lo = recipe.lora
    targets = lo.target_modules if isinstance(lo.target_modules, str) else tuple(lo.target_modules)
    return AdapterConfig(lo.r, float(lo.alpha), float(lo.dropout), lo.use_rslora, targets,
                         tuple(lo.modules_to_save), lo.bias, recipe.model.source)


def spec(recipe: Recipe) -> LoraSpec:
    lo = recipe.lora
    return LoraSpec(lo.r, float(lo.alpha), float(lo.dropout), lo.use_rslora)


def targets(recipe: Recipe, cfg: LlamaConfig) -> lora_names.Targets:
    """The layers the recipe adapts in ``cfg``'s model and the parameters it trains (RecipeError naming the key)."""
    lo = recipe.lora
    try:
        return lora_names.resolve(cfg, lo.target_modules, tuple(lo.modules_to_save), lo.bias)
    except RecipeError:
        raise
    except Exception as e:   # ConfigError from the names: the recipe's key is in its words
        raise RecipeError(str(e)) from None


def _agrees(recipe: Recipe, cfg: LlamaConfig, conf: AdapterConfig, found: lora_names.Targets, where: str) -> None:
    """lora.init_from's config must be the recipe's: same numbers, same layers, same trained parameters."""
    mine = adapter_config(recipe)
    diffs = [f"{k} {getattr(conf, k)!r} (the recipe: {getattr(mine, k)!r})"
             for k in ("r", "alpha", "use_rslora", "bias") if getattr(conf, k) != getattr(mine, k)]
    ours = targets(recipe, cfg)
    if set(found.adapted) != set(ours.adapted):
        diffs.append(f"target_modules reach {len(found.adapted)} layers (the recipe's: {len(ours.adapted)})")
    if set(found.trainable) != set(ours.trainable):
        diffs.append("modules_to_save / bias train other parameters")
    if diffs:
        raise RecipeError(f"lora.init_from {where}: its adapter_config.json differs from the recipe's lora section: "
                          f"{'; '.join(diffs)}; write the section from it (port recipe import) or drop init_from")


def initial_adapter(recipe: Recipe, cfg: LlamaConfig) -> tuple[lora_names.Targets, dict[str, np.ndarray]]:
    """(targets, PEFT key -> full float32 array) the run starts from: lora.init_from's tensors, or the draw
    (adapters only: modules_to_save and biases start from the base model's own values)."""
    lo = recipe.lora
    if lo.init_from:   # its config agrees with the recipe before a weight is read
        conf = peft_adapter.read_config(Path(lo.init_from))
        found = lora_names.resolve(cfg, conf.target_modules, conf.modules_to_save, conf.bias)
        _agrees(recipe, cfg, conf, found, lo.init_from)
        _, found, tensors = peft_adapter.read_adapter(Path(lo.init_from), cfg)
        return found, tensors
    t = targets(recipe, cfg)
    shapes = peft_adapter.expected_shapes(cfg, t, lo.r)
    return t, draw_initial({k: shapes[k] for k in t.adapter_keys()}, recipe.seed)


def write_initial(folder: Path, recipe: Recipe, found: lora_names.Targets, tensors: dict[str, np.ndarray],
                  base: dict[str, np.ndarray]) -> str:
    """The initial adapter as a complete PEFT folder in ``folder`` (``base``: the modules_to_save and bias values
    the adapter does not hold, read from the base model as PEFT copies them: converters/loading.py
    ``trained_base_values``); returns the sha256 of its weights file."""
    full = {**base, **tensors}
    peft_adapter.write_adapter(folder, adapter_config(recipe), found, {k: full[k] for k in found.keys()})
    return weights_sha256(folder)


def weights_sha256(folder: Path) -> str:
    h = hashlib.sha256()
    with open(Path(folder) / peft_adapter.WEIGHTS_FILE, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()
