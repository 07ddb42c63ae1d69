"""`port intake`: a CUDA job's folder (configs, loss log, scripts) as a migration folder (porting/intake/job.py)."""

from __future__ import annotations

import json

import click


@click.command("intake", epilog="""\b
Examples:
  port intake ./cuda_job --out ./migration --model llama2-7b
  port intake ./cuda_job --out ./migration --cluster atlas-800t-a3 --nodes 2 --source-gpus 8 --json""")
@click.argument("job_dir")
@click.option("--out", required=True, help="Migration folder to create (must not exist or be empty; written whole).")
@click.option("--cluster", type=click.Choice(["atlas-800t-a3", "atlas-800t-a2"]), default="atlas-800t-a3",
              show_default=True, help="The target server.")
@click.option("--nodes", type=click.IntRange(1, 4096), default=1, show_default=True, help="Target servers.")
@click.option("--model", default=None, help="HF directory or zoo name (default: the configs' model_name_or_path).")
@click.option("--data", default=None, help="The training data file for the recipe (default data/train.jsonl).")
@click.option("--source-gpus", type=click.IntRange(1, 1 << 20), default=None,
              help="GPUs of the CUDA job, when no config says.")
@click.option("--loss-tag", "loss_tag", default=None, metavar="TAG",
              help="The TensorBoard scalar that holds the training loss, when the job's event file names it "
                   "its own way (as `port baseline --import --loss-tag`).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def command(job_dir, out, cluster, nodes, model, data, source_gpus, loss_tag, as_json) -> None:
    """Import JOB_DIR's configs as a recipe, its loss log as a baseline and scan its scripts; write them with
    a README of the next commands into --out."""
    from porting.intake.job import run_intake
    from porting.intake.recipe_import import Target

    s = run_intake(job_dir, out, Target(cluster=cluster, nodes=nodes, model=model, data=data, source_gpus=source_gpus),
                   loss_tag)
    if as_json:
        click.echo(json.dumps(s, indent=1))
        return
    click.echo(f"wrote {s['out']}: " + ", ".join(
        x for x in (f"recipe.yaml (global batch {s['recipe']['global_batch']['value']})" if "recipe" in s else "no recipe",
                    f"baseline.json ({s['baseline']['points']} points)" if "baseline" in s else "no baseline",
                    f"script_scan.json ({s['scan']['findings']} CUDA habits)" if "scan" in s else "no scripts",
                    "README.md")))
    from porting.intake.typed import name

    for n in s["notes"]:
        click.echo(f"note: {name(n)}", err=True)   # one line each: a name holding a newline is shown escaped
