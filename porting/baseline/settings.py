"""The settings a baseline and a run are compared on, derived the same way on both sides from the
resolved recipe (``port train``'s schema, as a plain dict: the manifest's "recipe"), the data hash
and the model's config.json. One function, so the two sides cannot drift apart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from model_zoo.errors import ConfigError

# (param_dtype, compute_dtype) of the recipe -> the precision name both sides record.
PRECISIONS: dict[tuple[str, str], str] = {
    ("float32", "float32"): "float32",
    ("float32", "bfloat16"): "bf16-mixed",   # fp32 master weights and AdamW states, bf16 compute
    ("bfloat16", "bfloat16"): "bfloat16",    # bf16 weights
    ("float32", "float16"): "fp16-mixed",
    ("float16", "float16"): "float16",
}


def precision(recipe: dict[str, Any]) -> str:
    p = recipe.get("precision", {})
    key = (p.get("param_dtype", "float32"), p.get("compute_dtype", "float32"))
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


def world_size(recipe: dict[str, Any]) -> int:
    c = recipe.get("cluster", {})
    return int(c.get("nodes", 1)) * int(c.get("devices_per_node", 1))


def from_recipe(recipe: dict[str, Any], data_sha256: str | None, model: dict[str, Any], steps: int) -> dict[str, Any]:
    """The comparable settings of one side (see schema.KEY_SETTINGS / OTHER_SETTINGS)."""
    b, o, s = recipe["batching"], recipe["optimizer"], recipe["schedule"]
    world = world_size(recipe)
    bucketing = b.get("bucketing", {})
    return {
        "global_batch": int(b["micro_batch_size"]) * int(b["grad_accum_steps"]) * world,
        "seq_length": int(recipe["data"]["max_seq_length"]),
        "micro_batch_size": int(b["micro_batch_size"]),
        "grad_accum_steps": int(b["grad_accum_steps"]),
        "world_size": world,
        "dtype": precision(recipe),
        "data_sha256": data_sha256,
        "data_order": {"shuffle": recipe["data"].get("shuffle", True), "bucketing": bucketing,
                       "format": recipe["data"].get("format"), "long_text": recipe["data"].get("long_text")},
        "seed": int(recipe.get("seed", 0)),
        "steps": int(steps),
        **model,
        "lr": float(o["lr"]), "betas": list(o["betas"]), "eps": float(o["eps"]),
        "weight_decay": float(o["weight_decay"]), "grad_clip": o.get("grad_clip"),
        "schedule": dict(s),
        "recompute": bool(recipe.get("memory", {}).get("recompute", False)),
    }
