"""`port zoo`: the named model sizes, built in and the user's own (`port zoo add`)."""

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
            "user": bool(entry.get("user")),
            "source": (entry.get("path") if entry.get("user") else None) or entry.get("hf_repo")
            or "embedded (model_zoo/assets)"}


def _human(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


@click.group("zoo", epilog="""\b
Examples:
  port zoo list
  port zoo list --json
  port zoo show llama2-13b
  port zoo add my-llama --hf ./checkpoints/my-llama
  port zoo remove my-llama""")
def command():
    """List, show and add the named sizes of the Llama family."""


@command.command("list", epilog="""\b
Examples:
  port zoo list
  port zoo list --json""")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(as_json):
    """Every named size with parameter count and bf16 weight size."""
    from model_zoo import presets
    from model_zoo.errors import ConfigError

    try:
        entries, broken = presets.all_entries(), None
    except ConfigError as e:   # a broken user registry: the built-ins are still listed, then the error
        entries, broken = list(presets.PRESETS), e
    rows = [_row(e) for e in entries]
    _print_rows(rows, as_json)
    if broken is not None:
        raise broken


def _print_rows(rows: list[dict], as_json: bool) -> None:
    from model_zoo import presets

    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{'name':28} {'type':8} {'params':>8} {'bf16':>10} {'layers':>6} {'hidden':>6} "
               f"{'heads/kv':>8} {'vocab':>7}  source")
    for r in rows:
        size = f"{r['bf16_gib']:.2f} GiB" if r["bf16_gib"] >= 0.01 else f"{r['params'] * 2 / 2**20:.2f} MiB"
        name = r["name"] + (" *" if r["user"] else "")
        click.echo(f"{name:28} {r['model_type']:8} {_human(r['params']):>8} {size:>10} {r['layers']:>6} "
                   f"{r['hidden']:>6} {r['heads']:>8} {r['vocab']:>7}  {r['source']}")
    if any(r["user"] for r in rows):
        click.echo(f"* added by you (port zoo add), kept in {presets.user_registry_path()}")


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
    out = {"name": name, "hf_repo": entry.get("hf_repo"), "path": entry.get("path"), "user": bool(entry.get("user")),
           "params": cfg.num_parameters(),
           "config.json": cfg.to_hf()}
    click.echo(json.dumps(out, indent=1))


@command.command("add", epilog="""\b
Examples:
  port zoo add my-llama --hf ./checkpoints/my-llama
  port zoo add r1-8b --hf deepseek-ai/DeepSeek-R1-Distill-Llama-8B   # found in the local HF cache
  port convert --hf my-llama --out ms/my-llama""")
@click.argument("name")
@click.option("--hf", "hf_src", required=True, metavar="DIR|REPO",
              help="an HF model directory holding config.json, or a repo id in the local HF cache")
@click.option("--replace", is_flag=True, help="overwrite an entry of yours with the same name")
def add_cmd(name, hf_src, replace):
    """Record a checkpoint's config.json under NAME in your zoo registry ($PORT_ZOO_FILE)."""
    from pathlib import Path

    from model_zoo import presets
    from model_zoo.config import MAX_CONFIG_JSON_BYTES
    from model_zoo.errors import UnknownModelError
    from model_zoo.files import read_json_object
    from porting.model_paths import find_in_hf_cache, hf_cache_dir

    src = Path(hf_src).expanduser()
    if src.is_dir():
        where, repo, stored = src.resolve(), None, str(src.resolve())
    elif src.exists():
        raise UnknownModelError(f"{src}: is a file; expected an HF model directory holding config.json")
    elif hf_src.count("/") == 1 and not hf_src.startswith((".", "/", "~")):
        where, repo, stored = find_in_hf_cache(hf_src), hf_src, None
        if where is None:
            raise UnknownModelError(f"{hf_src}: no such directory, and not in the local HF cache ({hf_cache_dir()}); "
                                    "pass a local directory or download the repo where there is network")
    else:
        raise UnknownModelError(f"{src}: no such directory; expected an HF model directory or an HF repo id (org/name)")
    hf_config = read_json_object(where / "config.json", what="config.json", max_bytes=MAX_CONFIG_JSON_BYTES)
    entry = presets.add_user(name, hf_config, path=stored, hf_repo=repo, replace=replace)
    cfg = presets.config(name)
    click.echo(f"added {name}: {cfg.model_type}, {_human(cfg.num_parameters())} parameters, from "
               f"{entry['path'] or entry['hf_repo']}; kept in {presets.user_registry_path()}")


@command.command("remove", epilog="""\b
Examples:
  port zoo remove my-llama""")
@click.argument("name")
def remove_cmd(name):
    """Forget a name you added (the checkpoint itself is not touched)."""
    from model_zoo import presets

    path = presets.remove_user(name)
    click.echo(f"removed {name} from {path}")
