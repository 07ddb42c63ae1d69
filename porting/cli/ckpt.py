"""`port ckpt`: per-rank training checkpoints offline: merge to HF, reshard for another layout."""

from __future__ import annotations

from pathlib import Path

import click


def _checkpoint(path: str) -> Path:
    from porting.train.run.checkpoint.record import require_layout

    p = Path(path)
    require_layout(p)   # one line naming what the directory is and what a checkpoint holds
    return p


def _model_dir(ckdir: Path, model: str | None) -> tuple[Path | None, str]:
    """Where the tokenizer files come from, and a note when none: --model; else the run's model
    (RUN/manifest.json) when it is a zoo name (resolved by the registry) or a folder inside the run. A path
    the manifest names outside the run is not followed (a file the checkpoint came with does not choose
    what port reads)."""
    if model:
        return Path(model), ""
    run = ckdir.resolve().parent.parent
    manifest = run / "manifest.json"
    if not manifest.is_file():
        return None, " (no tokenizer files: pass --model)"
    from model_zoo import presets
    from porting.rundir import read_manifest

    info = read_manifest(manifest).model
    if info.source and presets.known(info.source) and "path" in presets.get(info.source):
        return Path(presets.get(info.source)["path"]), ""
    d = Path(info.dir).resolve() if info.dir else None
    if d is not None and run in d.parents and d.is_dir():
        return d, ""
    return None, (f" (no tokenizer files: {manifest} names the model folder {str(info.dir)[:200]!r} outside the "
                  "run, which port does not follow; pass --model DIR to copy them from it)")


def _outputs(ck: Path, force: bool | None, *outs: Path | None) -> None:
    """Every --out under the one rule (converters.atomic.check_out: a new or empty directory, or one port
    wrote with --force; never a link, never inside the checkpoint or holding it), and never the run being
    merged or a folder that holds it (RUN/hf is fine)."""
    from converters.atomic import check_out, remove_stale
    from converters.convert import MANIFEST
    from model_zoo.errors import CheckpointError

    run = ck.resolve().parent.parent
    for out in outs:
        if out is None:
            continue
        dest = check_out(out, inputs=[ck], force=force, what="a directory port wrote",
                         ours=lambda d: (d / MANIFEST).is_file() or (d / "config.json").is_file())
        if (run / "checkpoints").is_dir() and (dest == run or dest in run.parents):
            raise CheckpointError(f"{out}: is or holds the run {run} being merged; choose an --out outside it "
                                  "(RUN/hf is fine)")
        remove_stale(out)   # temporaries a killed earlier command left for this --out


def _stderr(line: str) -> None:
    click.echo(line, err=True)


@click.group("ckpt", epilog="""\b
Examples:
  port ckpt merge runs/tiny-cpu/checkpoints/step_20 --out tiny-hf
  port ckpt reshard runs/tiny-cpu/checkpoints/step_20 --to recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --set batching.micro_batch_size=2 --out step_20-dp2""")
def command():
    """Per-rank training checkpoints (`port train`): merge to HF, reshard for another layout."""


@command.command("merge", epilog="""\b
Examples:
  port ckpt merge runs/tiny-cpu/checkpoints/step_20 --out tiny-hf
  port ckpt merge runs/tiny-cpu/checkpoints/step_20 --out tiny-hf2 --model checkpoints/my-llama
  port ckpt merge runs/tiny-cpu/checkpoints/step_20 --ms tiny-ms --optimizer   # MindSpore names, + AdamW state
  port ckpt merge runs/lora/checkpoints/step_20 --out lora-adapter --adapter-only --model ./llama3-8b""")
@click.argument("checkpoint")
@click.option("--out", default=None, help="The HF directory to write (must be absent or empty unless --force).")
@click.option("--ms", "ms_out", default=None,
              help="Also (or only) keep a MindSpore directory: MindSpore-named full weights (model.safetensors, "
                   "loads with mindspore.load_checkpoint(format='safetensors')), config.json, tokenizer files.")
