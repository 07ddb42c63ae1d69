"""How one node launches a job: options of the command, not part of the job document (every node's launcher
writes the same ``RUN/job.json``; porting/job/)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Supervision:
    """`port train --supervise`'s settings (porting/launch/session.py)."""

    stall_timeout: float | None
    max_restarts: int
    shrink: bool


@dataclass(frozen=True)
class Launch:
    """How this node launches the job; not part of the job document (every node's launcher writes the same one)."""

    node: int | None = None                  # --launch-node (None: node 0, or every node's command printed)
    resume: bool = False                     # the first launch continues the run's last checkpoint
    supervision: Supervision | None = None   # --supervise
