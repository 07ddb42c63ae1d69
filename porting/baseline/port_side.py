"""Port's side of the settings table: every curve-moving setting as a `port train` run really used it.

The values come from the run directory (the resolved recipe in manifest.json, validated by port's schema, the data
report, and the determinism switches the ranks recorded), and what port does with them is port's code, cited per
fact, never the recipe's intent alone:

- the loss: every micro-batch's summed token loss times ``1 / the step's target tokens over all micro-batches and
  ranks`` (porting/train/run/step/cells.py), i.e. the mean per token over the global batch;
- weight decay: one AdamW group over every parameter, norms and biases included (cells.py ``AdamW``; the torch
  baseline mirrors it, porting/baseline/schedules.py ``no_decay_rule``);
- warm-up: optimizer steps, ``lr x (step + 1) / warmup_steps`` from the first step (porting/train/recipe/schedule.py);
- padding: right, labels -100 on the padding (porting/train/data/batching.py ``pad_micro_batch``); none when packed;
- truncation: the first ``max_seq_length`` tokens of an example are kept (porting/train/data/tokenise.py, cut.py;
  chat rows keep whole turns from the start), or plain text is split into windows (``long_text: split``);
- no NEFTune noise, no attention dropout (model_zoo/llama.py has none), no label smoothing (model_zoo/loss.py).

The same facts describe a `port baseline` run (:func:`baseline_side`): the torch loop trains the recipe's batches with
the same loss, decay rule and schedule (porting/baseline/torch_loop.py), except for attention dropout, which HF's
``LlamaForCausalLM`` applies from config.json in train mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from porting.baseline.effective import Fact, unknown
from porting.baseline.settings import PRECISIONS

if TYPE_CHECKING:
    from porting.train.recipe.schema import Recipe

CELLS = "porting/train/run/step/cells.py"
LOSS_WORDS = {"global-token-mean": "per token over the global batch (all micro-batches and devices of the step)",
              "micro-batch-mean": "mean of micro-batch means (each micro-batch's token mean / accumulation), then "
                                  "the mean over devices",
              "device-token-mean": "per token over each device's accumulated micro-batches, then the mean over devices"}


def _recipe_facts(r: Recipe, src: str) -> dict[str, Fact]:
    """The facts the recipe decides on both port's sides (a run, a torch baseline)."""
    o, s, d, b = r.optimizer, r.schedule, r.data, r.batching
    decay = {"cosine": "cosine", "linear": "linear", "constant": "constant"}[s.decay]
    floor = 1.0 if s.decay == "constant" else s.min_lr_ratio
    return {
        "weight_decay": Fact(o.weight_decay, f"{o.weight_decay:g}", f"{src}: optimizer.weight_decay"),
        "decay_norms_biases": Fact(True, "decayed: one AdamW group over every parameter", f"{CELLS} AdamW"),
        "warmup_unit": Fact("optimizer steps", "optimizer steps (lr x (step + 1) / warmup from the first step)",
                            "porting/train/recipe/schedule.py lr_at"),
        "warmup_steps": Fact(s.warmup_steps, str(s.warmup_steps), f"{src}: schedule.warmup_steps"),
        "grad_accum": Fact(b.grad_accum_steps, str(b.grad_accum_steps), f"{src}: batching.grad_accum_steps"),
        "lr": Fact(o.lr, f"{o.lr:g}", f"{src}: optimizer.lr"),
        "lr_schedule": Fact((decay, floor), f"{decay} to {floor:g} x lr" + (f" over {s.max_steps} steps"
                            if s.max_steps else ""), f"{src}: schedule.decay, schedule.min_lr_ratio"),
        "max_grad_norm": Fact(o.grad_clip if o.grad_clip is not None else "none",
                              f"{o.grad_clip:g}" if o.grad_clip is not None else "none (no clipping)",
                              f"{src}: optimizer.grad_clip"),
        "betas": Fact(tuple(o.betas), f"({o.betas[0]:g}, {o.betas[1]:g})", f"{src}: optimizer.betas"),
        "eps": Fact(o.eps, f"{o.eps:g}", f"{src}: optimizer.eps"),
        "global_batch": Fact(r.global_batch_size, f"{r.global_batch_size} ({b.micro_batch_size} micro x "
                             f"{b.grad_accum_steps} accumulation x {r.data_parallel_size} data parallel)",
                             f"{src}: batching, cluster"),
        "seq_length": Fact(d.max_seq_length, str(d.max_seq_length), f"{src}: data.max_seq_length"),
        "padding_side": Fact("none" if b.packing else "right", "none (packed rows)" if b.packing else
                             "right (labels -100 on the padding)", "porting/train/data/batching.py pad_micro_batch"),
        "truncation": _truncation(r, src),
        "neftune": Fact(0.0, "none", "port adds no embedding noise (model_zoo/llama.py)"),
        "label_smoothing": Fact(0.0, "none (plain token cross-entropy)", "model_zoo/loss.py"),
        "chat_template": _template(r, src),
        "packing": Fact(b.packing, "packed rows" if b.packing else "no packing (bucketed padding)",
                        f"{src}: batching.packing"),
        "precision": Fact(PRECISIONS.get((r.precision.param_dtype, r.precision.compute_dtype)),
                          f"{r.precision.param_dtype} parameters, {r.precision.compute_dtype} compute",
                          f"{src}: precision"),
        "seed": Fact(r.seed, str(r.seed), f"{src}: seed"),
    }


