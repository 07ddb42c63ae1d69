"""Held-out evaluation during training: mean next-token loss and perplexity of the zoo cell on the
recipe's ``data.eval_split`` hold-out, every ``data.eval_every_steps`` and at the last step.

The mean loss is the sum of per-token cross-entropy over all scored tokens divided by their count
(not a mean of batch means), so it does not depend on how examples are batched. `port eval`
(:mod:`porting.verify.evaluate`) scores a data file with the same functions and adds HF's numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import mindspore as ms
from mindspore import nn

from model_zoo.loss import shifted_token_loss
from porting.train.data.batching import BatchSchedule, pad_micro_batch
from porting.train.data.examples import MicroBatch, TokenizedData


@dataclass(frozen=True)
class EvalResult:
    examples: int
    tokens: int            # scored tokens (shifted targets)
    loss_sum: float
    mean_loss: float
    perplexity: float

    def as_dict(self) -> dict:
        return asdict(self)


def result(examples: int, loss_sum: float, tokens: int) -> EvalResult:
    mean = loss_sum / max(tokens, 1)
    return EvalResult(examples, tokens, loss_sum, mean, math.exp(min(mean, 700.0)))


def batches(data: TokenizedData, batch_size: int, boundaries: Sequence[int]) -> list[MicroBatch]:
    """The examples in length order, ``batch_size`` at a time, each padded to the smallest boundary."""
    order = sorted(range(len(data.examples)), key=lambda i: (data.examples[i].length, i))
    return [pad_micro_batch(data, order[k:k + batch_size], boundaries) for k in range(0, len(order), batch_size)]


class _Loss(nn.Cell):
    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, ids, labels):
        return shifted_token_loss(self.net(ids), labels)


def zoo_loss(model, mbs: Sequence[MicroBatch]) -> tuple[float, int]:
    """Loss sum and scored tokens with the model_zoo cell (one compiled graph per batch shape)."""
    # No set_train(False): the model has no dropout, and flipping the shared cells' training flag would
    # recompile the training graph at the next step.
    cell = model.__dict__.setdefault("_eval_cell", _Loss(model))
    total, count = 0.0, 0
    for mb in mbs:
        s, n = cell(ms.Tensor(mb.input_ids), ms.Tensor(mb.labels))
        total += float(s.asnumpy())
        count += int(round(float(n.asnumpy())))
    return total, count


def evaluate(model, data: TokenizedData, batch_size: int, boundaries: Sequence[int]) -> EvalResult:
    """Mean loss and perplexity of ``model`` (a model_zoo cell) on ``data``."""
    s, n = zoo_loss(model, batches(data, batch_size, boundaries))
    return result(len(data.examples), s, n)


def eval_record(model, plan: BatchSchedule, done: int, every: int) -> dict:
    """The held-out numbers ``port train`` adds to step ``done``'s record (every ``every`` steps and at
    the last step), or nothing."""
    if plan.eval_data is None or not (done == plan.total_steps or (every and done % every == 0)):
        return {}
    r = evaluate(model, plan.eval_data, plan.micro_batch_size, plan.boundaries)
    return {"eval_loss": r.mean_loss, "eval_perplexity": r.perplexity, "eval_tokens": r.tokens}
