"""`port recipe import`: a CUDA job's configs as a port recipe (porting/intake/recipe_import.py)."""

from __future__ import annotations

import json

import click


@click.group("recipe", epilog="""\b
Examples:
  port recipe import ./job/training_args.bin ./job/ds_z2_config.json --model llama2-7b --out recipe.yaml""")
def command() -> None:
    """Port recipes from what a CUDA job already has."""


@command.command("import", epilog="""\b
Examples:
  port recipe import ./job/training_args.bin ./job/ds_z2_config.json --model llama2-7b --out recipe.yaml
  port recipe import ./job/llama3_full_sft.yaml --cluster atlas-800t-a3 --nodes 2 --data data/train.jsonl --out r.yaml
  port recipe import ./job/args.json --source-gpus 8 --out r.yaml --json""")
@click.argument("configs", nargs=-1, required=True)
@click.option("--out", required=True, help="Recipe to write (YAML; never over an existing file), and beside it "
                                            "NAME.mapping.json: every source key and what it became.")
@click.option("--cluster", type=click.Choice(["atlas-800t-a3", "atlas-800t-a2"]), default="atlas-800t-a3",
              show_default=True, help="The target server.")
@click.option("--nodes", type=click.IntRange(1, 4096), default=1, show_default=True, help="Target servers.")
@click.option("--model", default=None, help="HF directory or zoo name (default: the configs' model_name_or_path).")
@click.option("--data", default=None, help="The training data file (default data/train.jsonl).")
@click.option("--source-gpus", type=click.IntRange(1, 1 << 20), default=None,
              help="GPUs of the CUDA job, when no config says (accelerate's num_processes does).")
@click.option("--json", "as_json", is_flag=True, help="Print the mapping as JSON.")
def import_cmd(configs, out, cluster, nodes, model, data, source_gpus, as_json) -> None:
    """Map every key of CONFIG... (training_args.bin/.json/.yaml, DeepSpeed JSON, accelerate YAML,
    LLaMA-Factory YAML) onto a recipe with the same global batch for the target cluster, or refuse it
    with the reason; the recipe written plans with `port train RECIPE --dry-run`."""
    from porting.intake.recipe_import import Target, import_configs, render

    rep = import_configs(list(configs), out, Target(cluster=cluster, nodes=nodes, model=model, data=data,
                                                    source_gpus=source_gpus))
    click.echo(json.dumps(rep, indent=1) if as_json else render(rep))
