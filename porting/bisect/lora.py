"""`port bisect --baseline` on a LoRA run's step: both sides hold the run's adapters over the same frozen base.

The zoo side is the run's own model (porting/train/run/lora.py ``attach``: the base from the HF directory, the
adapters from ``RUN/adapter_init`` for step 1 or from the checkpoint after step k-1, which holds the trainable
parameters and their AdamW moments only). The reference side is HF ``peft``'s LoRA layers over the HF model
(``get_peft_model`` with the recipe's config, the adapters copied from the zoo side), tapped like a plain HF
model: its LoRA ``Linear`` sits at the module path of the layer it adapts, and its output is the adapted one.
Parameter gradients and updates exist for the trainable parameters only; their names go through PEFT's keys
(converters/lora_names.py ``Targets.keys``) to the zoo's. Neither side computes the gradient of an activation with
no trainable parameter before it (the frozen layers below the first adapter): those rows say so (:data:`FROZEN`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from converters import lora_names, names
from model_zoo.errors import CheckpointError

if TYPE_CHECKING:   # hints only
    from porting.train.recipe.schema import Recipe


def key_of(hf_param: str) -> str:
    """The PEFT adapter-file key of a parameter of PEFT's LoRA model (``...q_proj.lora_A.default.weight``)."""
    return lora_names.PEFT_PREFIX + hf_param.replace(".modules_to_save.default.", ".").replace(".default.", ".")


def name_of(targets: lora_names.Targets, table: dict) -> Callable[[str], str]:
    """HF (PEFT) parameter name -> zoo name: adapters and trained parameters by PEFT's keys, the rest by the map."""
    keys = targets.keys()
    return lambda n: keys.get(key_of(n)) or names.map_name(n, table)


def zoo_model(recipe: Recipe, cfg, hf_dir: Path, run_path: Path, k: int):
    """The run's LoRA model entering step k (for k = 1 its initial adapter, ``RUN/adapter_init``)."""
    from converters import peft_adapter
    from converters.loading import load_hf_dir
    from model_zoo import lora as zoo_lora
    from porting.train.recipe.adapter import INIT_DIR
    from porting.train.run import lora as run_lora
    from porting.verify.pair import build_zoo

    model = build_zoo(cfg)
    found = run_lora.attach(model, recipe, cfg)
    load_hf_dir(model, hf_dir)
    if k == 1:
        init = run_path / INIT_DIR
        if not (init / peft_adapter.WEIGHTS_FILE).is_file():
            raise CheckpointError(f"{init}: not in the run; replaying step 1 of a LoRA run needs the adapter it "
                                  "started from (port train writes it before step 1)")
        _, _, tensors = peft_adapter.read_adapter(init, cfg)
        keys = found.keys()
        zoo_lora.set_values(model, {keys[k2]: v for k2, v in tensors.items()})
    return model


def hf_model(recipe: Recipe, hf_dir: Path, weights: dict[str, np.ndarray], targets: lora_names.Targets, table: dict):
    """HF transformers' model with PEFT's LoRA layers of the recipe, its trainable parameters the zoo's."""
    import torch
    from peft import LoraConfig, get_peft_model

    from porting.verify.pair import load_reference

    lo = recipe.lora
    conf = LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=list(targets.adapted),
                      use_rslora=lo.use_rslora, modules_to_save=list(lo.modules_to_save) or None, bias=lo.bias,
                      task_type="CAUSAL_LM")
    pm = get_peft_model(load_reference(hf_dir, "float32"), conf)
    model = pm.base_model.model.train()
    zoo = name_of(targets, table)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(torch.from_numpy(weights[zoo(n)]))
    return model


FROZEN = "not computed on either side: no trainable parameter before it (LoRA's frozen base)"
