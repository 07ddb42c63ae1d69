"""What `port diagnose` concludes (:class:`Verdict`) and what msrun's scheduler said (:class:`Scheduler`)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The first failing rank (None when none is found), its last step, the reason, its kind
    (oom, exception, crash, device_error, config, operator_error, worker_exit, error, comm_timeout,
    stall, lost, no_output, none) and the evidence events (as printed by ``--json``)."""
    first_failing_rank: int | str | None
    last_step: int | None
    reason: str
    reason_kind: str
    evidence: tuple[dict, ...] = ()
    confidence: str = "medium"        # high | medium | low: how directly the logs point at the rank
    why: str = ""                     # the chain of evidence, in one sentence
    collect_next: tuple[str, ...] = ()  # what to collect or set to be sure
    suspect: dict | None = None       # the entity named (suspect.py): rank, device, host, peer or file
    cause_class: str | None = None    # the cause model's class of the deciding event (cause_model.yaml)
    fault: str | None = None          # the fault inside that class (aicore, aicpu, open, compile, lost, waiter, ...)
    # culprit: a line says who failed (an error of its own, a crimer, a first exit); waiter: only timeouts, the
    # suspect is at best whom someone waited for; inferred: named from others' timeouts and its own silence
    role: str = "culprit"

    def as_dict(self) -> dict[str, Any]:
        return {"first_failing_rank": self.first_failing_rank, "last_step": self.last_step, "reason": self.reason,
                "reason_kind": self.reason_kind, "confidence": self.confidence, "why": self.why,
                "collect_next": list(self.collect_next), "evidence": list(self.evidence),
                "suspect": self.suspect, "cause_class": self.cause_class, "fault": self.fault, "role": self.role}


@dataclasses.dataclass(frozen=True)
class Scheduler:
    """What msrun's scheduler.log says: the ranks it declared timed out, and the 'first' one."""
    timed_out: tuple[int, ...] = ()
    first: int | None = None
