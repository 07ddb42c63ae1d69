"""Causal-LM loss on logits, summed over real tokens so micro-batches of different lengths can be
normalised by their total token count (gradient accumulation, data parallel)."""

from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, ops

from model_zoo.labels import IGNORE_INDEX


def shifted_token_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Sum of next-token cross-entropy and the number of counted tokens.

    ``logits``: (B, S, V) float32; ``labels``: (B, S) int, IGNORE_INDEX where no loss is taken.
    Position t predicts label t+1, as in HF's ``LlamaForCausalLM`` loss.
    """
    logits = logits[:, :-1, :]
    target = labels[:, 1:]
    valid = ops.cast(target != IGNORE_INDEX, ms.float32)
    safe = ops.select(target != IGNORE_INDEX, target, ops.zeros_like(target))
    logp = ops.log_softmax(ops.cast(logits, ms.float32), -1)
    picked = ops.squeeze(ops.gather_elements(logp, 2, ops.expand_dims(ops.cast(safe, ms.int32), -1)), -1)
    return -(picked * valid).sum(), valid.sum()
