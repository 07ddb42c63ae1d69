"""The settings a baseline and a run are compared on, derived the same way on both sides from the
resolved recipe (a typed ``Recipe``: the baseline's own, or the run manifest's "recipe" validated by
``port train``'s schema), the data hash and the model's config.json. One function, so the two sides
cannot drift apart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_zoo.errors import ConfigError
from porting.baseline.document import Settings

if TYPE_CHECKING:
    from porting.train.recipe.schema import Recipe

# (param_dtype, compute_dtype) of the recipe -> the precision name both sides record.
PRECISIONS: dict[tuple[str, str], str] = {
    ("float32", "float32"): "float32",
    ("float32", "bfloat16"): "bf16-mixed",   # fp32 master weights and AdamW states, bf16 compute
    ("bfloat16", "bfloat16"): "bfloat16",    # bf16 weights
    ("float32", "float16"): "fp16-mixed",
    ("float16", "float16"): "float16",
}


def precision(recipe: Recipe) -> str:
    key = (recipe.precision.param_dtype, recipe.precision.compute_dtype)
    if key not in PRECISIONS:
        raise ConfigError(f"precision: param_dtype={key[0]} with compute_dtype={key[1]} has no baseline "
                          f"equivalent; use one of {sorted(PRECISIONS)}")
    return PRECISIONS[key]


def model_info(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """Architecture facts of a model directory or config dict: type, parameter count, a hash of its fields."""
    from model_zoo.config import LlamaConfig

    cfg = LlamaConfig.from_hf(source if isinstance(source, dict) else Path(source))
    arch = {k: v for k, v in cfg.to_hf().items() if k not in ("torch_dtype", "dtype", "transformers_version")}
    return {"model_type": cfg.model_type, "num_parameters": int(cfg.num_parameters()),
            "model_config_sha256": hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()}


def adapter_settings(recipe: Recipe, init_sha256: str | None) -> dict[str, Any] | None:
    """A LoRA run's adapter as both sides record it (None: a full fine-tune): the recipe's section less where
    the initial adapter came from, and the sha256 of the initial adapter's weights file."""
    if recipe.lora is None:
        return None
    lo = recipe.lora.model_dump(mode="json", exclude={"init_from", "use_dora", "loraplus_lr_ratio"})
    return {**lo, "init_sha256": init_sha256}


def from_recipe(recipe: Recipe, data_sha256: str | None, model: dict[str, Any], steps: int,
                adapter_init_sha256: str | None = None) -> Settings:
    """The comparable settings of one side (see document.KEY_SETTINGS / OTHER_SETTINGS)."""
    b, o, d = recipe.batching, recipe.optimizer, recipe.data
    return Settings(
        global_batch=recipe.global_batch_size,
        seq_length=d.max_seq_length,
        micro_batch_size=b.micro_batch_size,
        grad_accum_steps=b.grad_accum_steps,
        world_size=recipe.world_size,
        dtype=precision(recipe),
        data_sha256=data_sha256,
        data_order={"shuffle": d.shuffle, "bucketing": b.bucketing.model_dump(mode="json"),
                    "format": d.format, "long_text": d.long_text},
        seed=recipe.seed,
        steps=int(steps),
        model_type=model["model_type"], num_parameters=model["num_parameters"],
        model_config_sha256=model["model_config_sha256"],
        lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
        schedule=recipe.schedule.model_dump(mode="json"),
        recompute=recipe.memory.recompute,
        adapter=adapter_settings(recipe, adapter_init_sha256),
    )
