"""`port eval`: mean token loss and perplexity on held-out data, zoo cell against HF transformers (the library:
:func:`porting.verify.evaluate.run_eval`)."""

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
    """Perplexity and mean token loss of a model on a data file, for the zoo cell and HF (parity); exit 1 when
    the two mean losses differ by more than the float32 loss tolerance."""
    from model_zoo.errors import VerificationError
    from porting.verify.evaluate import render, run_eval

    rep = run_eval(hf=hf_src, ms=ms_dir, data_path=data_path, fmt=fmt, chat_template=chat_template,
                   max_seq_length=max_seq_length, long_text=long_text, batch_size=batch_size, reference=reference,
                   no_reference=no_reference)
    click.echo(json.dumps(rep, indent=1) if as_json else render(rep))
    if rep.get("passed") is False:
        raise SystemExit(VerificationError.exit_code)
