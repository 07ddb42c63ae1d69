"""`port rehearse`: the migration's acceptance ladder at the recipe's shape, scaled to this machine."""

from __future__ import annotations

from pathlib import Path

import click

from model_zoo.errors import PortingError


@click.command("rehearse", epilog="""\b
Examples:
  port rehearse recipes/tiny-cpu.yaml --out runs/rh --rungs single && port report runs/rh
  port rehearse recipes/13b-32card.yaml --out runs/rehearse-13b --dry-run   # TP 2 x DP 2, ZeRO, two node ranks
  port rehearse recipes/13b-32card.yaml --out runs/rehearse-13b             # the whole ladder (minutes)""")
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="A new folder for the rehearsal (rungs' run directories, logs, rehearse.json).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a key of RECIPE before it is scaled (repeatable).")
@click.option("--rung-set", "extra", multiple=True, metavar="KEY=VALUE",
              help="Override a key of every training rung's scaled recipe (repeatable).")
@click.option("--rungs", default="single,parity,node,links,compute,two-nodes", show_default=True,
              help="Comma-separated rungs to run, in ladder order.")
@click.option("--dry-run", is_flag=True, help="Print the small model and each rung's layout; run nothing.")
@click.option("--rung-timeout", default=600, show_default=True, type=click.IntRange(10, 86_400),
              help="Seconds one rung may take before it is stopped and diagnosed.")
def command(recipe: str, out: Path, overrides: tuple[str, ...], extra: tuple[str, ...], rungs: str,
            dry_run: bool, rung_timeout: int) -> None:
    """Run RECIPE's architecture and parallel layout, scaled to this machine, up the acceptance ladder:
    one device, parity with HF transformers, one node with the recipe's groups, their collectives' bandwidth,
    two node ranks. Stops at the
    first failing rung with its diagnosis; exit 0 only when every rung that ran passed."""
    from porting.rehearse import RUNGS, format_rungs, plan_text, rehearse

    asked = tuple(r.strip() for r in rungs.split(",") if r.strip())
    bad = [r for r in asked if r not in RUNGS]
    if bad or not asked:
        raise PortingError(f"--rungs {rungs}: unknown rung(s) {bad or '(none given)'}; choose from {', '.join(RUNGS)}")
    if dry_run:
        click.echo(plan_text(recipe, list(overrides), asked))
        return
    result = rehearse(recipe, out, list(overrides), rung_timeout=rung_timeout, only=asked, extra=list(extra))
    click.echo(format_rungs(result))
    failed = [r for r in result if r.status == "fail"]
    click.echo(f"rehearsal written to {out}/rehearse.json; `port report {out}` shows it")
    if failed:
        raise PortingError(f"rehearse: rung {failed[0].name} failed: {failed[0].detail} (logs: {out}/logs/"
                           f"{failed[0].name}.log)")
