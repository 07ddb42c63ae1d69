"""`port baseline import LOG`: a CUDA run's own loss log as a `port baseline` file.

The document has the same format as the one `port baseline` measures (porting/baseline/document.py),
plus an ``imported`` section saying where it came from and what the log does and does not hold: a log
has the loss (and maybe grad norm, lr, tokens) every ``logging_steps``, never probe logits, peak
memory or the data hash, so `port compare` checks the curve (porting/baseline/curve.py) and says the
rest is not available instead of failing it. Settings the log states (``max_steps``,
``logging_steps``, ...) are recorded as recovered; those the user states (``--global-batch``, ``--seq-length``)
as stated; none is guessed.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_zoo.files import sha256_file
from porting.baseline import document
from porting.baseline.document import Imported, ImportedBaseline, Memory, Probe, Settings, Steps, Timing
from porting.baseline.memory import PHASES
from porting.intake import IntakeError
from porting.intake.curve import Curve
from porting.intake import log_facts
from porting.intake.log_facts import LogFacts
from porting.intake.logs import read_log

NEVER_IN_A_LOG = ("probe logits", "peak memory by phase", "step time", "data sha256", "seed", "model config")
FORMAT_NAMES = {"hf-trainer-state": "HF transformers Trainer trainer_state.json (log_history)",
                "llamafactory-jsonl": "LLaMA-Factory trainer_log.jsonl", "csv": "CSV of step,loss",
                "jsonl": "JSONL of step,loss", "tensorboard": "TensorBoard event file (scalars)"}


@dataclass(frozen=True)
class Stated:
    """What the user states about the CUDA run that its log does not (``port baseline import`` options)."""

    global_batch: int | None = None      # sequences per optimizer step
    seq_length: int | None = None        # max tokens per sequence
    dtype: str | None = None             # float32 | bf16-mixed | bfloat16 | float16 | fp16-mixed
    model: str | None = None             # HF directory or zoo name the run trained (architecture facts)
    devices: int | None = None           # the CUDA job's devices (its throughput per device; the field's gate)

    def problems(self) -> list[str]:
        out = []
        for key in ("global_batch", "seq_length"):
            v = getattr(self, key)
            if v is not None and not 1 <= v <= 1 << 24:
                out.append(f"--{key.replace('_', '-')} {v}: expected 1 to {1 << 24}")
        return out


def describe(c: Curve, stated: Stated) -> Imported:
    """What the log holds and lacks, in words `port compare` and the README repeat, and what the user stated."""
    has = ["loss"] + [k for k in ("grad_norm", "lr", "tokens") if c.has(k)]
    lacks = [k for k in ("grad_norm", "lr", "tokens") if not c.has(k)] + list(NEVER_IN_A_LOG)
    interval = c.logging_interval
    return Imported(from_=str(c.path), format=c.fmt, format_name=FORMAT_NAMES[c.fmt], sha256=sha256_file(c.path),
                    contains=tuple(has), lacks=tuple(lacks), logging_interval=interval,
                    loss_is=("the mean of the per-step losses over each logging interval of "
                             f"{interval} steps" if interval and interval > 1 else "the loss of each optimizer step"),
                    skipped_rows=dict(c.skipped), recovered_settings=dict(c.recovered),
                    stated_settings={k: v for k, v in vars(stated).items() if v is not None})


def build(c: Curve, stated: Stated, command: list[str], extras: LogFacts | None = None,
          effective: dict | None = None) -> ImportedBaseline:
    """The baseline document of curve ``c`` (document.FORMAT, marked imported), with what else the log holds
    (``extras``: its evaluation loss and throughput) and the CUDA job's effective settings as intake read them
    (``effective``: porting/intake/effective.py, for the settings table of `port compare`)."""
    bad = stated.problems()
    if bad:
        raise IntakeError("; ".join(bad))
    n = len(c.step)
    model: dict[str, Any] = {}
    if stated.model:
        from porting.baseline.settings import model_info
        from porting.model_paths import resolve_hf

        model = {"hf_dir": str(stated.model), **model_info(resolve_hf(stated.model))}
    lr = [v for v in c.lr if v is not None]
    settings = Settings(steps=c.step[-1], **{k: v for k, v in model.items() if k != "hf_dir"},
                        global_batch=stated.global_batch, seq_length=stated.seq_length, dtype=stated.dtype,
                        world_size=stated.devices,
                        lr=max(lr) if lr else None)   # the peak of the logged schedule, as the recipe's optimizer.lr
    nulls = (None,) * n
    steps = Steps(step=tuple(c.step), loss=tuple(c.loss), grad_norm=tuple(c.grad_norm), lr=tuple(c.lr),
                  tokens=tuple(c.tokens), step_time_s=nulls, peak_memory_gib={p: nulls for p in PHASES})
    return ImportedBaseline(
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command=tuple(command),
        device={"name": "the CUDA run of the imported log", "kind": f"imported {c.fmt}"}, versions={}, model=model,
        settings=settings, steps=steps, memory=Memory(),
        timing=Timing(steady_tokens_per_s=extras.tokens_per_s if extras else None,
                      extra={"tokens_per_s_source": extras.tokens_per_s_source} if extras and extras.tokens_per_s else {}),
        probe=Probe(after_step=None, note="an imported log has no probe logits"),
        imported=dataclasses.replace(describe(c, stated), effective_settings=effective),
        evaluation=extras.evaluation if extras else None)


def import_log(log: str | Path, out: str | Path, stated: Stated, command: list[str],
               loss_tag: str | None = None, effective: dict | None = None) -> tuple[Path, ImportedBaseline]:
    """Read ``log``, write the baseline file ``out`` (atomically; never over the log itself); ``loss_tag``
    names a TensorBoard file's loss scalar; ``effective``: the CUDA job's settings (`port intake`)."""
    src, dst = Path(log), Path(out)
    if dst.exists() and src.exists() and dst.resolve() == src.resolve():
        raise IntakeError(f"{dst}: --out is the log being imported; pick another file name")
    curve = read_log(src, loss_tag)
    doc = build(curve, stated, command, log_facts.read(src), effective)
    document.save(dst, doc)   # checks that the reader reads what was built (a failure is a bug, not bad input)
    return dst, doc


def summary_line(path: Path, doc: ImportedBaseline) -> str:
    imp, steps = doc.imported, doc.steps
    finite = [v for v in steps.loss if v is not None]
    return (f"wrote {path}: {len(steps.step)} logged steps ({steps.step[0]}..{steps.step[-1]}, every "
            f"{imp.logging_interval or 'irregular'}) from {imp.format_name}; loss {finite[0]:.4f} -> {finite[-1]:.4f}; "
            f"has {', '.join(imp.contains)}; lacks {', '.join(imp.lacks)}")
