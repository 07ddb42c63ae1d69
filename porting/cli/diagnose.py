"""`port diagnose LOGDIR`: which rank stopped first in a failed or hung distributed job, and why."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("diagnose", epilog="""\b
Examples:
  port diagnose ./msrun_logs                 # msrun --log_dir of a failed job
  port diagnose runs/llama7b/logs --json     # a `port train` run's logs
  port diagnose ~/ascend/log --json --out diagnosis.json
  port diagnose runs/x/logs --world-size 16   # ranks with no log at all count too
  port diagnose ./pasted_logs --rank-table rank_table.json   # socket peers mapped to ranks""")
@click.argument("logdir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
@click.option("--out", type=click.Path(path_type=Path), help="Also write the JSON diagnosis to this file.")
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="Expected number of ranks: ranks without any log count as silent.")
@click.option("--rank-table", type=click.Path(path_type=Path), default=None,
              help="The job's rank table: peer addresses in socket/connect timeouts are mapped to ranks.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Worker processes for large directories (default: CPUs).")
def command(logdir: Path, as_json: bool, out: Path | None, world_size: int | None, rank_table: Path | None,
            jobs: int | None) -> None:
    """Align per-rank logs (msrun worker/scheduler, `port train` rank logs, CANN plogs) on one
    timeline; name the first rank that stopped progressing, its last step and the reason, telling
    the cause from the other ranks' timeouts; explain Ascend/HCCL/torch_npu error codes. With logs
    of only some ranks (torch_npu watchdog SeqNum, EI0002 remote rank, HCCL heartbeat reports,
    socket peers), name the suspect with a confidence, why, and what to collect next."""
    from porting.diagnostics.diagnose import diagnose
    from porting.diagnostics.render import render_text, write_json

    if out:   # the converters' rule: new, or a diagnosis port wrote; never a log or a file of the user's
        from converters.atomic import check_out, json_of_format
        from porting.diagnostics import DiagnosticsError

        check_out(out, kind="file", inputs=[logdir] + ([rank_table] if rank_table else []),
                  ours=json_of_format("port-diagnose"), what="a diagnosis port wrote", error=DiagnosticsError)
    result = diagnose(logdir, jobs=jobs, world_size=world_size, rank_table=rank_table)
    if out:
        write_json(result, out)
    click.echo(json.dumps(result, indent=2, default=str) if as_json else render_text(result))