@click.option("--optimizer", is_flag=True, help="With --ms: also write optimizer.safetensors (full fp32 adam_m., "
                                                "adam_v., master. tensors) and optimizer.json.")
@click.option("--model", default=None, help="HF directory to take tokenizer files from (default: the run's model "
                                            "when it is a zoo name or inside the run).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out/--ms directory that port wrote.")
@click.option("--adapter-only", is_flag=True, help="A LoRA run's checkpoint: write the PEFT adapter folder only "
                                                   "(adapter_config.json + adapter_model.safetensors), not the merged "
                                                   "model.")
def merge(checkpoint: str, out: str | None, ms_out: str | None, optimizer: bool, model: str | None, force: bool,
          adapter_only: bool):
    """Write the full HF checkpoint (safetensors + config.json + port_manifest.json) and/or a MindSpore
    directory of a training checkpoint, both in one pass over its rank files (--out and --ms: two separate
    directories); one progress line per parameter group on stderr."""
    import sys

    from model_zoo.errors import ConfigError
    from porting.train.run.checkpoint.export import check_apart, merge as do

    if out is None and ms_out is None:
        raise ConfigError("port ckpt merge: pass --out HF_DIR, --ms MS_DIR or both")
    if optimizer and ms_out is None:
        raise ConfigError("port ckpt merge: --optimizer writes beside the MindSpore weights; pass --ms MS_DIR too")
    ck = _checkpoint(checkpoint)
    hf, ms = (Path(out) if out else None), (Path(ms_out) if ms_out else None)
    check_apart(hf, ms)   # before anything is written (issue 51: one folder for both was written, then refused)
    _outputs(ck, force, hf, ms)
    src, note = _model_dir(ck, model)
    from porting.train.run.checkpoint.record import trained_lora

    if trained_lora(ck):   # adapters only: merged over the base, or the adapter alone
        click.echo(_merge_lora(ck, src, hf, ms, adapter_only, force))
        return
    if adapter_only:
        raise ConfigError(f"{ck}: --adapter-only: a full fine-tune's checkpoint holds no adapter (its recipe has no "
                          "lora section)")
    res = do(ck, src, hf_out=hf, ms_out=ms, optimizer=optimizer, command=sys.argv, force=force, log=_stderr)
    click.echo(f"wrote {' and '.join(str(r) for r in res)} from {ck}{note}")


def _merge_lora(ck: Path, base: Path | None, hf: Path | None, ms: Path | None, adapter_only: bool, force: bool) -> str:
    import sys

    from model_zoo.errors import ConfigError
    from porting.train.run.checkpoint import lora_export

    if ms is not None:
        raise ConfigError(f"{ck}: a LoRA checkpoint: --ms is not written (merge to HF with --out, or --adapter-only)")
    if base is None or not (base / "config.json").is_file():
        raise ConfigError(f"{ck}: a LoRA checkpoint holds the adapters only; pass --model BASE_DIR, the HF model it "
                          f"was trained over{lora_export.base_hint(ck)}")
    if adapter_only:
        return f"wrote {lora_export.export_adapter(ck, base, hf, force, _stderr)} (PEFT adapter) from {ck}"
    return f"wrote {lora_export.merge_into_base(ck, base, hf, force, _stderr, sys.argv)} (merged over {base}) from {ck}"


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
    from porting.train.run.checkpoint.merge import reshard as do
    from porting.train import load_recipe

    ck = _checkpoint(checkpoint)
    rec = load_recipe(recipe, list(overrides), check_files=False)
    _outputs(ck, None, Path(out))   # a new or empty directory only
    res = do(ck, rec, Path(out), log=_stderr)
    click.echo(f"wrote {res}: world {rec.world_size}, tensor parallel {rec.parallel.tensor_parallel}, "
               f"optimizer sharding {rec.parallel.optimizer_sharding}")
