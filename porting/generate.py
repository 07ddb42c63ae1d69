"""Greedy generation on a zoo cell, with or without a KV cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np


CACHE_MODES = ("static", "dynamic", "none")


def greedy(model, prompt_ids: list[int], max_new_tokens: int, *, cache: str = "static",
           eos_token_id: int | None = None) -> list[int]:
    """Token ids after ``prompt_ids`` picked by argmax (ties go to the lowest id, as torch.argmax).

    cache: "static" = fixed-length KV cache, one compiled graph for all steps (fastest);
    "dynamic" = PyNative KV cache grown by concatenation (the path the fused kernels' cache mode
    takes); "none" = the whole sequence recomputed every step.
    """
    import mindspore as ms

    if cache == "static":
        from model_zoo.decode import greedy_static

        return greedy_static(model, prompt_ids, max_new_tokens, eos_token_id=eos_token_id)
    use_cache = cache == "dynamic"
    ids = list(prompt_ids)
    out: list[int] = []
    kv = None
    step_ids = ids
    for _ in range(max_new_tokens):
        x = ms.Tensor(np.asarray([step_ids], dtype=np.int32))
        if use_cache:
            logits, kv = model.forward_cached(x, kv)
        else:
            logits = model(ms.Tensor(np.asarray([ids], dtype=np.int32)))
        nxt = int(np.argmax(logits.asnumpy()[0, -1]))
        out.append(nxt)
        ids.append(nxt)
        step_ids = [nxt]
        if eos_token_id is not None and nxt == eos_token_id:
            break
    return out


def load_tokenizer(model_dir: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
