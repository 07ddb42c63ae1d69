"""Tiny real checkpoints for the converter tests: HF models made by transformers' own classes and
``save_pretrained``, and helpers to damage a safetensors file in precise ways."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"

# Every zoo architecture variant, as the HF config fields that make it (transformers classes build them).
ARCHS: dict[str, tuple[str, dict]] = {
    "llama-gqa": ("llama", dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama-mqa-tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    "llama-bias": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, attention_bias=True,
                                 mlp_bias=True)),
    "mistral": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=64)),
    "qwen2": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    # Qwen3: per-head q/k norms, head_dim (16) not hidden/heads (8), GQA
    "qwen3": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    "qwen3-tied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)),
    # Phi-3: fused qkv_proj / gate_up_proj (converters/fused.py); pad id 0 (its default 32000 is past this vocabulary)
    "phi3": ("phi3", dict(num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)),
}


def make_hf(out: Path, arch: str, dtype: str = "float32", shard: str | None = None, seed: int = 0) -> Path:
    """A random-weight HF checkpoint of a tiny ``arch`` written by transformers' save_pretrained."""
    import torch
    import transformers

    kind, extra = ARCHS[arch]
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
           "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM)}[kind]
    cfg = cls[0](vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 max_position_embeddings=128, **{"tie_word_embeddings": False, **extra})
    torch.manual_seed(seed)
    model = cls[1](cfg).to(getattr(torch, dtype))
    with torch.no_grad():  # biases and norms start at 0/1: give them values so a mix-up shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(out, **kwargs)
    return out


@pytest.fixture
def hf_factory(tmp_path) -> Callable[..., Path]:
    counter = iter(range(1000))

    def make(arch: str = "llama-gqa", dtype: str = "float32", shard: str | None = None) -> Path:
        return make_hf(tmp_path / f"hf-{arch}-{dtype}-{next(counter)}", arch, dtype, shard)
    return make


@pytest.fixture
def stories_copy(tmp_path) -> Path:
    """A private copy of the embedded stories260K (real weights) to damage."""
    d = tmp_path / "stories"
    shutil.copytree(EMBEDDED, d)
    return d


def read_raw_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_raw(path: Path, header: dict | bytes, body: bytes, length: int | None = None) -> None:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob) if length is None else length) + blob + body)


def one_line_error(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected a one-line error, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]
