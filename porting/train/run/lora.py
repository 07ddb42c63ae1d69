"""A LoRA run's model: the adapters attached to the zoo cell before any weight is loaded, the frozen base
always from the HF checkpoint (``model.source``), the adapters from the initial adapter (recipe/adapter.py)
or, on resume, from the checkpoint, which holds the trainable parameters only (porting/train/run/checkpoint/
format.py writes ``model.trainable_params()``): a checkpoint of a LoRA run is its adapters and their AdamW
state, a few MB, never the base again. Resume finds the base where the run found it: the recipe's
``model.source`` (its identity, with the recipe, is in every checkpoint's ``layout.json`` and is checked before
a step runs), and rank 0 records the base's weight files (name, bytes) in ``RUN/adapter_init/base.json``."""

from __future__ import annotations

import json
from pathlib import Path

from converters import lora_names
from converters.loading import trained_base_values
from model_zoo import lora as zoo_lora
from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from porting.train.recipe import adapter
from porting.train.recipe.schema import Recipe


def attach(model, recipe: Recipe, cfg: LlamaConfig) -> lora_names.Targets:
    """The recipe's adapters on ``model`` (built, weights not yet loaded); every other weight frozen."""
    if recipe.lora.dropout > 0 and recipe.data.eval_split > 0:
        raise RecipeError(f"lora.dropout {recipe.lora.dropout:g} with data.eval_split: the held-out loss runs on the "
                          "training graph's cells, which would score with the adapters' dropout on; set lora.dropout "
                          "0 or data.eval_split 0")
    found = adapter.targets(recipe, cfg)
    zoo_lora.apply_lora(model, adapter.spec(recipe), found.adapted.values(), found.trainable.values())
    for layer in zoo_lora.lora_layers(model).values():
        if layer.lora_dropout is not None:   # PEFT trains in model.train(): its nn.Dropout is on
            layer.lora_dropout.set_train(True)
    return found


def start(model, recipe: Recipe, cfg: LlamaConfig, model_dir: Path, run_dir: Path | None, log) -> str | None:
    """Set the initial adapter on ``model`` (the base already loaded); rank 0 (``run_dir`` given) writes it as
    ``RUN/adapter_init/`` (PEFT format) and returns the sha256 of its weights."""
    found, tensors = adapter.initial_adapter(recipe, cfg)
    keys = found.keys()
    zoo_lora.set_values(model, {keys[k]: v for k, v in tensors.items()})
    trained = sum(int(p.size) for p in model.trainable_params())
    frozen = sum(int(p.size) for p in model.get_parameters()) - trained
    log(f"LoRA r {recipe.lora.r} alpha {recipe.lora.alpha:g} (scaling {adapter.spec(recipe).scaling:g}): "
        f"{len(found.adapted)} layers adapted, {trained} trainable parameters ({100 * trained / max(trained + frozen, 1):.3f}%"
        f"), {frozen} frozen; initial adapter "
        f"{'from ' + recipe.lora.init_from if recipe.lora.init_from else f'drawn with seed {recipe.seed}'}")
    if run_dir is None:
        return None
    from converters.atomic import staged_dir  # deferred: the staging rule is only needed by rank 0

    out = run_dir / adapter.INIT_DIR
    with staged_dir(out, force=True) as tmp:
        sha = adapter.write_initial(tmp, recipe, found, tensors, trained_base_values(model_dir, cfg, found, tensors))
        files = sorted(p for p in Path(model_dir).iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
        (tmp / "base.json").write_text(json.dumps({"source": str(model_dir), "files": [
            {"name": p.name, "bytes": p.stat().st_size} for p in files]}, indent=1) + "\n")
    log(f"LoRA initial adapter written to {out} (weights sha256 {sha[:12]})")
    return sha


def check_base(run_dir: Path, model_dir: Path) -> None:
    """On resume: the base's weight files are still the ones the run started on (names and sizes)."""
    rec = run_dir / adapter.INIT_DIR / "base.json"
    if not rec.is_file():
        return
    from model_zoo import files  # deferred: only a resume reads the record

    doc = files.read_json_object(rec, what="LoRA base record", max_bytes=1 << 20, error=RecipeError)
    now = sorted((p.name, p.stat().st_size) for p in Path(model_dir).iterdir()
                 if p.suffix in (".safetensors", ".bin") and p.is_file())
    then = sorted((f.get("name"), f.get("bytes")) for f in doc.get("files", []) if isinstance(f, dict))
    if now != then:
        raise RecipeError(f"{model_dir}: the base model's weight files differ from the ones this LoRA run started on "
                          f"({rec}); the checkpoint holds the adapters only, so resume over the same base "
                          "(model.source)")


def model_from_checkpoint(ckdir: Path, model_dir: Path, dtype: str = "float32"):
    """A LoRA run's model after ``ckdir``: the zoo cell (one device), its frozen base from the HF directory
    ``model_dir`` (the caller's: a path in the checkpoint's record is never followed), the adapters (and
    modules_to_save, biases) from the checkpoint, any layout."""
    from model_zoo.llama import build  # deferred: the cells
    from converters.loading import load_hf_dir  # deferred: the loader
    from porting.train.run.checkpoint.lora_export import lora_recipe  # deferred: the offline readers
    from porting.train.run.checkpoint.read import full_state  # deferred: the checkpoint reader

    recipe = lora_recipe(Path(ckdir))
    if recipe is None:
        raise RecipeError(f"{ckdir}: not a LoRA run's checkpoint (its recipe has no lora section)")
    cfg = LlamaConfig.from_hf(Path(model_dir))
    model = build(cfg, param_dtype=dtype, defer_init=True)
    attach(model, recipe, cfg)
    load_hf_dir(model, model_dir)
    state = full_state(Path(ckdir))
    zoo_lora.set_values(model, {p.name: state[p.name] for p in model.trainable_params()})
    return model
