"""Load HF weights straight into a zoo cell (used by verify, generate and train)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import mindspore as ms
import numpy as np

from converters import names
from model_zoo.errors import CheckpointError


def assign_hf_state(model, state: Mapping[str, np.ndarray], where: str) -> None:
    """Copy an HF-named state dict into ``model``: every tensor used, every parameter filled, shapes equal."""
    cfg = model.config
    table = names.NAME_MAPS[cfg.model_type]
    params = {p.name: p for p in model.get_parameters()}
    mapped: dict[str, np.ndarray] = {}
    unexpected = []
    for hf_name, arr in state.items():
        if names.is_ignored_hf(hf_name):
            continue
        ms_name = names.map_name(hf_name, table)
        if ms_name is None or ms_name not in params:
            unexpected.append(hf_name)
            continue
        mapped[ms_name] = arr
    missing = [names.LLAMA_MS_TO_HF.get(_template(n), n) for n in params if n not in mapped]
    missing = [_untemplate(m, n) for m, n in zip(missing, [n for n in params if n not in mapped])]
    if missing or unexpected:
        raise names.coverage_error(where, missing, unexpected)
    for ms_name, arr in mapped.items():
        p = params[ms_name]
        if tuple(arr.shape) != tuple(p.shape):
            raise CheckpointError(f"{where}: tensor {names.map_name(ms_name, names.LLAMA_MS_TO_HF)} has shape "
                                  f"{tuple(arr.shape)}, config.json implies {tuple(p.shape)}")
        p.set_data(ms.Tensor(np.ascontiguousarray(arr)).astype(p.dtype))


def _template(name: str) -> str:
    parts = name.split(".")
    return ".".join("{}" if x.isdigit() else x for x in parts)


def _untemplate(template_hf: str, ms_name: str) -> str:
    idx = [x for x in ms_name.split(".") if x.isdigit()]
    return template_hf.replace("{}", idx[0]) if idx else template_hf


def read_hf_state(hf_dir: str | Path) -> dict[str, np.ndarray]:
    """All tensors of an HF directory (single or sharded safetensors) as NumPy arrays."""
    from safetensors.numpy import load_file
    import json

    d = Path(hf_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (d / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise CheckpointError(f"{d}: no model.safetensors or model.safetensors.index.json; expected an HF "
                              "model directory (save_pretrained writes one)")
    state: dict[str, np.ndarray] = {}
    for f in files:
        path = d / f
        if not path.is_file():
            raise CheckpointError(f"{path}: shard named by {index.name} is missing")
        state.update(load_file(str(path)))
    return state


def load_hf_dir(model, hf_dir: str | Path) -> None:
    assign_hf_state(model, read_hf_state(hf_dir), str(hf_dir))
