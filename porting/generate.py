"""Greedy generation on a zoo cell, with or without a KV cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def greedy(model, prompt_ids: list[int], max_new_tokens: int, *, use_cache: bool = True,
           eos_token_id: int | None = None) -> list[int]:
    """Token ids after ``prompt_ids`` picked by argmax (ties go to the lowest id, as torch.argmax)."""
    import mindspore as ms

    ids = list(prompt_ids)
    out: list[int] = []
    cache = None
    step_ids = ids
    for _ in range(max_new_tokens):
        x = ms.Tensor(np.asarray([step_ids], dtype=np.int32))
        if use_cache:
            logits, cache = model.forward_cached(x, cache)
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
