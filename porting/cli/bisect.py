"""`port bisect`: the first layer, block and phase where the MindSpore cell and HF + torch part, on one batch
(`--hf --ms`) or at the first training step beyond a baseline's tolerance (`--baseline BASE RUNDIR`)."""

from __future__ import annotations

import json
import sys

import click


def _ids(text: str | None) -> list[int] | None:
    from model_zoo.errors import ConfigError

    if text is None:
        return None
    try:
        ids = [int(t) for t in text.replace(",", " ").split()[:1 << 16 + 1]]
        if any(not 0 <= i < 1 << 31 for i in ids):
            raise ValueError("not a token id")
        return ids
    except ValueError:
        raise ConfigError(f"--ids {text[:40]!r}: expected token ids separated by spaces or commas") from None


def _mode(hf: str | None, ms: str | None, baseline: str | None, rundir: str | None, msprobe_mapping: str | None,
          data: str | None, ids: str | None) -> str:
    """Which bisection the options ask for: "mapping", "step" or "batch" (one-line ConfigError otherwise)."""
    from model_zoo.errors import ConfigError

    if baseline is not None or rundir is not None:
        if baseline is None or rundir is None or hf is not None or ms is not None:
            raise ConfigError("port bisect --baseline BASE RUNDIR: give both, and neither --hf nor --ms (the run's "
                              "own model and checkpoints are used)")
        return "step"
    if hf is None:
        raise ConfigError("--hf is required (with --ms or --msprobe-mapping); or bisect a run with --baseline BASE RUNDIR")
    if msprobe_mapping:
        return "mapping"
    if ms is None:
        raise ConfigError("--ms is required (a `port convert` output or a `port train` run); or pass --msprobe-mapping")
    if data is not None and ids is not None:
        raise ConfigError("--data and --ids: pass one of them, not both")
    return "batch"


@click.command("bisect", epilog="""\b
Examples:
  port convert --hf stories260k --out sk-ms && port bisect --hf stories260k --ms sk-ms
  port bisect --hf runs/tiny-cpu/hf --ms runs/tiny-cpu --json > bisect.json   # latest checkpoint vs its export
  port bisect --hf runs/tiny-cpu/hf --ms runs/tiny-cpu/checkpoints/step_20 --ids "1 300 52 417 99 12 260 7" --nan-origin
  port bisect --hf runs/tiny-cpu/hf --ms runs/tiny-cpu --seq 16 --dump-layer 2 --dump-dir .
  port bisect --baseline base.json runs/tiny-cpu   # replay the first step beyond tolerance, update included
  port bisect --baseline base.json runs/tiny-cpu --json --out runs/tiny-cpu/bisect.json
  port bisect --hf stories260k --msprobe-mapping cell_mapping.yaml
  port bisect --hf stories260k --msprobe-mapping layer_mapping.yaml --msprobe-kind layer""")
@click.argument("rundir", required=False)
@click.option("--hf", "hf", default=None, help="HF directory or zoo name: the reference weights and config.")
@click.option("--ms", "ms", default=None,
              help="`port convert` output, `port train` run directory (its latest checkpoint) or checkpoints/step_N.")
@click.option("--baseline", default=None,
              help="A `port baseline` file: replay RUNDIR's first step beyond its tolerance on both sides and name the "
                   "layer, block and phase (forward, backward or the AdamW update) where they part (docs/bisect.md).")
@click.option("--data", default=None, help="Text file: the batch is its first tokens (the HF tokenizer).")
@click.option("--ids", default=None, help="Token ids of a one-row batch, space or comma separated.")
@click.option("--batch", type=int, default=2, show_default=True, help="Rows of the probe or --data batch.")
@click.option("--seq", type=int, default=32, show_default=True, help="Tokens per row.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the probe ids.")
@click.option("--dtype", default="float32", show_default=True, help="Compute dtype of both sides.")
@click.option("--nan-origin", is_flag=True, help="Name the first tensor that becomes non-finite instead.")
@click.option("--dump-layer", type=int, default=None, help="Also write this layer's full tensors (both sides).")
@click.option("--dump-dir", default=None, help="Where --dump-layer writes bisect_layer<N>.npz.")
@click.option("--all-rows", is_flag=True, help="Print every row, not only those up to the first divergence.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", default=None, help="Also write the JSON report to this file (for `port report --bisect`).")
@click.option("--allow-settings-mismatch", is_flag=True, help="With --baseline: compare even when settings differ.")
@click.option("--loss-rtol", type=float, default=None, help="With --baseline: override the relative loss tolerance.")
@click.option("--loss-atol", type=float, default=None, help="With --baseline: override the absolute loss tolerance.")
@click.option("--msprobe-mapping", default=None, help="Write msprobe's cell/layer mapping YAML here (no run).")
@click.option("--msprobe-kind", type=click.Choice(["cell", "layer"]), default="cell", show_default=True,
              help="msprobe's -cm cell_mapping or -lm layer_mapping form.")
def command(rundir: str | None, hf: str | None, ms: str | None, baseline: str | None, data: str | None,
            ids: str | None, batch: int, seq: int, seed: int, dtype: str, nan_origin: bool, dump_layer: int | None,
            dump_dir: str | None, all_rows: bool, as_json: bool, out: str | None, allow_settings_mismatch: bool,
            loss_rtol: float | None, loss_atol: float | None, msprobe_mapping: str | None, msprobe_kind: str) -> None:
    """Run one forward and backward of the same batch from the same weights in HF + torch and in the zoo's
    MindSpore cell, compare every layer's sub-blocks (forward activations, activation gradients, parameter
    gradients; with --baseline also the AdamW update), and name the first tensor beyond the dtype's
    tolerance. Exit 1 when one is found."""
    mode = _mode(hf, ms, baseline, rundir, msprobe_mapping, data, ids)
    if mode == "mapping":
        from porting.bisect.msprobe import write_mapping
        from porting.diagnostics.doctor import msprobe_note
        from porting.env import package_version
        from porting.model_paths import resolve_hf

        click.echo(write_mapping(resolve_hf(hf), msprobe_mapping, msprobe_kind))
        note = msprobe_note(package_version("mindspore"))   # msprobe's own version table (docs/versions.md)
        if note:
            click.echo(note, err=True)
        return
    from porting.bisect.render import render

    if mode == "step":
        from porting.bisect.step import bisect_step

        rep = bisect_step(baseline, rundir, allow_settings_mismatch=allow_settings_mismatch, loss_rtol=loss_rtol,
                          loss_atol=loss_atol)
    else:
        from porting.bisect.run import bisect
        from porting.model_paths import resolve_hf

        rep = bisect(resolve_hf(hf), ms, ids=_ids(ids), data=data, dtype=dtype, batch=batch, seq=seq, seed=seed,
                     nan_origin=nan_origin, dump_layer=dump_layer, dump_dir=dump_dir)
    if out:
        from model_zoo.files import write_atomic

        write_atomic(out, json.dumps(rep, indent=1) + "\n")
    click.echo(json.dumps(rep, indent=1) if as_json else render(rep, all_rows=all_rows, color=sys.stdout.isatty()))
    if (rep["first_nonfinite"] if nan_origin else rep["first_divergent"]) is not None:
        raise SystemExit(1)
