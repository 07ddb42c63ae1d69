"""`port report RUNDIR`: the acceptance table of a run (HTML with plots, Markdown, JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("report", epilog="""\b
Examples:
  port report runs/tiny-cpu
  port report runs/llama7b --out /tmp/llama7b-report
  port report runs/tiny-cpu --force                 # replace the earlier report in runs/tiny-cpu/report
  port ops scan --hf stories260k --out runs/tiny-cpu/ops_scan.json && port report runs/tiny-cpu
  port report runs/tiny-cpu --json
  port report runs/tiny-cpu --baseline base.json      # the baseline's loss on the run's loss plot
  port compare base.json runs/tiny-cpu --out runs/tiny-cpu/compare.json && port report runs/tiny-cpu   # its verdict row
  port bisect --hf runs/tiny-cpu/hf --ms runs/tiny-cpu --json > b.json && port report runs/tiny-cpu --bisect b.json""")
@click.argument("rundir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path),
              help="Report directory (default RUNDIR/report): a new or empty directory outside the run "
                   "directory, or an earlier report with --force.")
@click.option("--force", is_flag=True, help="Replace an earlier report (a directory port report wrote) at --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.option("--baseline", type=click.Path(path_type=Path),
              help="A `port baseline` file whose loss is drawn with the run's (default RUNDIR/baseline.json).")
@click.option("--compare", type=click.Path(path_type=Path),
              help="A `port compare --out` file: its verdict row (default RUNDIR/compare.json).")
@click.option("--bisect", type=click.Path(path_type=Path),
              help="A `port bisect --json` file: its verdict row and per-layer error plot (default RUNDIR/bisect.json).")
def command(rundir: Path, out: Path | None, force: bool, as_json: bool, baseline: Path | None,
            compare: Path | None, bisect: Path | None) -> None:
    """Fill every acceptance row (correctness, operators, stability, communication, resources,
    performance, environment) from evidence in the run directory, or mark it missing with the
    command that produces it. Writes report.html (inline SVG plots of loss, step time and memory
    by phase; no network), report.md and report.json. Never replaces a directory port did not write."""
    from porting.report import make_report

    res = make_report(rundir, out, force=force, baseline=baseline, bisect=bisect, compare=compare)
    click.echo(json.dumps(res.to_dict(), indent=2) if as_json else res.text())
