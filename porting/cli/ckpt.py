"""`port ckpt`: per-rank training checkpoints offline: merge to HF, reshard for another layout."""

from __future__ import annotations

from pathlib import Path

import click


def _checkpoint(path: str) -> Path:
    from model_zoo.errors import CheckpointError

    p = Path(path)
    if not (p / "layout.json").is_file():
        raise CheckpointError(f"{p}: no layout.json; expected a per-rank `port train` checkpoint directory "
                              "(RUN/checkpoints/step_N)")
    return p


def _model_dir(ckdir: Path, model: str | None) -> Path | None:
    """Where the tokenizer files come from: --model, else the model the run read (RUN/manifest.json)."""
    if model:
        return Path(model)
    manifest = ckdir.parent.parent / "manifest.json"
    if not manifest.is_file():
        return None
    from porting.rundir import read_manifest

    d = Path(read_manifest(manifest).model.dir)
    return d if d.is_dir() else None


@click.group("ckpt", epilog="""\b
Examples:
  port ckpt merge runs/tiny-cpu/checkpoints/step_20 --out tiny-hf
  port ckpt reshard runs/tiny-cpu/checkpoints/step_20 --to recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --set batching.micro_batch_size=2 --out step_20-dp2""")
def command():
    """Per-rank training checkpoints (`port train`): merge to HF, reshard for another layout."""


@command.command("merge", epilog="""\b
Examples:
  port ckpt merge runs/tiny-cpu/checkpoints/step_20 --out tiny-hf
  port ckpt merge runs/tiny-cpu/checkpoints/step_20 --out tiny-hf2 --model checkpoints/my-llama""")
@click.argument("checkpoint")
@click.option("--out", required=True, help="The HF directory to write (must be absent or empty unless --force).")
@click.option("--model", default=None, help="HF directory to take tokenizer files from (default: the run's model).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out directory.")
def merge(checkpoint: str, out: str, model: str | None, force: bool):
    """Write the full HF checkpoint (safetensors + config.json + port_manifest.json) of a training checkpoint."""
    import sys

    from porting.train.run.export import export_hf

    ck = _checkpoint(checkpoint)
    src = _model_dir(ck, model)
    res = export_hf(ck, src if src is not None else ck, Path(out), command=sys.argv, force=force, user_out=True)
    click.echo(f"wrote {res} from {ck}" + ("" if src else " (no tokenizer files: pass --model)"))


@command.command("reshard", epilog="""\b
Examples:
  port ckpt reshard runs/tiny-cpu/checkpoints/step_20 --to recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --set batching.micro_batch_size=2 --out step_20-dp2""")
@click.argument("checkpoint")
@click.option("--to", "recipe", required=True, help="The recipe whose layout (world, TP, ZeRO) to cut for.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a recipe key (repeatable).")
@click.option("--out", required=True, help="The new checkpoint directory (must not exist).")
def reshard(checkpoint: str, recipe: str, overrides: tuple[str, ...], out: str):
    """Re-cut a checkpoint's weights, fp32 masters and AdamW moments for another layout; put it in a run's
    checkpoints/ as step_N and `port train --resume` continues exactly."""
    from porting.train.run.ckpt_merge import reshard as do
    from porting.train import load_recipe

    from converters.atomic import check_out, remove_stale

    ck = _checkpoint(checkpoint)
    check_out(out, inputs=[ck], force=None)   # the converters' rule: new (or empty), never a link, never the input
    remove_stale(Path(out))                   # temporaries of a killed earlier reshard to this --out
    rec = load_recipe(recipe, list(overrides), check_files=False)
    res = do(ck, rec, Path(out))
    click.echo(f"wrote {res}: world {rec.world_size}, tensor parallel {rec.parallel.tensor_parallel}, "
               f"optimizer sharding {rec.parallel.optimizer_sharding}")
