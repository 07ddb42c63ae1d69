"""`port generate`: greedy text from a zoo cell loaded from an HF checkpoint."""

from __future__ import annotations

import click


@click.command("generate", epilog="""\b
Examples:
  port generate --hf stories260k
  port generate --hf stories260k --prompt "Once upon a time" --max-new-tokens 40
  port generate --hf ./my-llama --prompt "def fib(n):" --cache dynamic""")
@click.option("--hf", "hf_src", default="stories260k", show_default=True,
              help="HF model directory, or a zoo name (see `port zoo list`).")
@click.option("--prompt", default="", help="Text to continue (BOS is added as the tokenizer does).")
@click.option("--max-new-tokens", default=60, show_default=True, type=click.IntRange(1, 4096))
@click.option("--cache", "cache_mode", default="static", show_default=True,
              type=click.Choice(["static", "dynamic", "none"]), help="KV cache mode (see `port verify --help`).")
def command(hf_src, prompt, max_new_tokens, cache_mode):
    """Greedy-generate text with the MindSpore zoo cell."""
    from converters.loading import load_hf_dir
    from model_zoo import LlamaConfig, build
    from model_zoo.errors import ConfigError
    from porting.generate import greedy, load_tokenizer
    from porting.sources import resolve_hf

    hf_dir = resolve_hf(hf_src)
    cfg = LlamaConfig.from_hf(hf_dir)
    try:
        tok = load_tokenizer(hf_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{hf_dir}: no usable tokenizer ({str(e).splitlines()[0]}); expected tokenizer.json or "
                          "tokenizer.model beside config.json") from None
    ids = tok.encode(prompt) if prompt else [cfg.bos_token_id if cfg.bos_token_id is not None else 0]
    model = build(cfg)
    load_hf_dir(model, hf_dir)
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else None
    out = greedy(model, ids, max_new_tokens, cache=cache_mode, eos_token_id=eos)
    click.echo(tok.decode(ids + out, skip_special_tokens=True))
