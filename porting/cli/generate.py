"""`port generate`: greedy text from a zoo cell loaded from an HF checkpoint."""

from __future__ import annotations

import click

from porting.verify.generation import CACHE_MODES


@click.command("generate", epilog="""\b
Examples:
  port generate --hf stories260k
  port generate --hf stories260k --prompt "Once upon a time" --max-new-tokens 40
  port generate --hf ./my-llama --prompt "def fib(n):" --cache dynamic""")
@click.option("--hf", "hf_src", default="stories260k", show_default=True,
              help="HF model directory, or a zoo name (see `port zoo list`).")
@click.option("--prompt", default="", help="Text to continue (BOS is added as the tokenizer does).")
@click.option("--max-new-tokens", default=60, show_default=True, type=click.IntRange(1, 4096))
@click.option("--cache", "cache_mode", default="static", show_default=True, type=click.Choice(CACHE_MODES),
              help="KV cache mode (see `port verify --help`).")
def command(hf_src: str, prompt: str, max_new_tokens: int, cache_mode: str) -> None:
    """Greedy-generate text with the MindSpore zoo cell."""
    from porting.verify.generation import generate_text
    from porting.model_paths import resolve_hf

    click.echo(generate_text(resolve_hf(hf_src), prompt, max_new_tokens, cache=cache_mode).text)
