"""`port baseline run`: record the PyTorch/HF reference run of a recipe (loss, grad norm, probe logits, step time,
peak memory by phase, versions) in one JSON file, for `port compare`; `port baseline import LOG`: turn a CUDA
run's own loss log (trainer_state.json, trainer_log.jsonl, TensorBoard events, a CSV) into the same file
(porting/intake/baseline_import.py). The one-verb spelling (`port baseline --recipe R`, `--import LOG`) still
works, with a note."""

from __future__ import annotations

import sys

import click

from porting.cli._verbs import VerbGroup


def _old_spelling(args: list[str]) -> tuple[list[str], str]:
    if "--import" in args:
        i = args.index("--import")
        log = args[i + 1: i + 2]
        rest = args[:i] + args[i + 2:]
        return ["import", *log, *rest], "`port baseline --import LOG` is now `port baseline import LOG`"
    return ["run", *args], "`port baseline --recipe R` is now `port baseline run --recipe R`"


@click.group("baseline", cls=VerbGroup, old_spelling=_old_spelling, epilog="""\b
Examples:
  port baseline run --recipe recipes/tiny-cpu.yaml --device cpu --out base.json --steps 8
  port baseline import ./job/trainer_state.json --global-batch 64 --seq-length 2048 --out cuda_base.json
  port compare base.json runs/tiny-cpu""")
def command() -> None:
    """The PyTorch reference a port run is compared with: run it, or import a CUDA run's loss log."""


@command.command("run", epilog="""\b
Examples:
  port baseline run --recipe recipes/tiny-cpu.yaml --device cpu --out base.json --steps 8
  port baseline run --hf ./llama-7b --recipe recipes/7b-8card.yaml --device cuda --steps 20 --out llama7b_h200.json
  port baseline run --recipe recipes/tiny-cpu.yaml --set lora.target_modules=all-linear --out lora.json --steps 8
  port compare base.json runs/tiny-cpu""")
@click.option("--recipe", required=True,
              help="The `port train` recipe (YAML) whose data order, batching and optimizer to reproduce.")
@click.option("--out", required=True, help="Baseline file to write (JSON; written atomically).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where PyTorch runs; cuda measures device memory, cpu measures host RSS.")
@click.option("--hf", default=None, help="HF model directory or zoo name (default: the recipe's model.source).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Recipe override, as for `port train`.")
@click.option("--steps", type=int, default=None, help="Stop after N optimizer steps (default: the whole schedule).")
@click.option("--probe-tokens", type=int, default=32, show_default=True, help="Length of the probe sequence.")
@click.option("--timing-warmup", "timing_warmup", type=int, default=1, show_default=True,
              help="First steps timed apart from the steady state.")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
@click.option("--breakdown-every", type=click.IntRange(0, 1 << 30), default=0, show_default=True,
              help="Profile every N-th step after the warm-up with torch.profiler (compute / host / idle per phase, "
                   "at most 8 steps; those steps leave the steady timing); `port compare` sets it beside the run's.")
@click.option("--adapter-out", default=None, metavar="DIR",
              help="LoRA recipe: write the trained adapter here as PEFT saves it (a new directory).")
def run_cmd(recipe: str, out: str, device: str, hf: str | None, overrides: tuple[str, ...], steps: int | None,
            probe_tokens: int, timing_warmup: int, threads: int | None, breakdown_every: int,
            adapter_out: str | None) -> None:
    """Record a PyTorch + HF transformers baseline of RECIPE's first steps, on the identical batches."""
    _check_out(out, recipe)
    from porting.baseline.memory import PHASES
    from porting.baseline.runner import BaselineRequest, run

    req = BaselineRequest(recipe_path=recipe, out=out, device=device, hf=hf, overrides=overrides, steps=steps,
                          probe_tokens=probe_tokens, timing_warmup_steps=timing_warmup, threads=threads,
                          command=tuple(["port"] + sys.argv[1:]), breakdown_every=breakdown_every,
                          adapter_out=adapter_out)
    res = run(req, log=lambda s: click.echo(s, err=True))
    tps = res.steady_tokens_per_s
    speed = f"steady {tps:.1f} tokens/s" if tps else "no steady step (all were warm-up: first step or new shape)"
    peaks = "/".join(f"{res.peak_gib[p]:.3f}" for p in PHASES)
    last = res.losses[-1]
    final = f"{last:.6f}" if last is not None else "not finite"
    click.echo(f"wrote {res.path}: {len(res.losses)} steps, final loss {final}, {speed}, "
               f"peak {peaks} GiB fwd/bwd/opt ({res.memory_kind})")


@command.command("import", epilog="""\b
Examples:
  port baseline import runs/tiny-cpu/metrics.jsonl --global-batch 4 --hf stories260k --out cuda.json
  port baseline import ./job/trainer_state.json --global-batch 64 --seq-length 2048 --out cuda_base.json
  port baseline import ./runs/events.out.tfevents.1700000000.host --loss-tag Loss/train --out cuda_base.json""")
@click.argument("log")
@click.option("--out", required=True, help="Baseline file to write (JSON; written atomically).")
@click.option("--hf", default=None, help="The model the CUDA run trained (HF directory or zoo name), for its "
                                         "architecture facts.")
@click.option("--global-batch", type=click.IntRange(1, 1 << 24), default=None,
              help="Sequences per optimizer step of the CUDA run (micro x accumulation x GPUs).")
@click.option("--seq-length", type=click.IntRange(1, 1 << 24), default=None,
              help="The CUDA run's max sequence length (cutoff_len, max_seq_length).")
@click.option("--loss-tag", "loss_tag", default=None, metavar="TAG",
              help="For a TensorBoard file: the scalar tag that holds the training loss, when it is not one of the "
                   "recognised names (train/loss, loss, train_loss, loss/train, lm loss).")
@click.option("--dtype", type=click.Choice(["float32", "bf16-mixed", "bfloat16", "float16", "fp16-mixed"]), default=None,
              help="The CUDA run's precision.")
def import_cmd(log: str, out: str, hf: str | None, global_batch: int | None, seq_length: int | None,
               loss_tag: str | None, dtype: str | None) -> None:
    """A CUDA run's own loss log as the baseline: trainer_state.json, LLaMA-Factory trainer_log.jsonl,
    TensorBoard events.out.tfevents.*, or a CSV/JSONL of step,loss[,grad_norm,lr]."""
    from porting.intake.baseline_import import Stated, import_log, summary_line

    _check_out(out, log)
    stated = Stated(global_batch=global_batch, seq_length=seq_length, dtype=dtype, model=hf)
    path, doc = import_log(log, out, stated, ["port"] + sys.argv[1:], loss_tag)
    click.echo(summary_line(path, doc))


def _check_out(out: str, source: str) -> None:
    """--out under port's one rule (converters.atomic.check_out): a new file, or a baseline port wrote; never
    the recipe or log it reads."""
    from converters.atomic import check_out, json_of_format
    from model_zoo.errors import ConfigError
    from porting.baseline.document import FORMAT

    check_out(out, kind="file", inputs=[source], ours=json_of_format(FORMAT), what="a baseline port wrote",
              error=ConfigError)
