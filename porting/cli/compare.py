"""`port compare`: a `port train` run against a `port baseline` file; exits 1 when a tolerance fails."""

from __future__ import annotations

import json
import sys

import click


@click.command("compare", epilog="""\b
Examples:
  port compare base.json runs/tiny-cpu
  port compare base.json runs/tiny-cpu --json > compare.json
  port compare h200.json runs/7b --min-throughput-ratio 0.8 --max-memory-ratio 1.2
  port compare base.json runs/other --allow-settings-mismatch
  port compare base.json runs/tiny-cpu --bisect   # replay the first step beyond tolerance, update included""")
@click.argument("baseline")
@click.argument("rundir")
@click.option("--json", "as_json", is_flag=True, help="Print the full comparison as JSON instead of the table.")
@click.option("--out", default=None, help="Also write the JSON comparison to this file (for `port report`).")
@click.option("--loss-rtol", type=float, default=None, help="Override the relative loss tolerance.")
@click.option("--loss-atol", type=float, default=None, help="Override the absolute loss tolerance.")
@click.option("--logits-atol", type=float, default=None, help="Override the probe logits max-abs tolerance.")
@click.option("--min-throughput-ratio", type=float, default=None, help="Fail when run/baseline tokens/s is lower.")
@click.option("--max-memory-ratio", type=float, default=None, help="Fail when run/baseline peak memory is higher.")
@click.option("--allow-settings-mismatch", is_flag=True, help="Compare even when batch, sequence, data or seed differ.")
@click.option("--no-probe", is_flag=True, help="Skip the probe-logits check (no MindSpore model load).")
@click.option("--bisect", "bisect", is_flag=True,
              help="Replay the first step beyond tolerance on both sides and name the layer, block and phase "
                   "(forward, backward or the AdamW update) where they part (docs/bisect.md).")
def command(baseline: str, rundir: str, as_json: bool, out: str | None, loss_rtol: float | None,
            loss_atol: float | None, logits_atol: float | None, min_throughput_ratio: float | None,
            max_memory_ratio: float | None, allow_settings_mismatch: bool, no_probe: bool, bisect: bool) -> None:
    """Compare the port's run RUNDIR with the baseline file BASELINE."""
    from model_zoo.files import write_atomic

    if bisect:
        from porting.bisect.render import render as render_bisect
        from porting.bisect.step import bisect_step

        rep = bisect_step(baseline, rundir, allow_settings_mismatch=allow_settings_mismatch, loss_rtol=loss_rtol,
                          loss_atol=loss_atol)
        if out:
            write_atomic(out, json.dumps(rep, indent=1) + "\n")
        click.echo(json.dumps(rep, indent=1) if as_json else render_bisect(rep, color=sys.stdout.isatty()))
        if rep["first_divergent"] is not None:
            raise SystemExit(1)
        return
    from porting.baseline.compare import render, run_compare

    rep = run_compare(baseline, rundir, allow_settings_mismatch=allow_settings_mismatch, probe=not no_probe,
                      loss_rtol=loss_rtol, loss_atol=loss_atol, logits_atol=logits_atol,
                      min_throughput_ratio=min_throughput_ratio, max_memory_ratio=max_memory_ratio)
    if out:
        write_atomic(out, json.dumps(rep, indent=1) + "\n")
    click.echo(json.dumps(rep, indent=1) if as_json else render(rep))
    if not rep["ok"]:
        raise SystemExit(1)
