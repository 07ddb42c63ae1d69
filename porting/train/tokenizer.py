"""The model's own tokenizer, offline."""

from __future__ import annotations

from pathlib import Path

from model_zoo.errors import ConfigError


def load_model_tokenizer(model_dir: str | Path):
    """HF tokenizer of ``model_dir`` (local files only); long rows are truncated by the data pipeline,
    so the tokenizer's own length warning is silenced."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{model_dir}: cannot load the tokenizer ({exc}); the model directory needs "
                          "tokenizer.json or tokenizer.model with tokenizer_config.json") from None
    tok.model_max_length = 1 << 30
    return tok
