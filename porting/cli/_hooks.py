"""The one place the layers above the launch wing are handed down: `port doctor`'s report, `port diagnose`, the
explanation of a failed msrun job and the preflight (porting/job/hooks.py). The launcher, the supervisor and the
preflight's smoke jobs call what :func:`hooks` builds; none of them imports porting/diagnostics/ or
porting/cluster/ itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from model_zoo.errors import PortingError
from porting.job import Hooks, Job


def _doctor() -> dict[str, Any]:
    from porting.diagnostics.doctor import doctor_report

    return doctor_report()


def _diagnose(logs: Path, world: int) -> dict[str, Any]:
    """`port diagnose` on a supervised incident's copied logs."""
    from porting.diagnostics.diagnose import diagnose

    return diagnose(logs, jobs=1, world_size=world)


def _explain(logdir: Path, workers: int) -> str:
    from porting.diagnostics.diagnose import explain_failure

    return explain_failure(logdir, workers)


def _preflight(job: Job, node: int) -> None:
    """porting/cluster/preflight.py's launch checks; the first failure stops the launch in one line."""
    from porting.cluster.preflight import run_train_preflight

    rep = run_train_preflight(job.recipe, job.run.path, node, explain=_explain)
    bad = [c for c in rep["checks"] if c["status"] == "fail"]
    if bad:
        raise PortingError(f"preflight: {bad[0]['check']}: {bad[0]['detail']} (or skip the check: --no-preflight)")
    click.echo("preflight: " + ", ".join(f"{c['check']} {c['status']}" for c in rep["checks"]), err=True)


def hooks(preflight: bool = True) -> Hooks:
    """The hooks of a `port` command (``preflight``: False for --no-preflight)."""
    return Hooks(doctor=_doctor, diagnose=_diagnose, explain=_explain, preflight=_preflight if preflight else None)
