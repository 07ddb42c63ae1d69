"""A LoRA run's checkpoint (its adapters, porting/train/run/lora.py) as what people load, without MindSpore:

- :func:`export_adapter`: a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, PEFT's
  key names, converters/peft_adapter.py) that ``PeftModel.from_pretrained`` loads over the HF base with nothing
  missing or unexpected; float32, from the fp32 masters when the run keeps them (bf16/fp16 parameters), as PEFT
  keeps its adapters in float32 (``autocast_adapter_dtype``);
- :func:`merge_into_base`: the merged full HF checkpoint, PEFT's ``merge_and_unload``: every adapted weight
  ``W + (B @ A) * scaling`` (huggingface/peft ``lora/layer.py`` ``Linear.get_delta_weight``, in float32, then
  rounded to the base tensor's dtype), the modules_to_save and trained biases replaced, every other tensor
  copied byte for byte from the base, in the base's own files (names, dtypes, shards and index kept), with
  config.json, the tokenizer files and ``port_manifest.json``.

Both read the checkpoint through porting/train/run/checkpoint/read.py (any layout: DP, TP, ZeRO). The base is a
directory the caller names (`port ckpt merge --model`, the run's ``model.source``): a path in the checkpoint's
record (``identity.lora_base``) is shown in a message, never followed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from converters import dtypes, lora_names, peft_adapter
from converters.atomic import check_free_space, staged_dir
from converters.safetensors_io import OutTensor, encode_header, read_header, write_all
from converters.sources import MANIFEST, open_hf
from model_zoo.config import LlamaConfig
from model_zoo.errors import CheckpointError
from porting.train.recipe import adapter
from porting.train.recipe.schema import Recipe, validate_recipe
from porting.train.run.checkpoint.read import open_checkpoint

Log = Callable[[str], None] | None
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
          "special_tokens_map.json")


def lora_recipe(ckdir: Path):
    """The recipe of a LoRA run's checkpoint (from its layout record; layout keys at their defaults), or None."""
    src, ident = open_checkpoint(Path(ckdir))
    src.files.close()
    rec = ident.get("recipe") if isinstance(ident.get("recipe"), dict) else {}
    if not rec.get("lora"):
        return None
    return validate_recipe({**rec, "model": {"source": "unused"}}, f"{ckdir}/layout.json: identity.recipe",
                           check_files=False)


def base_hint(ckdir: Path) -> str:
    """Where the run's base was, as its record says (shown, not followed)."""
    src, ident = open_checkpoint(Path(ckdir))
    src.files.close()
    base = ident.get("lora_base")
    return f" (the run trained over {str(base)[:200]!r})" if isinstance(base, str) else ""


def identity_of_config(cfg: LlamaConfig) -> str:
    """The checkpoint record's ``model_config_sha256`` of a model (porting/train/run/checkpoint/format.py)."""
    return hashlib.sha256(json.dumps(cfg.to_hf(), sort_keys=True).encode()).hexdigest()


def _values(ckdir: Path, recipe: Recipe, cfg: LlamaConfig) -> tuple[lora_names.Targets, dict[str, np.ndarray]]:
    """(targets, PEFT key -> full float32 array) of the checkpoint's adapter (masters when it keeps them)."""
    found = adapter.targets(recipe, cfg)
    src, ident = open_checkpoint(Path(ckdir))
    try:
        if ident.get("model_config_sha256") != identity_of_config(cfg):
            raise CheckpointError(f"{ckdir}: was trained over another model (its config.json differs from the "
                                  f"base's){base_hint(ckdir)}; pass the base this run trained over")
        kind = "master" if src.layout.masters else "param"
        names = {p.name for p in src.layout.params}
        keys = found.keys()
        missing = sorted(z for z in keys.values() if z not in names)
        if missing:
            raise CheckpointError(f"{ckdir}: holds no {missing[:3]}; not a checkpoint of this LoRA run")
        return found, {k: src.full(kind, z) for k, z in keys.items()}
    finally:
        src.files.close()


def export_adapter(ckdir: Path, base: Path, out: Path, force: bool = False, log: Log = None) -> Path:
    """Write the PEFT adapter folder of ``ckdir`` (a LoRA checkpoint over the HF model ``base``) to ``out``."""
    recipe = lora_recipe(ckdir)
    if recipe is None:
        raise CheckpointError(f"{ckdir}: not a LoRA run's checkpoint (its recipe has no lora section)")
    cfg = LlamaConfig.from_hf(Path(base))
    found, tensors = _values(ckdir, recipe, cfg)
    conf = adapter.adapter_config(recipe)
    with staged_dir(Path(out), force) as tmp:
        peft_adapter.write_adapter(tmp, conf, found, tensors)
        (tmp / "README.md").write_text(f"PEFT LoRA adapter written by `port` from {Path(ckdir).name}: r {conf.r}, "
                                       f"lora_alpha {conf.alpha:g}, {len(found.adapted)} adapted layers.\n")
    if log is not None:
        log(f"PEFT adapter {out}: {len(tensors)} tensors from {ckdir}")
    return Path(out)


