"""Where each file of a run directory lives: one owner of the layout (docs/rundir.md), so no module spells
``"logs"``, ``f"rank_{r}.log"`` or ``"checkpoints"`` itself and a renamed folder is one edit.

    RUN/
      manifest.json  metrics.jsonl  plan.json  rank_table.json   records (porting/rundir/records.py)
      logs/rank_<r>.log                                          each rank's log (porting/rundir/ranklog.py)
      heartbeat/rank_<r>.json                                    each rank's phase and step (porting/rundir/heartbeat.py)
      checkpoints/step_<n>/                                      per-rank checkpoint of step n
      hf/                                                        the HF export
      tensorboard/                                               logging.tensorboard event files
      data_tokens_node<k>.npz                                    the data tokenised once per launch, node k
      incidents.jsonl  incidents/<n>/                            a supervised run's incidents and evidence
      supervise/[node<k>/]                                       the supervisor's launch logs and exchange
      fingerprints/rank_<r>.jsonl  diverge.json                  logging.fingerprint_every; port diverge's verdict

Paths only: nothing here reads, creates or checks a file (the writer and reader do, with their rules).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from porting.rundir.records import MANIFEST_FILE, METRICS_FILE, PLAN_FILE

INCIDENTS_FILE = "incidents.jsonl"
RANK_TABLE_FILE = "rank_table.json"


@dataclass(frozen=True)
class RunDir:
    """A run directory's paths. ``RunDir(path)`` accepts a str or a Path."""

    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))

    def __fspath__(self) -> str:
        return str(self.path)

    # records
    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST_FILE

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def plan(self) -> Path:
        return self.path / PLAN_FILE

    @property
    def rank_table(self) -> Path:
        return self.path / RANK_TABLE_FILE

    # rank logs
    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / rank_log_name(rank)

    def heartbeat(self, rank: int) -> Path:
        return self.path / "heartbeat" / f"rank_{rank}.json"

    # checkpoints and exports
    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def step(self, n: int) -> Path:
        return self.checkpoints / step_name(n)

    @property
    def hf(self) -> Path:
        return self.path / "hf"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    def tokens(self, node: int) -> Path:
        return self.path / f"data_tokens_node{node}.npz"

    # fingerprints (porting/rundir/fingerprints.py) and `port diverge`'s verdict (porting/diverge/)
    @property
    def fingerprints(self) -> Path:
        return self.path / "fingerprints"

    def fingerprint_file(self, rank: int) -> Path:
        return self.fingerprints / f"rank_{rank}.jsonl"

    @property
    def diverge(self) -> Path:
        return self.path / "diverge.json"

    # a supervised run
    @property
    def incidents_file(self) -> Path:
        return self.path / INCIDENTS_FILE

    def incident(self, n: int) -> Path:
        return self.path / "incidents" / str(n)

    @property
    def incidents(self) -> Path:
        return self.path / "incidents"

    def supervise(self, node: int = 0) -> Path:
        """Node 0's supervisor writes to ``supervise/``, node k's to ``supervise/node<k>/``."""
        return self.path / "supervise" / (f"node{node}" if node else "")


def rank_log_name(rank: int) -> str:
    return f"rank_{rank}.log"


def step_name(n: int) -> str:
    return f"step_{n}"
