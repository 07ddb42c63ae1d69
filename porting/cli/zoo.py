"""`port zoo`: the named model sizes."""

from __future__ import annotations

import json

import click


def _row(entry: dict) -> dict:
    from model_zoo import presets

    cfg = presets.config(entry["name"])
    n = cfg.num_parameters()
    return {"name": entry["name"], "model_type": cfg.model_type, "params": n,
            "bf16_gib": n * 2 / 2**30, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
            "heads": f"{cfg.num_attention_heads}/{cfg.num_key_value_heads}", "vocab": cfg.vocab_size,
            "source": entry.get("hf_repo") or "embedded (model_zoo/assets)"}


def _human(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


@click.group("zoo", epilog="""\b
Examples:
  port zoo list
  port zoo list --json
  port zoo show llama2-13b""")
def command():
    """List and show the named sizes of the Llama family."""


@command.command("list", epilog="""\b
Examples:
  port zoo list
  port zoo list --json""")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(as_json):
    """Every named size with parameter count and bf16 weight size."""
    from model_zoo import presets

    rows = [_row(e) for e in presets.PRESETS]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{'name':16} {'type':8} {'params':>8} {'bf16':>10} {'layers':>6} {'hidden':>6} "
               f"{'heads/kv':>8} {'vocab':>7}  source")
    for r in rows:
        size = f"{r['bf16_gib']:.2f} GiB" if r["bf16_gib"] >= 0.01 else f"{r['params'] * 2 / 2**20:.2f} MiB"
        click.echo(f"{r['name']:16} {r['model_type']:8} {_human(r['params']):>8} {size:>10} {r['layers']:>6} "
                   f"{r['hidden']:>6} {r['heads']:>8} {r['vocab']:>7}  {r['source']}")


@command.command("show", epilog="""\b
Examples:
  port zoo show llama-7b
  port zoo show stories260k""")
@click.argument("name")
def show_cmd(name):
    """The full config.json of one named size."""
    from model_zoo import presets

    entry = presets.get(name)
    cfg = presets.config(name)
    out = {"name": name, "hf_repo": entry.get("hf_repo"), "params": cfg.num_parameters(),
           "config.json": cfg.to_hf()}
    click.echo(json.dumps(out, indent=1))
