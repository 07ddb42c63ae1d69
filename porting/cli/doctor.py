"""`port doctor`: environment record and compatibility checks (works without an NPU); with
``--cluster RECIPE`` the preflight of a distributed job (porting/cluster/preflight.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("doctor", epilog="""\b
Examples:
  port doctor
  port doctor --json > env.json
  HCCL_EXEC_TIMEOUT=600 port doctor
  port doctor --cluster recipes/tiny-cpu.yaml --set cluster.devices_per_node=2 --set cluster.master_port=29517
  port doctor --cluster recipes/13b-32card.yaml --node-rank 1 --fingerprint-dir /shared/port_fp --no-smoke""")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--cluster", "recipe", type=click.Path(path_type=Path), default=None,
              help="Preflight for this `port train` recipe: ports, master, rank table, stale processes, env, smoke.")
@click.option("--set", "overrides", multiple=True, help="Recipe override key.path=value (with --cluster).")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True, help="This node's rank.")
@click.option("--fingerprint-dir", type=click.Path(path_type=Path), default=None,
              help="A directory every node can write: nodes leave their env fingerprint, node 0 compares.")
@click.option("--rank-table", type=click.Path(path_type=Path), default=None, help="Rank table (else the recipe's).")
@click.option("--smoke/--no-smoke", default=True, show_default=True, help="Run the all-reduce smoke test under msrun.")
def command(as_json: bool, recipe: Path | None, overrides: tuple[str, ...], node_rank: int,
            fingerprint_dir: Path | None, rank_table: Path | None, smoke: bool) -> None:
    """Versions (NPU, driver, firmware, CANN, MindSpore, MindSpeed, torch, torch_npu, transformers,
    Python), known-incompatible pairs, and the Ascend/HCCL environment knobs in effect with their
    documented defaults. Exits 1 when a check fails."""
    from model_zoo.errors import VerificationError

    if recipe is not None:
        from porting.cluster.preflight import render_preflight, run_preflight
        from porting.diagnostics.diagnose import explain_failure

        rep = run_preflight(recipe, node_rank=node_rank, fingerprint_dir=fingerprint_dir,
                            rank_table=str(rank_table) if rank_table else None, smoke=smoke, overrides=list(overrides),
                            explain=explain_failure)
        click.echo(json.dumps(rep, indent=2, default=str) if as_json else render_preflight(rep))
        bad = [c for c in rep["checks"] if c["status"] == "fail"]
        if bad:
            raise VerificationError(f"doctor --cluster: {len(bad)} check(s) failed; first: {bad[0]['check']}: "
                                    f"{bad[0]['detail']}")
        return
    from porting.diagnostics.doctor import doctor_report, render_text

    rep = doctor_report()
    click.echo(json.dumps(rep, indent=2, default=str) if as_json else render_text(rep))
    if not rep["ok"]:
        bad = [c for c in rep["checks"] if c["status"] == "fail"]
        raise VerificationError(f"doctor: {len(bad)} check(s) failed; first: {bad[0]['check']}: {bad[0]['detail']}")
