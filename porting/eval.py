"""Held-out evaluation: mean next-token loss and perplexity of a model on data in any training format.

``port eval`` runs the model_zoo cell (MindSpore) on the examples ``port train`` would make of the file
(same formats, chat templates and masks: only the tokens training learns are scored) and, for parity,
HF transformers' ``LlamaForCausalLM`` on the same padded batches. ``port train`` calls
:func:`evaluate` every ``data.eval_every_steps`` on its ``data.eval_split`` hold-out.

The mean loss is the sum of per-token cross-entropy over all scored tokens divided by their count
(not a mean of batch means), so it does not depend on how examples are batched.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from porting.train.data.batching import BatchSchedule, choose_boundaries, pad_micro_batch
from porting.train.data.examples import MicroBatch, TokenizedData
from porting.train.data.tokenise import tokenize_dataset


@dataclass(frozen=True)
class EvalResult:
    examples: int
    tokens: int            # scored tokens (shifted targets)
    loss_sum: float
    mean_loss: float
    perplexity: float

    def as_dict(self) -> dict:
        return asdict(self)


def _result(examples: int, loss_sum: float, tokens: int) -> EvalResult:
    mean = loss_sum / max(tokens, 1)
    return EvalResult(examples, tokens, loss_sum, mean, math.exp(min(mean, 700.0)))


def batches(data: TokenizedData, batch_size: int, boundaries: Sequence[int]) -> list[MicroBatch]:
    """The examples in length order, ``batch_size`` at a time, each padded to the smallest boundary."""
    order = sorted(range(len(data.examples)), key=lambda i: (data.examples[i].length, i))
    return [pad_micro_batch(data, order[k:k + batch_size], boundaries) for k in range(0, len(order), batch_size)]


def zoo_loss(model, mbs: Sequence[MicroBatch]) -> tuple[float, int]:
    """Loss sum and scored tokens with the model_zoo cell (one compiled graph per batch shape)."""
    import mindspore as ms
    from mindspore import nn

    from model_zoo.loss import shifted_token_loss

    class _Loss(nn.Cell):
        def __init__(self, net):
            super().__init__(auto_prefix=False)
            self.net = net

        def construct(self, ids, labels):
            return shifted_token_loss(self.net(ids), labels)

    # No set_train(False): the model has no dropout, and flipping the shared cells' training flag would
    # recompile the training graph at the next step.
    cell = model.__dict__.setdefault("_eval_cell", _Loss(model))
    total, count = 0.0, 0
    for mb in mbs:
        s, n = cell(ms.Tensor(mb.input_ids), ms.Tensor(mb.labels))
        total += float(s.asnumpy())
        count += int(round(float(n.asnumpy())))
    return total, count


def hf_loss(hf_dir: str | Path, mbs: Sequence[MicroBatch]) -> tuple[float, int]:
    """The same sums with HF transformers (fp32, CPU) on the same padded batches."""
    import torch
    from transformers import AutoModelForCausalLM   # LlamaForCausalLM, or Qwen2's / Mistral's class
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # port eval prints its own lines

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True, dtype=torch.float32)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for mb in mbs:
            ids = torch.from_numpy(mb.input_ids.astype(np.int64))
            labels = torch.from_numpy(mb.labels.astype(np.int64))
            # Right padding under a causal mask never reaches a real position: no attention mask needed,
            # exactly as the zoo cell runs.
            logits = model(ids).logits.float()
            tgt = labels[:, 1:]
            total += float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                             tgt.reshape(-1), ignore_index=-100, reduction="sum"))
            count += int((tgt != -100).sum())
    return total, count


def evaluate(model, data: TokenizedData, batch_size: int, boundaries: Sequence[int]) -> EvalResult:
    """Mean loss and perplexity of ``model`` (a model_zoo cell) on ``data``."""
    s, n = zoo_loss(model, batches(data, batch_size, boundaries))
    return _result(len(data.examples), s, n)


def eval_record(model, plan: BatchSchedule, done: int, every: int) -> dict:
    """The held-out numbers ``port train`` adds to step ``done``'s record (every ``every`` steps and at
    the last step), or nothing."""
    if plan.eval_data is None or not (done == plan.total_steps or (every and done % every == 0)):
        return {}
    r = evaluate(model, plan.eval_data, plan.micro_batch_size, plan.boundaries)
    return {"eval_loss": r.mean_loss, "eval_perplexity": r.perplexity, "eval_tokens": r.tokens}


def _check_reference(cfg, ref_cfg, reference: Path) -> None:
    """The reference scores the same token ids: its vocabulary must be the model's (a smaller one would
    index past its embedding table, a traceback inside torch)."""
    from model_zoo.errors import ConfigError

    if ref_cfg.vocab_size != cfg.vocab_size:
        raise ConfigError(f"--reference {reference}: vocab_size {ref_cfg.vocab_size:,}, but the evaluated model's "
                          f"is {cfg.vocab_size:,}; the reference must be the same model in HF format (the directory "
                          "port convert read), or pass --no-reference")


def eval_report(model_dir: Path, weights: str, data_cfg, batch_size: int, reference: Path | None) -> dict:
    """What ``port eval`` prints: the zoo cell's numbers and, with a reference, HF's and the difference."""
    from converters.loading import load_hf_dir, load_ms_dir
    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build
    from porting.tokenizer import load_tokenizer

    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg = LlamaConfig.from_hf(model_dir)
    if reference is not None:
        _check_reference(cfg, LlamaConfig.from_hf(reference), reference)
    tok = load_tokenizer(model_dir)
    data = tokenize_dataset(data_cfg, tok)
    bounds = choose_boundaries(data.lengths, 4, 8, data_cfg.max_seq_length)
    mbs = batches(data, batch_size, bounds)
    model = build(cfg)
    (load_ms_dir if weights == "ms" else load_hf_dir)(model, model_dir)
    zoo = _result(len(data.examples), *zoo_loss(model, mbs))
    out = {"data": {k: v for k, v in data.report.as_dict().items() if k != "bad_row_samples"},
           "bad_row_samples": data.report.bad_row_samples, "model": str(model_dir), "shapes": bounds,
           "zoo": zoo.as_dict()}
    if reference is not None:
        hf = _result(len(data.examples), *hf_loss(reference, mbs))
        out["hf"] = hf.as_dict()
        out["hf_model"] = str(reference)
        out["abs_diff_mean_loss"] = abs(zoo.mean_loss - hf.mean_loss)
    return out
