"""What a CUDA log holds beside its training curve: the evaluation loss and the throughput it logged.

* HF ``trainer_state.json``: ``log_history`` rows with ``eval_loss`` (and ``step``), and ``train_tokens_per_second``,
  which transformers logs with ``include_num_input_tokens_seen``: the input tokens of every process (gathered) over
  the time since training started (transformers/trainer.py ``Trainer.log``, ``speed_metrics``);
* LLaMA-Factory ``trainer_log.jsonl``: rows with ``eval_loss`` (``current_steps``), and ``throughput``, the input
  tokens seen over the time since training started (src/llamafactory/train/callbacks.py ``LogCallback.on_log``).

Both throughputs count every device's tokens, padding included unless the run counted non-padding tokens, and the
last logged value is taken (it averages the most time). The readers are the log readers' own, bounded the same way
(:mod:`porting.intake.logs`); a value that is not a finite number in range is left out, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_zoo import files
from porting.baseline.document import Evaluation
from porting.intake import IntakeError
from porting.intake.logs import MAX_DEPTH, MAX_LOG_BYTES, _jsonl_rows
from porting.intake.typed import Num

LOSS = Num(0, 1e6)
SPEED = Num(0, 1e12, low_open=True)
STEP = Num(0, 1e12, whole=True)


@dataclass(frozen=True)
class LogFacts:
    evaluation: Evaluation | None
    tokens_per_s: float | None        # all devices together
    tokens_per_s_source: str | None


def _rows(path: Path) -> list[tuple[object, dict]]:
    """(step, row) of every row of a trainer_state.json or trainer_log.jsonl; [] for another kind of log."""
    if path.name.endswith(".json"):
        doc = files.read_json(path, what="trainer_state.json", max_bytes=MAX_LOG_BYTES, max_depth=MAX_DEPTH,
                              error=IntakeError)
        rows = doc.get("log_history") if isinstance(doc, dict) else None
        return [(r.get("step"), r) for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    if path.name.endswith(".jsonl"):
        return [(r.get("current_steps", r.get("step")), r) for _, r in _jsonl_rows(path, "training log (JSONL)")]
    return []


def read(path: str | Path) -> LogFacts:
    """The evaluation points and the last throughput of ``path`` (a log `port baseline import` reads)."""
    p = Path(path)
    steps: list[int] = []
    losses: list[float] = []
    speed, key = None, None
    for step, row in _rows(p):
        s, e = STEP.check(step), LOSS.check(row.get("eval_loss"))
        if s is not None and e is not None and (not steps or s > steps[-1]):
            steps.append(int(s))
            losses.append(float(e))
        for name in ("train_tokens_per_second", "throughput"):
            if (v := SPEED.check(row.get(name))) is not None:
                speed, key = float(v), name
    ev = Evaluation(step=tuple(steps), loss=tuple(losses), source=f"{p.name} eval_loss") if steps else None
    return LogFacts(ev, speed, f"{p.name} {key} (all devices)" if key else None)
