"""What the launch wing needs from the layers above it, handed down once.

`port doctor`, `port diagnose` and the preflight sit above the launcher (porting/diagnostics/, porting/cluster/),
and the launcher must not import them. The CLI builds one :class:`Hooks` (porting/cli/_hooks.py) and passes it
down with the job; the launcher, the supervisor and the preflight's smoke jobs call what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

Doctor = Callable[[], dict[str, Any]]                 # `port doctor`'s environment report
Diagnose = Callable[[Path, int], dict[str, Any]]      # `port diagnose` on (rank logs, world size)
Explain = Callable[[Path, int], str]                  # why an msrun job failed, in one line (msrun log dir, workers)
Preflight = Callable[[Any, int], None]                # (job, node) -> None, or a PortingError naming the failed check


@dataclass(frozen=True)
class Hooks:
    doctor: Doctor
    diagnose: Diagnose
    explain: Explain
    preflight: Preflight | None = None   # None: --no-preflight
