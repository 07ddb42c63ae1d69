"""Greedy generation: `port generate` (text from the zoo cell) and `port verify --generate` (the zoo cell's
greedy tokens against HF transformers' own ``generate`` on the same weights, and the golden text where
the model has one). The decoding itself is :func:`model_zoo.decode.greedy`; this module loads the pair
(:mod:`porting.verify.pair`) and the tokenizer, picks the prompt's token ids and turns the result into
text and rows (:class:`porting.verify.check.Check`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_zoo.config import LlamaConfig
from porting.verify.check import Check
from porting.verify.pair import load_reference, load_zoo

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
    cache: str            # the KV cache mode that decoded it (CACHE_MODES)


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
    new = greedy(load_zoo(hf_dir, cfg=cfg), ids, max_new_tokens, cache=cache, eos_token_id=stop_id(cfg))
    return Generation(prompt_ids=ids, new_ids=new, text=tok.decode(ids + new, skip_special_tokens=True), cache=cache)


def _golden(hf_dir: Path) -> dict | None:
    """The golden continuation of a packaged preset (model_zoo.presets), if ``hf_dir`` is one."""
    from model_zoo import presets

    return next((p.get("golden") for p in presets.PRESETS if p.get("path") and str(p["path"]) == str(hf_dir)), None)


def check_generation(hf_dir: str | Path, n_tokens: int, cache: str = "static") -> dict[str, Any]:
    """Greedy tokens from BOS (or the golden prompt) on the zoo cell against HF's own greedy ``generate``
    (fp32, the reference of :func:`porting.verify.pair.load_reference`); the golden text too, if known.
    The result's ``checks`` are its rows; ``passed`` their verdict."""
    import torch

    from model_zoo.decode import greedy
    from porting.tokenizer import load_tokenizer

    hf_dir = Path(hf_dir)
    cfg = LlamaConfig.from_hf(hf_dir)
    golden = _golden(hf_dir)
    prompt = golden["prompt_ids"] if golden else start_ids(cfg)
    ours = greedy(load_zoo(hf_dir, cfg=cfg), prompt, n_tokens, cache=cache)
    with torch.no_grad():
        ref = load_reference(hf_dir, "float32").generate(
            torch.tensor([prompt]), max_new_tokens=n_tokens, do_sample=False, min_new_tokens=n_tokens,
            pad_token_id=0)[0, len(prompt):].tolist()
    first_diff = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    res: dict[str, Any] = {"prompt_ids": prompt, "new_tokens": n_tokens, "kv_cache": cache, "zoo_ids": ours,
                           "hf_ids": ref, "tokens_equal": ours == ref, "first_difference": first_diff}
    try:
        res["text"] = load_tokenizer(hf_dir).decode(ours, skip_special_tokens=True)
    except Exception as e:  # a checkpoint without tokenizer files still gets the token comparison
        res["text"] = None
        res["tokenizer_error"] = str(e).splitlines()[0]
    differing = sum(a != b for a, b in zip(ours, ref)) + abs(len(ours) - len(ref))
    rows = [Check.within(f"greedy {n_tokens} tokens ({cache} cache)", "tokens_differing", differing, 0,
                         "identical to HF generate" if ours == ref else f"first differs from HF generate at token {first_diff}")]
    if golden and n_tokens == golden["new_tokens"]:
        res["golden_text"] = golden["text"]
        res["golden_equal"] = res["text"] == golden["text"]
        rows.append(Check.claim("golden text", res["golden_equal"], "matches the model's golden continuation"
                                if res["golden_equal"] else f"differs from the golden continuation: {str(res['text'])[:80]!r}"))
    res["checks"] = [r.to_dict() for r in rows]
    res["passed"] = all(r.passed for r in rows)
    return res
