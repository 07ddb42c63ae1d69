"""`port convert`: HF <-> MindSpore checkpoints, streamed in bounded memory, with a manifest."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from model_zoo.errors import CheckpointError


class _NoBar:
    """What the conversion sees when no bar is shown (tqdm is not even imported: start-up time counts)."""

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, quiet: bool):
    """A byte progress bar on stderr (off when stderr is not a terminal or with --quiet)."""
    if quiet or not sys.stderr.isatty():
        return _NoBar()
    import shutil

    from tqdm import tqdm

    # a terminal that reports 0 columns (some ptys) would get an empty bar
    width = shutil.get_terminal_size(fallback=(100, 24)).columns or 100
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, desc="convert",
                ncols=min(width, 120))


@click.command("convert", epilog="""\b
Examples:
  port convert --hf stories260k --out ./stories-ms
  port convert --hf /models/Llama-2-7b-hf --out ./llama2-7b-ms --dtype bf16
  port convert --hf llama-7b --out ./llama-7b-ms --format ckpt
  port convert --ms ./llama2-7b-ms --out ./llama2-7b-hf
  port convert --ms runs/r1/checkpoints/step_100 --config ./base/config.json --out ./ft-hf
  port convert --hf ./my-model --out ./my-model-ms --force --quiet
  port convert --hf /models/Llama-2-13b-hf --out ./13b-ms --source-hash""")
@click.option("--hf", "hf_src", metavar="SRC", help="HF model directory or zoo name -> MindSpore.")
@click.option("--ms", "ms_src", metavar="DIR", type=click.Path(path_type=Path),
              help="MindSpore checkpoint directory (from `port convert --hf`) -> HF.")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Output directory (created atomically).")
@click.option("--format", "out_format", type=click.Choice(["safetensors", "ckpt"]), default="safetensors",
              show_default=True, help="MindSpore output format (HF output is always safetensors).")
@click.option("--dtype", type=click.Choice(["keep", "bf16", "fp16", "fp32"]), default="keep", show_default=True,
              help="Cast every tensor; keep copies the bytes unchanged.")
@click.option("--config", "config", type=click.Path(path_type=Path, dir_okay=False),
              help="With --ms: the config.json to use when DIR has none (e.g. a training checkpoint).")
@click.option("--source-hash", is_flag=True,
              help="Also record the sha256 of source files whose digest the HF cache or --local-dir download "
                   "metadata does not already give: one more SHA-256 pass over the source. Every output "
                   "tensor's sha256 is always recorded.")
@click.option("--force", is_flag=True, help="Replace --out if it exists and is not empty.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, no summary.")
def command(hf_src: str | None, ms_src: Path | None, out: Path, out_format: str, dtype: str,
            config: Path | None, source_hash: bool, force: bool, quiet: bool) -> None:
    """Convert a checkpoint between HF and MindSpore, one tensor at a time.

    The output holds the weights (sharded like the source, with an index), config.json, the tokenizer
    files and port_manifest.json (sha256 of every output tensor, of the source files where known or
    with --source-hash, the name map, tool versions). Coverage, shapes (against config.json) and
    dtypes are checked before anything is written; the output appears only when complete.
    """
    from converters import convert
    from porting.env import versions
    from porting.model_paths import resolve_hf

    if (hf_src is None) == (ms_src is None):
        raise CheckpointError("give exactly one of --hf SRC (HF -> MindSpore) or --ms DIR (MindSpore -> HF)")
    if hf_src is not None and config is not None:
        raise CheckpointError("--config applies to --ms only; an HF directory carries its own config.json")
    if ms_src is not None and out_format != "safetensors":
        raise CheckpointError("--format applies to HF -> MindSpore only; MindSpore -> HF always writes safetensors")
    if hf_src is not None:
        src = resolve_hf(hf_src)
        plan = convert.build_plan(src, convert.HF_TO_MS, out_format, dtype)
    else:
        if not ms_src.is_dir():
            raise CheckpointError(f"{ms_src}: no such directory; expected a MindSpore checkpoint directory")
        plan = convert.build_plan(ms_src, convert.MS_TO_HF, "safetensors", dtype, config)
    bar = _progress_bar(plan.source.total_bytes, quiet)
    try:
        manifest = convert.execute(plan, out, force=force, progress=bar.update, versions=versions(),
                                   command=["port", *sys.argv[1:]], hash_source=source_hash)
    finally:
        bar.close()
    for note in convert.skipped_companions(plan.source.dir):   # said even with --quiet: a file is missing
        click.echo(f"note: {note}", err=True)
    if not quiet:
        n = len(manifest["tensors"])
        size = sum(f["bytes"] for f in manifest["source"]["files"])
        click.echo(f"{plan.direction.name}: {n} tensors, {len(manifest['output']['files'])} file(s), "
                   f"{size / 2**30:.2f} GiB read -> {out}", err=True)
