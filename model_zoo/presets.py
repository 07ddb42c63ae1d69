"""Named sizes of the Llama family, as data.

Each entry holds the fields of the model's HF ``config.json`` that the builder needs, and the HF repo
it came from (the comment names the file). Nothing here is fetched: ``port convert --hf NAME``
looks the repo up in the local HF cache.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from model_zoo.config import LlamaConfig
from model_zoo.errors import UnknownModelError

ASSETS = Path(__file__).parent / "assets"
EMBEDDED_DEFAULT = "stories260k"

_LLAMA1 = dict(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
               num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
               max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
               bos_token_id=1, eos_token_id=2)

PRESETS: list[dict] = [
    # model_zoo/assets/stories260k/config.json (karpathy/tinyllamas stories260K, MIT; embedded)
    dict(name="stories260k", hf_repo=None, path=str(ASSETS / "stories260k"),
         config=dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=172,
                     num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=4,
                     max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
         # Greedy continuation of BOS measured with HF transformers on CPU in fp32 (shared/README.md).
         golden=dict(prompt_ids=[1], new_tokens=60,
                     text="Once upon a time, there was a little girl named Lily. She loved to play outside "
                          "in the park. One day, she saw a big, red ball. She wanted to play with it, but it "
                          "was too high")),
    # huggyllama/llama-7b config.json
    dict(name="llama-7b", hf_repo="huggyllama/llama-7b", config=dict(_LLAMA1)),
    # huggyllama/llama-13b config.json
    dict(name="llama-13b", hf_repo="huggyllama/llama-13b",
         config=dict(_LLAMA1, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                     num_attention_heads=40, num_key_value_heads=40)),
    # meta-llama/Llama-2-7b-hf config.json
    dict(name="llama2-7b", hf_repo="meta-llama/Llama-2-7b-hf",
         config=dict(_LLAMA1, max_position_embeddings=4096, rms_norm_eps=1e-5)),
    # meta-llama/Llama-2-13b-hf config.json
    dict(name="llama2-13b", hf_repo="meta-llama/Llama-2-13b-hf",
         config=dict(_LLAMA1, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                     num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096,
                     rms_norm_eps=1e-5)),
    # codellama/CodeLlama-7b-hf config.json
    dict(name="codellama-7b", hf_repo="codellama/CodeLlama-7b-hf",
         config=dict(_LLAMA1, vocab_size=32016, max_position_embeddings=16384, rms_norm_eps=1e-5,
                     rope_theta=1000000.0)),
    # meta-llama/Meta-Llama-3-8B config.json
    dict(name="llama3-8b", hf_repo="meta-llama/Meta-Llama-3-8B",
         config=dict(_LLAMA1, vocab_size=128256, intermediate_size=14336, num_key_value_heads=8,
                     max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                     bos_token_id=128000, eos_token_id=128001)),
    # meta-llama/Llama-3.1-8B config.json
    dict(name="llama3.1-8b", hf_repo="meta-llama/Llama-3.1-8B",
         config=dict(_LLAMA1, vocab_size=128256, intermediate_size=14336, num_key_value_heads=8,
                     max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                     rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=8192),
                     bos_token_id=128000, eos_token_id=128001)),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json
    dict(name="tinyllama-1.1b", hf_repo="TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
         config=dict(_LLAMA1, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                     num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-5)),
    # mistralai/Mistral-7B-v0.1 config.json
    dict(name="mistral-7b", hf_repo="mistralai/Mistral-7B-v0.1",
         config=dict(_LLAMA1, model_type="mistral", intermediate_size=14336, num_key_value_heads=8,
                     max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=4096)),
    # Qwen/Qwen2-7B config.json (q/k/v bias, no o bias; use_sliding_window false)
    dict(name="qwen2-7b", hf_repo="Qwen/Qwen2-7B",
         config=dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     qkv_bias=True, bos_token_id=151643, eos_token_id=151643)),
]

_BY_NAME = {p["name"]: p for p in PRESETS}


def names() -> list[str]:
    return [p["name"] for p in PRESETS]


def get(name: str) -> dict:
    """The preset entry for ``name``; unknown names get the nearest names suggested."""
    if name not in _BY_NAME:
        near = difflib.get_close_matches(name, names(), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise UnknownModelError(f"unknown zoo model {name!r}{hint} Known: {', '.join(names())} "
                                "(see `port zoo list`)")
    return _BY_NAME[name]


def config(name: str) -> LlamaConfig:
    return LlamaConfig(**get(name)["config"])


def embedded_default_dir() -> Path:
    """The stories260K checkpoint shipped inside the package (MIT, karpathy/tinyllamas)."""
    return Path(get(EMBEDDED_DEFAULT)["path"])
