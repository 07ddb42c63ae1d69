"""HF export of a trained model: model.safetensors + config.json + tokenizer files, written atomically.

One swappable function (:func:`export_hf`); the converters' streaming writer can replace its body.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

from converters import names
from model_zoo.errors import CheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def export_hf(model, tokenizer_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``model`` (a zoo LlamaForCausalLM) as an HF directory at ``out_dir``."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    tmp = out.with_name(f".tmp_{out.name}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    cfg = model.config
    state: dict[str, np.ndarray] = {}
    for p in model.get_parameters():
        hf = names.map_name(p.name, names.LLAMA_MS_TO_HF)
        if hf is None:
            raise CheckpointError(f"export: parameter {p.name} has no HF name in converters.names")
        state[hf] = np.ascontiguousarray(p.asnumpy())
    try:
        tmp.mkdir(parents=True)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
        for f in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / f
            if src.is_file():
                shutil.copyfile(src, tmp / f)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{out}: HF export failed ({exc}); the training checkpoints are intact") from None
    return out
