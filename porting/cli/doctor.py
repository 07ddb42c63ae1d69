"""`port doctor`: environment record and compatibility checks (works without an NPU)."""

from __future__ import annotations

import json

import click


@click.command("doctor", epilog="""\b
Examples:
  port doctor
  port doctor --json > env.json
  HCCL_EXEC_TIMEOUT=600 port doctor""")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(as_json: bool) -> None:
    """Versions (NPU, driver, firmware, CANN, MindSpore, MindSpeed, torch, torch_npu, transformers,
    Python), known-incompatible pairs, and the Ascend/HCCL environment knobs in effect with their
    documented defaults. Exits 1 when a check fails."""
    from model_zoo.errors import VerificationError
    from porting.diagnostics.doctor import doctor_report, render_text

    rep = doctor_report()
    click.echo(json.dumps(rep, indent=2, default=str) if as_json else render_text(rep))
    if not rep["ok"]:
        bad = [c for c in rep["checks"] if c["status"] == "fail"]
        raise VerificationError(f"doctor: {len(bad)} check(s) failed; first: {bad[0]['check']}: {bad[0]['detail']}")
