"""`port compare`: a `port train` run against a `port baseline` file; exits 1 when a tolerance fails."""

from __future__ import annotations

import json

import click


@click.command("compare", epilog="""\b
Examples:
  port compare base.json runs/tiny-cpu
  port compare base.json runs/tiny-cpu --json > compare.json
  port compare h200.json runs/7b --min-throughput-ratio 0.8 --max-memory-ratio 1.2
  port compare base.json runs/other --allow-settings-mismatch
  port compare base.json runs/tiny-cpu --weighted-max 0.01 --weighted-steps 5:20
  port baseline import runs/tiny-cpu/metrics.jsonl --global-batch 4 --out cuda.json && port compare cuda.json runs/tiny-cpu --window 5
  port bisect --baseline base.json runs/tiny-cpu   # then: where the first step beyond tolerance parts""")
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
@click.option("--curve-rtol", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Imported baseline: mean relative loss error allowed (default 0.01).")
@click.option("--first-steps", type=click.IntRange(1), default=None,
              help="Imported baseline: the first steps checked on their own (default 100).")
@click.option("--window", type=click.IntRange(1), default=None,
              help="Imported baseline: logged points per window of the run-long check (default 10).")
@click.option("--spike-k", type=click.FloatRange(0, min_open=True), default=None,
              help="Imported baseline: a spike is beyond k x MAD of its neighbours (default 5).")
@click.option("--mean-rel-max", type=click.FloatRange(0, min_open=True), default=None,
              help="The field's gate: loss mean relative error allowed (default 0.05, the NPU task pool's 5%).")
@click.option("--weighted-max", type=click.FloatRange(0, min_open=True), default=None,
              help="The field's gate: loss-weighted per-step relative error allowed (default 0.02, VeOmni#1034).")
@click.option("--mean-rel-steps", default=None, metavar="FIRST:LAST",
              help="Steps the mean-relative-error gate covers (default: every compared step).")
@click.option("--weighted-steps", default=None, metavar="FIRST:LAST",
              help="Steps the loss-weighted gate covers (default: every compared step).")
@click.option("--eval-max", type=click.FloatRange(0, min_open=True), default=None,
              help="The field's gate: evaluation-loss relative error allowed (default 0.05).")
@click.option("--throughput-min", type=click.FloatRange(0), default=None,
              help="The field's gate: run/baseline tokens/s per device-equivalent at least this (default 0.7; judged "
                   "on a CPU run only when given).")
@click.option("--baseline-devices", type=click.IntRange(1, 1 << 20), default=None,
              help="Imported baseline: the CUDA job's device count, where its files state none (throughput gate).")
@click.option("--cuda-job", default=None, metavar="DIR",
              help="Imported baseline: the CUDA job's folder, read for its effective settings (the settings table).")
@click.option("--bisect", "bisect", is_flag=True,
              help="Deprecated spelling of `port bisect --baseline BASELINE RUNDIR` (still works).")
def command(baseline: str, rundir: str, as_json: bool, out: str | None, loss_rtol: float | None,
            loss_atol: float | None, logits_atol: float | None, min_throughput_ratio: float | None,
            max_memory_ratio: float | None, allow_settings_mismatch: bool, no_probe: bool, curve_rtol: float | None,
            first_steps: int | None, window: int | None, spike_k: float | None, mean_rel_max: float | None,
            weighted_max: float | None, mean_rel_steps: str | None, weighted_steps: str | None,
            eval_max: float | None, throughput_min: float | None, baseline_devices: int | None,
            cuda_job: str | None, bisect: bool) -> None:
    """Compare the port's run RUNDIR with the baseline file BASELINE (measured by `port baseline`, or a
    CUDA run's log imported with `port baseline import`: then the curve-level gate applies). Each check is
    one row (name, measure, value, tolerance, result, detail); exit 1 when one fails."""
    from converters.atomic import check_out, json_of_format
    from model_zoo.errors import ConfigError

    if out:
        # a new file may go into the run directory beside its evidence (as `ops lint --out RUNDIR/...`); an
        # existing one only when it is a comparison port wrote, never the baseline or a run file
        check_out(out, kind="file", inputs=[baseline], ours=json_of_format("port-compare", "port-bisect"),
                  what="a comparison port wrote", error=ConfigError)
    if bisect:
        from porting.cli.bisect import command as bisect_command

        click.echo("note: `port compare BASELINE RUNDIR --bisect` is now `port bisect --baseline BASELINE RUNDIR`; "
                   "the old spelling will be removed in a later release", err=True)
        ctx = click.get_current_context()
        ctx.invoke(bisect_command, rundir=rundir, baseline=baseline, as_json=as_json, out=out,
                   allow_settings_mismatch=allow_settings_mismatch, loss_rtol=loss_rtol, loss_atol=loss_atol)
        return
    from model_zoo.files import write_atomic
    from porting.baseline.compare import run_compare
    from porting.baseline.render import render
    from porting.verify.stats import curve_gate, field_gates

    gate = curve_gate(rtol=curve_rtol, first_steps=first_steps, window=window, spike_k=spike_k)
    spec = field_gates(mean_rel_max=mean_rel_max, weighted_max=weighted_max, eval_max=eval_max,
                       throughput_min=throughput_min, judge_cpu_throughput=throughput_min is not None or None,
                       mean_rel_steps=step_window(mean_rel_steps, "--mean-rel-steps"),
                       weighted_steps=step_window(weighted_steps, "--weighted-steps"))
    side = None
    if cuda_job:
        from porting.intake.job import read_cuda_job

        side = read_cuda_job(cuda_job)
    rep = run_compare(baseline, rundir, allow_settings_mismatch=allow_settings_mismatch, probe=not no_probe, gate=gate,
                      spec=spec, cuda_side=side, baseline_devices=baseline_devices,
                      loss_rtol=loss_rtol, loss_atol=loss_atol, logits_atol=logits_atol,
                      min_throughput_ratio=min_throughput_ratio, max_memory_ratio=max_memory_ratio)
    text = json.dumps(rep.to_dict(), indent=1)
    if out:
        write_atomic(out, text + "\n")
    click.echo(text if as_json else render(rep))
    if not rep.ok:
        raise SystemExit(1)


def step_window(text: str | None, option: str) -> tuple[int, int] | None:
    """``FIRST:LAST`` (whole steps, FIRST <= LAST) as a window of the field's gates; one-line error otherwise."""
    from model_zoo.errors import ConfigError

    if text is None:
        return None
    first, sep, last = text.partition(":")
    if not (sep and first.strip().isdigit() and last.strip().isdigit()) or int(first) > int(last) or len(text) > 24:
        raise ConfigError(f"{option} {text[:24]!r}: expected FIRST:LAST, two step numbers with FIRST <= LAST "
                          "(e.g. 1:100)")
    return int(first), int(last)