def _truncation(r: Recipe, src: str) -> Fact:
    d = r.data
    if d.long_text == "split":
        return Fact(("split", d.max_seq_length), f"plain text split into windows of {d.max_seq_length} tokens",
                    f"{src}: data.long_text")
    return Fact(("right", d.max_seq_length), f"right: the first {d.max_seq_length} tokens of each example kept"
                + (" (whole turns of a chat)" if d.format in ("chat", "sharegpt") else ""),
                "porting/train/data/tokenise.py, cut.py")


def _template(r: Recipe, src: str) -> Fact:
    d = r.data
    if d.format == "text":
        return Fact("none", "none (plain text)", f"{src}: data.format")
    if d.format == "alpaca" and d.chat_template in ("auto", "builtin"):
        return Fact("port-alpaca", "port's Alpaca prompt (data.prompt_template)", f"{src}: data.prompt_template")
    return Fact(None if d.chat_template == "auto" else d.chat_template,
                f"{d.chat_template} ({'the tokenizer template, else port builtin markers' if d.chat_template == 'auto' else 'as named'})",
                f"{src}: data.chat_template")


def determinism_fact(recipe_mode: str, switches: dict[str, Any] | None, src: str) -> Fact:
    """The determinism the run asked for and the switches its ranks recorded in force (manifest.json)."""
    if recipe_mode != "bitwise":
        return Fact("default", "default (determinism: default: the kernels' own, non-deterministic where they are)",
                    f"{src}: determinism")
    inforce = ", ".join(f"{k}={v}" for k, v in (switches or {}).items() if k != "refused")
    return Fact("bitwise", "bitwise" + (f": {inforce}" if inforce else " (switches not recorded)"),
                f"{src}: determinism; manifest.json determinism")


def recipe_side(rec: Recipe, switches: dict[str, Any] | None = None,
                src: str = "manifest.json recipe") -> dict[str, Fact]:
    """Port's side of a resolved recipe, with the determinism switches its ranks recorded in force."""
    facts = _recipe_facts(rec, src)
    facts["loss_normalisation"] = Fact("global-token-mean", LOSS_WORDS["global-token-mean"],
                                       f"{CELLS} (scale = 1 / the step's target tokens)")
    facts["attention_dropout"] = Fact(0.0, "none (port's attention has no dropout)", "model_zoo/llama.py")
    facts["data_order"] = Fact("port-permutation" + (f":{rec.seed}" if rec.data.shuffle else ":none"),
                               f"port's own permutation of seed {rec.seed}" if rec.data.shuffle else "file order",
                               "porting/train/data/batching.py plan_epoch")
    facts["determinism"] = determinism_fact(rec.determinism, switches, src)
    return facts


def run_side(run: Any) -> dict[str, Fact]:
    """Port's side of a run directory as :func:`porting.rundir.read_run` read it."""
    from porting.train.recipe.schema import validate_recipe

    if run.manifest is None:   # a run read without its manifest records no setting: no table
        return {}
    rec = validate_recipe(run.manifest.recipe, f"{run.path / 'manifest.json'}: recipe", check_files=False)
    return recipe_side(rec, run.manifest.determinism)


def baseline_side(recipe: dict | None, loop: dict | None, where: str) -> dict[str, Fact]:
    """A `port baseline` run's side: its recipe and the torch loop (same loss, decay and schedule as port); ``loop``
    is the document's record of how the torch side ran (its attention dropout among it)."""
    from porting.train.recipe.schema import validate_recipe

    if recipe is None:
        return {}
    rec = validate_recipe(recipe, f"{where}: recipe", check_files=False)
    src = "baseline recipe"
    facts = _recipe_facts(rec, src)
    facts["decay_norms_biases"] = Fact(True, "decayed: every parameter (port's rule)",
                                       "porting/baseline/schedules.py no_decay_rule")
    facts["loss_normalisation"] = Fact("global-token-mean", LOSS_WORDS["global-token-mean"],
                                       "porting/baseline/torch_loop.py (part / total target tokens)")
    drop = (loop or {}).get("attention_dropout")
    facts["attention_dropout"] = (Fact(float(drop), f"{float(drop):g} (HF LlamaForCausalLM in train mode)",
                                       "baseline loop.attention_dropout (the model's config.json)")
                                  if isinstance(drop, (int, float)) and not isinstance(drop, bool)
                                  else unknown("not recorded by this baseline (made before port recorded it)",
                                               "baseline loop"))
    facts["data_order"] = Fact("port-permutation" + (f":{rec.seed}" if rec.data.shuffle else ":none"),
                               f"port's own permutation of seed {rec.seed}, the same steps as `port train`"
                               if rec.data.shuffle else "file order",
                               "porting/baseline/runner.py gathered_steps")
    facts["determinism"] = Fact("default", "default (torch's kernels, no deterministic algorithms)",
                                "porting/baseline/runner.py")
    return facts
