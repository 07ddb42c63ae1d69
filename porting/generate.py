"""From an HF checkpoint directory to greedy text: `port generate` (and the pieces `port verify
--generate` shares). The decoding itself is :func:`model_zoo.decode.greedy`; this module only loads the
zoo cell and the tokenizer, picks the prompt's token ids and turns the result back into text."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from model_zoo.config import LlamaConfig

if TYPE_CHECKING:
    from model_zoo.llama import LlamaForCausalLM

# The keys of model_zoo.decode.DECODERS, spelled here so that the CLI's choices need no MindSpore import
# (tests/test_generate.py checks that the two agree).
CACHE_MODES = ("static", "dynamic", "none")


@dataclass(frozen=True)
class Generation:
    """What one greedy generation produced."""

    prompt_ids: list[int]
    new_ids: list[int]
    text: str             # prompt and continuation, special tokens dropped
    cache: str            # the KV cache mode that decoded it (porting.generate.CACHE_MODES)


def load_zoo_model(hf_dir: str | Path) -> LlamaForCausalLM:
    """The zoo cell built from ``hf_dir``'s config.json with its weights loaded."""
    from converters.loading import load_hf_dir
    from model_zoo import build

    model = build(LlamaConfig.from_hf(Path(hf_dir)))
    load_hf_dir(model, hf_dir)
    return model


def start_ids(cfg: LlamaConfig) -> list[int]:
    """The prompt of an empty text: the BOS token (id 0 when the config names none)."""
    return [cfg.bos_token_id if cfg.bos_token_id is not None else 0]


def stop_id(cfg: LlamaConfig) -> int | None:
    """The EOS id generation stops at; None when the config names none or several."""
    return cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else None


def generate_text(hf_dir: str | Path, prompt: str, max_new_tokens: int, *, cache: str = "static") -> Generation:
    """Greedy continuation of ``prompt`` (BOS added as the tokenizer does; BOS alone when empty)."""
    from model_zoo.decode import greedy
    from porting.tokenizer import load_tokenizer

    cfg = LlamaConfig.from_hf(Path(hf_dir))
    tok = load_tokenizer(hf_dir)   # before the weights: a missing tokenizer fails in a moment
    ids = list(tok.encode(prompt)) if prompt else start_ids(cfg)
    new = greedy(load_zoo_model(hf_dir), ids, max_new_tokens, cache=cache, eos_token_id=stop_id(cfg))
    return Generation(prompt_ids=ids, new_ids=new, text=tok.decode(ids + new, skip_special_tokens=True), cache=cache)
