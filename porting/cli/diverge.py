"""`port diverge RUN_A RUN_B`: the first step, then layer, tensor and phase, where two runs part beyond the noise
their dtype's rounding explains (docs/diverge.md)."""

from __future__ import annotations

import json

import click


@click.command("diverge", epilog="""\b
Examples:
  port train recipes/tiny-cpu.yaml --set execution=pynative --set logging.fingerprint_every=1 --set output_dir=runs/a
  port baseline run --recipe recipes/tiny-cpu.yaml --set logging.fingerprint_every=1 --out base.json
  port diverge runs/a base.json                      # port against its PyTorch baseline
  port diverge runs/a runs/b --json --out runs/a/diverge.json   # `port report runs/a` shows the verdict""")
@click.argument("run_a")
@click.argument("run_b")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--out", default=None, help="Also write the verdict (JSON) here, e.g. RUN_A/diverge.json, which "
                                          "`port report RUN_A` shows beside the loss curve.")
def command(run_a: str, run_b: str, as_json: bool, out: str | None) -> None:
    """Where RUN_A and RUN_B (run directories or baseline files, with fingerprints) part."""
    from model_zoo.files import write_atomic
    from porting.diverge import compare as cmp

    if out is not None:
        _check_out(out)
    verdict = cmp.compare(cmp.locate(run_a), cmp.locate(run_b))
    text = json.dumps(verdict, indent=1)
    if out is not None:
        write_atomic(out, text + "\n", error=cmp.DivergeError)
    click.echo(text if as_json else cmp.words(verdict))


def _check_out(out: str) -> None:
    """--out: a new file or one `port diverge` wrote (never another file), in an existing folder."""
    from pathlib import Path

    from model_zoo.files import read_json_object
    from porting.diverge.compare import DivergeError

    p = Path(out)
    if not p.parent.is_dir():
        raise DivergeError(f"--out {out}: folder {p.parent} does not exist; create it first")
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise DivergeError(f"--out {out}: exists and is not a regular file; name a new file")
    if p.exists():
        doc = read_json_object(p, what="diverge verdict", max_bytes=1 << 20, error=DivergeError)
        if doc.get("format") != "port-diverge":
            raise DivergeError(f"--out {out}: exists and is not a file `port diverge` wrote; name a new file")
