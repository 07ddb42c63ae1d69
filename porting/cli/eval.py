"""`port eval`: mean token loss and perplexity on held-out data, zoo cell against HF transformers."""

from __future__ import annotations

import json

import click


@click.command("eval", epilog="""\b
Examples:
  port eval --hf stories260k --data porting/train/assets/tinystories_sample.txt --long-text split
  port eval --hf ./my-llama --data held_out.jsonl --chat-template model --json
  port eval --ms ms/my-llama --data held_out.parquet --reference ./my-llama""")
@click.option("--hf", "hf_src", help="HF model directory or zoo name: the zoo cell loads it, HF is the reference.")
@click.option("--ms", "ms_dir", type=click.Path(file_okay=False), help="MindSpore checkpoint (port convert output).")
@click.option("--data", "data_path", required=True, help="Held-out data in any `port train` format (docs/data.md).")
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", "text", "alpaca", "chat", "sharegpt"]))
@click.option("--chat-template", default="auto", show_default=True, help="auto, model, builtin or a Jinja file.")
@click.option("--max-seq-length", default=512, show_default=True, type=click.IntRange(8, 1 << 20))
@click.option("--long-text", default="truncate", show_default=True, type=click.Choice(["truncate", "split"]))
@click.option("--batch-size", default=4, show_default=True, type=click.IntRange(1, 4096))
@click.option("--reference", "reference", type=click.Path(file_okay=False),
              help="HF directory to compare with (default: the --hf directory; none for --ms).")
@click.option("--no-reference", is_flag=True, help="Only the zoo cell, no HF run.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
def command(hf_src, ms_dir, data_path, fmt, chat_template, max_seq_length, long_text, batch_size, reference,
            no_reference, as_json):
    """Perplexity and mean token loss of a model on a data file, for the zoo cell and HF (parity)."""
    from pathlib import Path

    from pydantic import ValidationError

    from model_zoo.errors import RecipeError, UnknownModelError
    from porting.eval import eval_report
    from porting.model_paths import resolve_hf
    from porting.train.recipe.schema import DataSection

    if bool(hf_src) == bool(ms_dir):
        raise UnknownModelError("port eval: give exactly one of --hf MODEL or --ms DIR")
    model_dir = resolve_hf(hf_src) if hf_src else Path(ms_dir)
    if ms_dir and not model_dir.is_dir():
        raise UnknownModelError(f"{model_dir}: no such directory; expected a `port convert --hf` output directory")
    if ms_dir and not (model_dir / "config.json").is_file():
        raise UnknownModelError(f"{model_dir}: no config.json; expected a `port convert --hf` output directory")
    ref = None if no_reference else (resolve_hf(reference) if reference else (model_dir if hf_src else None))
    try:
        data = DataSection(path=data_path, format=fmt, chat_template=chat_template, max_seq_length=max_seq_length,
                           long_text=long_text, shuffle=False)
    except ValidationError as exc:
        raise RecipeError(f"port eval: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}") from None
    rep = eval_report(model_dir, "hf" if hf_src else "ms", data, batch_size, ref)
    if as_json:
        click.echo(json.dumps(rep, indent=1))
        return
    d, z = rep["data"], rep["zoo"]
    click.echo(f"data {d['path']} ({d['format']}): {z['examples']} examples, {z['tokens']} scored tokens, "
               f"{d['bad_rows']} malformed rows skipped, {d['truncated']} truncated")
    click.echo(f"zoo cell (MindSpore)  mean loss {z['mean_loss']:.6f}  perplexity {z['perplexity']:.4f}")
    if "hf" in rep:
        h = rep["hf"]
        click.echo(f"HF transformers       mean loss {h['mean_loss']:.6f}  perplexity {h['perplexity']:.4f}  "
                   f"|diff| {rep['abs_diff_mean_loss']:.2e}")
