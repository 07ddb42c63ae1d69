"""Bounded readers of the training logs a CUDA team already has, each into one :class:`Curve`.

* HF ``trainer_state.json``: ``log_history`` rows with a ``loss`` (training rows; eval rows and the
  final summary are skipped), written by ``transformers.Trainer`` every ``logging_steps`` with the loss
  averaged over those steps (transformers/trainer.py ``_maybe_log_save_evaluate``).
* LLaMA-Factory ``trainer_log.jsonl``: one JSON object a line with ``current_steps``, ``loss``,
  ``lr``/``learning_rate`` (LlamaFactory src/llamafactory/train/callbacks.py ``LogCallback``).
* a plain CSV or JSONL of ``step,loss[,grad_norm,lr,tokens]`` (``port train``'s ``metrics.jsonl`` is one).
* TensorBoard event files: :mod:`porting.intake.tfevents`.

Every reader is bounded in bytes, lines, points and nesting depth, and every refusal is one
:class:`IntakeError` line naming the file (and line or key), what was expected and what to do.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from model_zoo import files
from porting.intake import IntakeError, tfevents
from porting.intake.curve import SERIES, Curve, _num
from porting.intake.typed import Num

MAX_LOG_BYTES = 256 << 20      # 8,712 logged steps of a 3-epoch 7B run: 0.2 MB; a million points stay far below
MAX_LINE_BYTES = 1 << 16
MAX_DEPTH = 16                 # a trainer_state.json nests 3 levels
SETTING = Num(0, 1e12)         # a setting a log states (steps, epochs, batch): finite, never a boolean




def _read(path: Path, what: str) -> str:
    return files.read_text(path, what=what, max_bytes=MAX_LOG_BYTES, error=IntakeError)


# ----------------------------------------------------------------------------------------- HF Trainer
TRAINER_STATE_SETTINGS = {"global_step": "global_step", "max_steps": "max_steps", "logging_steps": "logging_steps",
                          "num_train_epochs": "num_train_epochs", "train_batch_size": "train_batch_size_per_process",
                          "eval_steps": "eval_steps", "save_steps": "save_steps"}


def read_trainer_state(path: Path) -> Curve:
    """``trainer_state.json`` as HF ``Trainer`` writes it (``TrainerState.save_to_json``)."""
    doc = files.read_json(path, what="trainer_state.json", max_bytes=MAX_LOG_BYTES, max_depth=MAX_DEPTH, error=IntakeError)
    if not isinstance(doc, dict) or not isinstance(doc.get("log_history"), list):
        raise IntakeError(f"{path}: no log_history list; expected the trainer_state.json that transformers.Trainer "
                          "writes into output_dir and each checkpoint-N/")
    c = Curve(path, "hf-trainer-state")
    for i, row in enumerate(doc["log_history"]):
        where = f"{path}: log_history[{i}]"
        if not isinstance(row, dict):
            raise IntakeError(f"{where}: expected an object, found {type(row).__name__}")
        if "loss" not in row:   # eval rows (eval_loss), the final train_loss summary
            c.skipped["not a training row"] = c.skipped.get("not a training row", 0) + 1
            continue
        c.add(row.get("step"), where, loss=row.get("loss"), grad_norm=row.get("grad_norm"),
              lr=row.get("learning_rate"), tokens=row.get("num_input_tokens_seen"))
    for key, name in TRAINER_STATE_SETTINGS.items():
        if (v := SETTING.check(doc.get(key))) is not None:   # the typed reader's rule; anything else is not recorded
            c.recovered[name] = v
    return c


# ----------------------------------------------------------------------------------------- JSON lines
def _jsonl_rows(path: Path, what: str):
    text = _read(path, what)
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{path}: line {n}"
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise IntakeError(f"{where}: longer than {MAX_LINE_BYTES:,} characters; expected one small JSON object a line")
        row = files.parse_json(line, where=where, what="JSON line", max_depth=MAX_DEPTH, error=IntakeError)
        if not isinstance(row, dict):
            raise IntakeError(f"{where}: expected a JSON object, found {type(row).__name__}")
        yield where, row


def read_jsonl(path: Path) -> Curve:
    """LLaMA-Factory ``trainer_log.jsonl`` (``current_steps``) or a plain JSONL of ``step``/``loss`` rows."""
    c: Curve | None = None
    for where, row in _jsonl_rows(path, "training log (JSONL)"):
        if c is None:
            if "current_steps" in row:
                c = Curve(path, "llamafactory-jsonl")
            elif "step" in row:
                c = Curve(path, "jsonl")
            else:
                raise IntakeError(f"{where}: no 'step' or 'current_steps' key; expected LLaMA-Factory's trainer_log.jsonl "
                                  "or one {\"step\": N, \"loss\": X} object a line")
        if c.fmt == "llamafactory-jsonl":
            if row.get("loss") is None:   # eval / predict rows carry loss null
                c.skipped["no training loss"] = c.skipped.get("no training loss", 0) + 1
                continue
            c.add(row.get("current_steps"), where, loss=row.get("loss"), grad_norm=row.get("grad_norm"),
                  lr=row.get("lr", row.get("learning_rate")), tokens=row.get("total_tokens"))
            if (v := SETTING.check(row.get("total_steps"))) is not None:
                c.recovered["max_steps"] = v
        else:
            if "loss" not in row:
                c.skipped["no loss"] = c.skipped.get("no loss", 0) + 1
                continue
            c.add(row.get("step"), where, **{k: row.get(k) for k in SERIES})
    if c is None:
        raise IntakeError(f"{path}: empty log; expected one JSON object a line with step and loss")
    return c


# ----------------------------------------------------------------------------------------- CSV
def read_csv(path: Path) -> Curve:
    """A CSV with a header naming ``step`` and ``loss`` (optional ``grad_norm``, ``lr``, ``tokens``)."""
    text = _read(path, "training log (CSV)")
    csv.field_size_limit(MAX_LINE_BYTES)
    reader = csv.reader(io.StringIO(text), delimiter="\t" if path.name.lower().endswith(".tsv") else ",")
    try:
        header = [h.strip().lower() for h in next(reader)]
    except StopIteration:
        raise IntakeError(f"{path}: empty CSV; expected a header line step,loss[,grad_norm,lr,tokens]") from None
    except csv.Error as e:
        raise IntakeError(f"{path}: line 1: not CSV ({e})") from None
    alias = {"learning_rate": "lr", "global_step": "step", "train_loss": "loss", "grad-norm": "grad_norm"}
    header = [alias.get(h, h) for h in header]
    if "step" not in header or "loss" not in header:
        raise IntakeError(f"{path}: header {header[:8]} lacks step or loss; expected step,loss[,grad_norm,lr,tokens]")
    idx = {k: header.index(k) for k in ("step",) + SERIES if k in header}
    c = Curve(path, "csv")
    try:
        for n, row in enumerate(reader, 2):
            if not row:
                continue
            where = f"{path}: line {n}"
            if len(row) != len(header):
                raise IntakeError(f"{where}: {len(row)} fields, the header has {len(header)}")
            c.add(_num(row[idx["step"]], where, "step"), where, **{k: row[i] for k, i in idx.items() if k != "step"})
    except csv.Error as e:
        raise IntakeError(f"{path}: not CSV ({e}); expected step,loss[,grad_norm,lr,tokens] rows") from None
    return c


def _per_step_tokens_to_seen(c: Curve) -> None:
    """A plain log's ``tokens`` are the step's own (as in port's metrics.jsonl); the curve keeps tokens
    seen so far, which needs every step logged."""
    if not c.has("tokens"):
        return
    if c.logging_interval != 1 or c.step[0] != 1 or any(t is None for t in c.tokens):
        c.tokens = [None] * len(c.step)
        c.skipped["tokens (not logged every step)"] = 1
        return
    total = 0
    for i, t in enumerate(c.tokens):
        total += t
        c.tokens[i] = total


# ----------------------------------------------------------------------------------------- dispatch
def read_log(path: str | Path, loss_tag: str | None = None) -> Curve:
    """The curve of one log file, its format told by name and content; at least one finite loss.
    ``loss_tag`` names a TensorBoard file's loss scalar (the other formats have fixed keys)."""
    p = Path(path)
    if p.is_dir():
        raise IntakeError(f"{p}: is a directory; pass the log file itself (trainer_state.json, trainer_log.jsonl, "
                          "events.out.tfevents.*, a CSV)")
    name = p.name.lower()
    if loss_tag is not None and "tfevents" not in name:
        raise IntakeError(f"{p}: --loss-tag names a TensorBoard scalar; this is not an events.out.tfevents.* file "
                          "(drop --loss-tag: the loss key of trainer_state.json, JSONL and CSV logs is 'loss')")
    if "tfevents" in name:
        c = tfevents.read_scalars(p, loss_tag)
    elif name.endswith(".json"):
        c = read_trainer_state(p)
    elif name.endswith(".jsonl"):
        c = read_jsonl(p)
    elif name.endswith((".csv", ".tsv")):
        c = read_csv(p)
    else:
        raise IntakeError(f"{p}: unknown log type; expected trainer_state.json, a .jsonl (LLaMA-Factory trainer_log.jsonl "
                          "or step/loss rows), a .csv with step,loss, or a TensorBoard events.out.tfevents.* file")
    if c.fmt in ("csv", "jsonl"):
        _per_step_tokens_to_seen(c)
    if not c.has("loss"):
        raise IntakeError(f"{p}: no finite training loss in the log ({sum(c.skipped.values())} rows skipped: "
                          f"{', '.join(c.skipped) or 'none'}); expected logged training steps")
    return c
