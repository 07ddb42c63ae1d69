"""HF PEFT LoRA adapter folders: ``adapter_config.json`` + ``adapter_model.safetensors``, written and read.

The format is PEFT's own (huggingface/peft ``PeftModel.save_pretrained`` / ``from_pretrained``, v0.21): the
config is ``LoraConfig``'s fields as JSON, the weights one safetensors file keyed
``base_model.model.<module>.lora_A.weight`` (converters/lora_names.py). What port writes,
``PeftModel.from_pretrained`` loads over the HF base with nothing missing or unexpected; what port reads
(an adapter a CUDA job trained, as the start of a run) is checked before any value is used:

* the config: read bounded (:data:`MAX_CONFIG_BYTES`), every key known to port mapped (``r``, ``lora_alpha``,
  ``lora_dropout``, ``target_modules``, ``use_rslora``, ``modules_to_save``, ``bias``), recorded (paths and
  versions, never followed or run), or accepted only at PEFT's default value (``use_dora: false``, empty
  ``rank_pattern``, ...) and otherwise refused by name with the reason; a key port does not know is accepted
  only when it is switched off (null, false, empty), so a newer PEFT's unused option passes and a used one
  is refused. Nothing in it is ever imported or run (``auto_mapping`` naming classes is refused);
* the weights: the safetensors header validated (converters/safetensors_io.py), exactly the keys the config
  implies for this model (sorted lists of missing and unexpected keys otherwise) with their shapes, each read
  as float32.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from converters import dtypes, lora_names
from converters.safetensors_io import OutTensor, encode_header, read_header, write_all
from model_zoo import files
from model_zoo.config import LlamaConfig
from model_zoo.errors import CheckpointError, ConfigError, one_line
from model_zoo.lora_spec import MAX_RANK

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
MAX_ALPHA = 1e6
MAX_WEIGHTS_BYTES = 64 << 30

# PEFT LoraConfig keys accepted only at their default: key -> (default, why port has no other value)
DEFAULT_ONLY: dict[str, tuple[Any, str]] = {
    "use_dora": (False, "DoRA (weight-decomposed LoRA) is not implemented: its magnitude vector needs the norm of "
                        "W + BA per output row every step, which port's tensor-parallel and ZeRO steps do not compute; "
                        "train plain LoRA (use_dora: false)"),
    "fan_in_fan_out": (False, "fan_in_fan_out is for GPT-2's Conv1D layers; the zoo's layers store (out, in)"),
    "lora_bias": (False, "lora_bias (a bias on lora_B) is not implemented"),
    "layers_to_transform": (None, "adapting chosen layers only is not implemented; list the modules instead"),
    "layers_pattern": (None, "layers_pattern goes with layers_to_transform, which is not implemented"),
    "rank_pattern": ({}, "per-module ranks are not implemented: one r for every adapted layer"),
    "alpha_pattern": ({}, "per-module alphas are not implemented: one lora_alpha for every adapted layer"),
    "exclude_modules": (None, "exclude_modules is not implemented; list the modules to adapt instead"),
    "target_parameters": (None, "target_parameters (LoRA on raw parameters, for MoE experts) is not implemented"),
    "trainable_token_indices": (None, "trainable_token_indices is not implemented; use modules_to_save"),
    "layer_replication": (None, "layer_replication is not implemented"),
    "use_qalora": (False, "QA-LoRA trains over a quantized base; port trains a bf16/fp32 base"),
    "megatron_config": (None, "megatron_config (PEFT over Megatron's layers) is not used: port splits layers itself"),
    "auto_mapping": (None, "auto_mapping names custom Python classes to import; port runs no code from a file"),
    "ensure_weight_tying": (False, "ensure_weight_tying is not implemented"),
}
RECORDED = ("base_model_name_or_path", "revision", "inference_mode", "peft_version", "task_type", "init_lora_weights",
            "megatron_core", "qalora_group_size", "loftq_config")
IMPLEMENTED = ("peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora", "modules_to_save",
               "bias")


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    """What of a PEFT LoraConfig port trains with."""

    r: int
    alpha: float
    dropout: float = 0.0
    use_rslora: bool = False
    target_modules: tuple[str, ...] | str = lora_names.ALL_LINEAR
    modules_to_save: tuple[str, ...] = ()
    bias: str = "none"
    base_model: str | None = None   # recorded only

    def to_peft(self, target_paths: list[str]) -> dict[str, Any]:
        """PEFT's adapter_config.json; ``target_paths``: the adapted HF modules, listed as PEFT's own save does."""
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.r, "lora_alpha": self.alpha,
                "lora_dropout": self.dropout, "target_modules": sorted(target_paths), "use_rslora": self.use_rslora,
                "modules_to_save": list(self.modules_to_save) or None, "bias": self.bias, "fan_in_fan_out": False,
                "init_lora_weights": True, "use_dora": False, "lora_bias": False, "layers_to_transform": None,
                "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}, "inference_mode": True,
                "base_model_name_or_path": self.base_model, "revision": None}


def _neutral(v: Any) -> bool:
    return v is None or v is False or v == {} or v == [] or v == ""


def _bad(where: str, key: str, found: Any, expected: str) -> ConfigError:
    return ConfigError(f"{where}: key '{one_line(key)[:80]}' is {one_line(repr(found))[:80]}, expected {expected}")


def config_from_peft(doc: dict[str, Any], where: str) -> AdapterConfig:
    """An :class:`AdapterConfig` from a parsed adapter_config.json; every key mapped, recorded or refused."""
    for key, value in doc.items():
        if key in IMPLEMENTED or key in RECORDED:
            continue
        if key in DEFAULT_ONLY:
            default, why = DEFAULT_ONLY[key]
            if value != default and not (default is None and _neutral(value)):
                raise ConfigError(f"{where}: {key} {one_line(repr(value))[:60]}: {why}")
        elif not _neutral(value):
            raise ConfigError(f"{where}: key '{one_line(key)[:80]}' is not a LoRA setting port knows and is set "
                              f"({one_line(repr(value))[:60]}); port refuses what it cannot reproduce")
    if doc.get("peft_type") != "LORA":
        raise _bad(where, "peft_type", doc.get("peft_type"), "\"LORA\" (port trains LoRA adapters)")
    r = doc.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_RANK:
        raise _bad(where, "r", r, f"an integer in [1, {MAX_RANK}]")
    alpha = doc.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0 < alpha <= MAX_ALPHA):
        raise _bad(where, "lora_alpha", alpha, f"a number in (0, {MAX_ALPHA:g}]")
    dropout = doc.get("lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise _bad(where, "lora_dropout", dropout, "a number in [0, 1)")
    rs = doc.get("use_rslora", False)
    if not isinstance(rs, bool):
        raise _bad(where, "use_rslora", rs, "true or false")
    bias = doc.get("bias", "none")
    if bias not in lora_names.BIASES:
        raise _bad(where, "bias", bias, "none, all or lora_only")
    targets = doc.get("target_modules")
    if not (isinstance(targets, str) and targets.lower() == lora_names.ALL_LINEAR):
        targets = _names(where, "target_modules", targets)
        lora_names.check_plain(targets, f"{where}: target_modules")
    saved = _names(where, "modules_to_save", doc.get("modules_to_save") or [])
    lora_names.check_plain(saved, f"{where}: modules_to_save")
    base = doc.get("base_model_name_or_path")
    return AdapterConfig(r, float(alpha), float(dropout), rs, targets, saved, bias,
                         one_line(base)[:512] if isinstance(base, str) else None)


def _names(where: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value and key == "target_modules" or len(value) > 4096 or not all(
            isinstance(v, str) and 0 < len(v) <= 256 for v in value):
        raise _bad(where, key, value, "a list of module names (strings)")
    return tuple(value)


def _regular(path: Path, what: str) -> None:
    if path.is_symlink() or not path.is_file():
        raise CheckpointError(f"{path}: {'is a symbolic link' if path.is_symlink() else 'not found'}; a PEFT adapter "
                              f"folder holds {CONFIG_FILE} and {WEIGHTS_FILE} as regular files ({what})")


def read_config(folder: Path) -> AdapterConfig:
    path = Path(folder) / CONFIG_FILE
    _regular(path, "the adapter's settings")
    doc = files.read_json_object(path, what="PEFT adapter config", max_bytes=MAX_CONFIG_BYTES, error=ConfigError)
    return config_from_peft(doc, str(path))


def read_adapter(folder: Path, cfg: LlamaConfig) -> tuple[AdapterConfig, lora_names.Targets, dict[str, np.ndarray]]:
    """(config, targets, PEFT key -> float32 array) of a PEFT adapter folder for the model ``cfg``: exactly the
    keys its config implies for this model, each with the shape it must have."""
    folder = Path(folder)
    conf = read_config(folder)
    targets = lora_names.resolve(cfg, conf.target_modules, conf.modules_to_save, conf.bias)
    wpath = folder / WEIGHTS_FILE
    _regular(wpath, "the adapter's weights")
    head = read_header(wpath)
    if head.file_bytes > MAX_WEIGHTS_BYTES:
        raise CheckpointError(f"{wpath}: {head.file_bytes} bytes, more than an adapter of any model port trains")
    found = head.by_name()
    want = expected_shapes(cfg, targets, conf.r)
    missing, unexpected = sorted(set(want) - set(found)), sorted(set(found) - set(want))
    if missing or unexpected:
        raise CheckpointError(f"{wpath}: does not match {CONFIG_FILE} for this model: missing {missing[:4]}"
                              f"{' (+more)' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                              f"{' (+more)' if len(unexpected) > 4 else ''}; export the adapter again from its run")
    out = {}
    with open(wpath, "rb") as f:
        for key, shape in want.items():
            t = found[key]
            if tuple(t.shape) != shape:
                raise CheckpointError(f"{wpath}: tensor {key} has shape {list(t.shape)}, this model and r {conf.r} "
                                      f"need {list(shape)}")
            if t.dtype not in ("F32", "BF16", "F16"):
                raise CheckpointError(f"{wpath}: tensor {key} is {t.dtype}, expected F32, BF16 or F16")
            f.seek(t.begin)
            arr = dtypes.to_numpy_f32(t.dtype, f.read(t.nbytes), shape)
            if not np.isfinite(arr).all():
                raise CheckpointError(f"{wpath}: tensor {key} holds NaN or inf; the adapter is damaged")
            out[key] = arr
    return conf, targets, out


def expected_shapes(cfg: LlamaConfig, targets: lora_names.Targets, r: int) -> dict[str, tuple[int, ...]]:
    """PEFT key -> shape of every tensor an adapter of rank ``r`` holds for ``targets`` of ``cfg``."""
    from converters import names

    shapes = names.expected_hf_shapes(cfg)
    out: dict[str, tuple[int, ...]] = {}
    for hf in targets.adapted:
        o, i = shapes[f"{hf}.weight"]
        out[f"{lora_names.PEFT_PREFIX}{hf}.lora_A.weight"] = (r, i)
        out[f"{lora_names.PEFT_PREFIX}{hf}.lora_B.weight"] = (o, r)
    zoo_to_hf = {z: h for h, z in lora_names.ModuleTable.of(cfg).params.items()}
    for key, zoo in targets.trainable.items():
        out[key] = shapes[zoo_to_hf[zoo]]
    return out


def write_adapter(folder: Path, conf: AdapterConfig, targets: lora_names.Targets, tensors: dict[str, np.ndarray],
                  dtype: str = "F32") -> None:
    """Write ``folder/adapter_config.json`` and ``adapter_model.safetensors`` (``tensors``: PEFT key -> full
    array, exactly ``targets.keys()``) into an existing directory the caller stages."""
    if set(tensors) != set(targets.keys()):
        raise CheckpointError(f"{folder}: adapter tensors {sorted(set(targets.keys()) ^ set(tensors))[:3]} do not "
                              "match the adapter's config")
    keys = sorted(tensors)
    heads = [OutTensor(k, dtype, tuple(tensors[k].shape)) for k in keys]
    with open(Path(folder) / WEIGHTS_FILE, "wb") as f:
        write_all(f, encode_header(heads, {"format": "pt"}))
        for k in keys:
            arr = np.ascontiguousarray(tensors[k], np.float32)
            write_all(f, dtypes.cast_bytes("F32", dtype, memoryview(arr).cast("B")))
        f.flush()
        os.fsync(f.fileno())
    body = json.dumps(conf.to_peft(list(targets.adapted)), indent=2) + "\n"
    (Path(folder) / CONFIG_FILE).write_text(body)

