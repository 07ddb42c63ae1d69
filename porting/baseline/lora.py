"""The PEFT side of a LoRA baseline: HF ``peft`` over the HF model, started from the run's initial adapter.

The initial adapter is porting/train/recipe/adapter.py's (``lora.init_from``, or the one NumPy draw keyed by
PEFT's names that `port train` makes too), written as a PEFT adapter folder and loaded from there by
``PeftModel.from_pretrained(..., is_trainable=True)``, so PEFT builds its LoRA layers from the file's
``adapter_config.json`` as it would for a CUDA job's adapter. Its weights' sha256 goes into the baseline's
settings (``settings.adapter.init_sha256``), which `port compare` holds equal to the run's
``RUN/adapter_init``. ``peft`` trains the adapters (the base frozen, ``requires_grad`` False) with the loop of
porting/baseline/torch_loop.py, unchanged: its AdamW takes the parameters that require a gradient.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from model_zoo.config import LlamaConfig
from model_zoo.errors import ConfigError
from porting.env import require_torch

if TYPE_CHECKING:   # hints only
    from porting.train.recipe.schema import Recipe


def require_peft() -> None:
    try:
        import peft  # noqa: F401  (only its presence is checked here)
    except ImportError:
        raise ConfigError("a LoRA baseline trains the adapter with HF peft, which is not installed; "
                          "pip install 'port[lora]' (peft>=0.21)") from None


def peft_model(model, recipe: Recipe, hf_dir: Path):
    """(PeftModel over ``model`` holding the run's initial adapter, sha256 of that adapter's weights)."""
    require_torch("port baseline")
    require_peft()
    from peft import PeftModel

    from converters.loading import trained_base_values
    from porting.train.recipe import adapter

    cfg = LlamaConfig.from_hf(hf_dir)
    found, tensors = adapter.initial_adapter(recipe, cfg)
    with tempfile.TemporaryDirectory(prefix="port-baseline-adapter-") as tmp:
        sha = adapter.write_initial(Path(tmp), recipe, found, tensors,
                                    trained_base_values(hf_dir, cfg, found, tensors))
        pm = PeftModel.from_pretrained(model, tmp, is_trainable=True)
    return pm, sha


def save_adapter(model, out: Path) -> Path:
    """The trained adapter as PEFT saves it (``save_pretrained``), into the new directory ``out``."""
    from converters.atomic import check_out, staged_dir

    check_out(out, kind="dir", what="a PEFT adapter folder", error=ConfigError)
    with staged_dir(Path(out), force=False) as tmp:
        model.save_pretrained(str(tmp))
    return Path(out)