def _merged(recipe: Recipe, cfg: LlamaConfig, found: lora_names.Targets, tensors: dict[str, np.ndarray]) -> dict:
    """HF tensor name -> its merged float32 value, for every tensor the adapter changes."""
    table = lora_names.ModuleTable.of(cfg)
    hf_of = {z: h for h, z in table.params.items()}
    scaling = adapter.spec(recipe).scaling
    pre = lora_names.PEFT_PREFIX
    out: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
    for hf in found.adapted:
        a, b = tensors[f"{pre}{hf}.lora_A.weight"], tensors[f"{pre}{hf}.lora_B.weight"]
        out[f"{hf}.weight"] = (lambda w, a=a, b=b: w + (b @ a) * np.float32(scaling))
    for key, zoo in found.trainable.items():
        out[hf_of[zoo]] = (lambda w, v=tensors[key]: v)
    return out


def merge_into_base(ckdir: Path, base: Path, out: Path, force: bool = False, log: Log = None,
                    command: list[str] | None = None) -> Path:
    """Write the merged HF checkpoint of ``ckdir`` over the HF model ``base`` to ``out``."""
    recipe = lora_recipe(ckdir)
    if recipe is None:
        raise CheckpointError(f"{ckdir}: not a LoRA run's checkpoint (its recipe has no lora section)")
    base = Path(base)
    cfg = LlamaConfig.from_hf(base)
    src = open_hf(base)
    if src.kind != "safetensors":
        raise CheckpointError(f"{base}: the base is in .bin files; the merge copies safetensors tensors byte for byte: "
                              "re-save the base with transformers' save_pretrained (safetensors is its default)")
    found, tensors = _values(ckdir, recipe, cfg)
    change = _merged(recipe, cfg, found, tensors)
    check_free_space(Path(out), src.total_bytes)
    done = set()
    with staged_dir(Path(out), force) as tmp:
        for f in src.files:
            done |= _merge_file(f.path, tmp / f.path.name, change)
        for name in COPIED + ((src.index_name,) if src.index_name else ()):
            if (base / name).is_file() and not (base / name).is_symlink():
                shutil.copyfile(base / name, tmp / name)
        (tmp / MANIFEST).write_text(json.dumps({"format": "port-lora-merge", "checkpoint": str(ckdir),
                                                "base": str(base), "changed": sorted(done),
                                                "command": list(command or [])}, indent=1) + "\n")
    left = sorted(set(change) - done)
    if left:   # the staged output was renamed whole: a name the base lacks is a mismatched base
        shutil.rmtree(out, ignore_errors=True)
        raise CheckpointError(f"{base}: has no tensor {left[:3]}; not the base this adapter was trained over")
    if log is not None:
        log(f"merged HF checkpoint {out}: {len(done)} tensors changed by the adapter, the rest copied from {base}")
    return Path(out)


def _merge_file(path: Path, dst: Path, change: dict) -> set[str]:
    """One base safetensors file with the changed tensors merged, the rest copied; the names it changed."""
    head = read_header(path)
    done = set()
    with open(path, "rb") as f_in, open(dst, "wb") as f_out:
        write_all(f_out, encode_header([OutTensor(t.name, t.dtype, t.shape) for t in head.tensors], head.metadata))
        for t in head.tensors:
            f_in.seek(t.begin)
            raw = f_in.read(t.nbytes)
            if t.name in change:
                w = dtypes.to_numpy_f32(t.dtype, raw, t.shape)
                new = np.ascontiguousarray(change[t.name](w), np.float32)
                if new.shape != tuple(t.shape):
                    raise CheckpointError(f"{path}: tensor {t.name} has shape {list(t.shape)}, the adapter's is "
                                          f"{list(new.shape)}; not the base this adapter was trained over")
                raw = bytes(dtypes.cast_bytes("F32", t.dtype, memoryview(new).cast("B")))
                done.add(t.name)
            write_all(f_out, raw)
        f_out.flush()
        os.fsync(f_out.fileno())
    return done


def export_final(recipe: Recipe, final: Path, model_dir: Path, run_dir: Path, log, command: list[str] | None = None) -> None:
    """After a LoRA run's last checkpoint: ``RUN/adapter`` (PEFT) always, the merged ``RUN/hf`` when the recipe
    exports HF (checkpointing.export_hf); both from ``final`` over the base ``model_dir``."""
    out = export_adapter(final, model_dir, run_dir / adapter.ADAPTER_DIR, force=True)
    log(f"LoRA adapter {out} (PEFT format: PeftModel.from_pretrained(base, '{out}'))")
    if recipe.checkpointing.export_hf:
        hf = merge_into_base(final, model_dir, run_dir / "hf", force=True, command=command)
        log(f"HF export {hf}: the base with the adapter merged (from {final})")
