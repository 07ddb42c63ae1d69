"""`port eval`: mean next-token loss and perplexity of a model on held-out data in any training format,
the zoo cell against HF transformers.

The zoo cell (MindSpore) scores the examples ``port train`` would make of the file (same formats, chat
templates and masks: only the tokens training learns are scored), with the functions `port train`'s own
held-out evaluation uses (:mod:`porting.train.run.heldout`); HF transformers' model (the reference of
:func:`porting.verify.pair.load_reference`) scores the same padded batches. Their mean losses are one
:class:`porting.verify.check.Check` row, held to the float32 loss tolerance of
:data:`porting.verify.stats.TOLERANCES` (the mean loss is a sum over all scored tokens divided by their
count, so it does not depend on how examples are batched).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from model_zoo.config import LlamaConfig
from model_zoo.errors import ConfigError
from porting.train.data.batching import choose_boundaries
from porting.train.data.examples import MicroBatch
from porting.train.data.tokenise import tokenize_dataset
from porting.verify.check import Check, table
from porting.verify.pair import load_reference, load_zoo
from porting.verify.stats import TOLERANCES


def hf_loss(hf_dir: str | Path, mbs: Sequence[MicroBatch]) -> tuple[float, int]:
    """The loss sum and scored tokens of HF transformers (fp32, CPU) on the same padded batches."""
    import torch

    model = load_reference(hf_dir, "float32")
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


def _check_reference(cfg: LlamaConfig, ref_cfg: LlamaConfig, reference: Path) -> None:
    """The reference scores the same token ids: its vocabulary must be the model's (a smaller one would
    index past its embedding table, a traceback inside torch)."""
    if ref_cfg.vocab_size != cfg.vocab_size:
        raise ConfigError(f"--reference {reference}: vocab_size {ref_cfg.vocab_size:,}, but the evaluated model's "
                          f"is {cfg.vocab_size:,}; the reference must be the same model in HF format (the directory "
                          "port convert read), or pass --no-reference")


def eval_report(model_dir: Path, weights: str, data_cfg, batch_size: int, reference: Path | None) -> dict:
    """What ``port eval`` prints: the zoo cell's numbers and, with a reference, HF's, the difference and its
    row (``checks``, ``passed``). ``weights``: "hf" (model_dir is an HF directory) or "ms" (a `port convert`
    output)."""
    import mindspore as ms

    from porting.tokenizer import load_tokenizer
    from porting.train.run.heldout import batches, result, zoo_loss

    ms.set_context(mode=ms.GRAPH_MODE)
    cfg = LlamaConfig.from_hf(model_dir)
    if reference is not None:
        _check_reference(cfg, LlamaConfig.from_hf(reference), reference)
    tok = load_tokenizer(model_dir)
    data = tokenize_dataset(data_cfg, tok)
    bounds = choose_boundaries(data.lengths, 4, 8, data_cfg.max_seq_length)
    mbs = batches(data, batch_size, bounds)
    model = load_zoo(model_dir, kind="hf" if weights == "hf" else "convert", cfg=cfg)
    zoo = result(len(data.examples), *zoo_loss(model, mbs))
    out = {"data": {k: v for k, v in data.report.as_dict().items() if k != "bad_row_samples"},
           "bad_row_samples": data.report.bad_row_samples, "model": str(model_dir), "shapes": bounds,
           "zoo": zoo.as_dict()}
    if reference is not None:
        hf = result(len(data.examples), *hf_loss(reference, mbs))
        out["hf"] = hf.as_dict()
        out["hf_model"] = str(reference)
        out["abs_diff_mean_loss"] = abs(zoo.mean_loss - hf.mean_loss)
        row = Check.within("mean loss, zoo vs HF", "abs_diff", out["abs_diff_mean_loss"], TOLERANCES["float32"]["loss"],
                           f"zoo {zoo.mean_loss:.6f}, HF {hf.mean_loss:.6f} over {zoo.tokens} scored tokens")
        out["checks"] = [row.to_dict()]
        out["passed"] = row.passed
    return out


def run_eval(*, hf: str | None, ms: str | None, data_path: str, fmt: str = "auto", chat_template: str = "auto",
             max_seq_length: int = 512, long_text: str = "truncate", batch_size: int = 4, reference: str | None = None,
             no_reference: bool = False) -> dict:
    """`port eval`: resolve the model (``hf``: an HF directory or zoo name; ``ms``: a `port convert` output) and
    its reference (``reference``, default the ``hf`` directory, none for ``ms``), read the data as `port train`
    would, and return :func:`eval_report`'s report."""
    from pydantic import ValidationError

    from model_zoo.errors import RecipeError, UnknownModelError
    from porting.model_paths import resolve_hf
    from porting.train.recipe.schema import DataSection

    if bool(hf) == bool(ms):
        raise UnknownModelError("port eval: give exactly one of --hf MODEL or --ms DIR")
    model_dir = resolve_hf(hf) if hf else Path(ms)
    if ms and not model_dir.is_dir():
        raise UnknownModelError(f"{model_dir}: no such directory; expected a `port convert --hf` output directory")
    if ms and not (model_dir / "config.json").is_file():
        raise UnknownModelError(f"{model_dir}: no config.json; expected a `port convert --hf` output directory")
    ref = None if no_reference else (resolve_hf(reference) if reference else (model_dir if hf else None))
    try:
        data = DataSection(path=data_path, format=fmt, chat_template=chat_template, max_seq_length=max_seq_length,
                           long_text=long_text, shuffle=False)
    except ValidationError as exc:
        raise RecipeError(f"port eval: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None
    return eval_report(model_dir, "hf" if hf else "ms", data, batch_size, ref)


def render(rep: dict) -> str:
    """The lines `port eval` prints: the data, each side's numbers, and the row of their difference."""
    d, z = rep["data"], rep["zoo"]
    out = [f"data {d['path']} ({d['format']}): {z['examples']} examples, {z['tokens']} scored tokens, "
           f"{d['bad_rows']} malformed rows skipped, {d['truncated']} truncated",
           f"zoo cell (MindSpore)  mean loss {z['mean_loss']:.6f}  perplexity {z['perplexity']:.4f}"]
    if "hf" in rep:
        h = rep["hf"]
        out.append(f"HF transformers       mean loss {h['mean_loss']:.6f}  perplexity {h['perplexity']:.4f}  "
                   f"|diff| {rep['abs_diff_mean_loss']:.2e}")
        out.append(table([Check.from_dict(c) for c in rep["checks"]]))
    return "\n".join(out)
