"""Watching a run: TensorBoard events, Weights & Biases (offline by default), a progress bar.

``port train`` calls :class:`Watch` with each step's record (the same dict that goes to
``metrics.jsonl``). What it writes, by ``logging.*`` in the recipe:

* ``tensorboard: true``: event files under ``<run>/tensorboard/`` written by ``tensorboardX``'s synchronous
  ``EventsWriter`` (a small, maintained writer of TensorBoard's own format; a write error mid-run stops the
  events with one warning line at the end, never the run): ``train/loss``, ``train/lr``, ``train/grad_norm``,
  ``train/tokens_per_s``, ``train/padding_fraction``, ``train/loss_scale``, ``memory/host_rss_gib``,
  ``eval/loss`` and ``eval/perplexity`` when held-out evaluation runs. ``tensorboard --logdir <run>``.
* ``wandb: true``: the same scalars through ``wandb`` (``logging.wandb_mode: offline`` needs no network;
  ``wandb sync <run>/wandb/offline-run-*`` uploads later). Refused with one line when not installed.
* a progress bar with ETA on a terminal (``tqdm``), unless ``logging.progress: lines``; the plain log
  lines stay as they are when stderr is not a TTY.

Only rank 0 watches; nothing here changes what is trained.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path
from typing import IO

from model_zoo.errors import RecipeError
from porting.rundir.paths import RunDir

# metrics.jsonl key -> scalar tag
SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
           "tokens_per_s": "train/tokens_per_s", "padding_fraction": "train/padding_fraction",
           "loss_scale": "train/loss_scale", "host_rss_gib": "memory/host_rss_gib",
           "eval_loss": "eval/loss", "eval_perplexity": "eval/perplexity"}


class Watch:
    """The run's watchers; ``step(record)`` after every optimizer step, ``close()`` at the end."""
    def __init__(self, logging_cfg, run_dir: Path, total_steps: int, start: int = 0, config: dict | None = None,
                 stream: IO | None = None):
        self.tb = self.wandb = self.bar = None
        self.stream = stream if stream is not None else sys.stderr
        self.tb_problem: str | None = None   # why the events stopped mid-run (said once, at close)
        if logging_cfg.tensorboard:
            try:
                import tensorboardX  # noqa: F401  # deferred: optional logger, loaded only when logging.tensorboard is on
            except ImportError:
                raise RecipeError("logging.tensorboard: needs the tensorboardX package (pip install tensorboardX), "
                                  "or set logging.tensorboard=false") from None
            self.tb = _events_writer(RunDir(run_dir).tensorboard)
        if logging_cfg.wandb:
            try:
                import wandb  # deferred: optional logger, loaded only when logging.wandb is on
            except ImportError:
                raise RecipeError("logging.wandb: the wandb package is not installed (pip install wandb), or set "
                                  "logging.wandb=false") from None
            self.wandb = wandb.init(project=logging_cfg.wandb_project, dir=str(run_dir), mode=logging_cfg.wandb_mode,
                                    config=config or {}, resume="allow")
        stream = self.stream
        tty = bool(getattr(stream, "isatty", lambda: False)())
        if logging_cfg.progress == "bar" or (logging_cfg.progress == "auto" and tty):
            from tqdm import tqdm  # deferred: the progress bar only on a terminal

            self.bar = tqdm(total=total_steps, initial=start, file=stream, unit="step", dynamic_ncols=True,
                            desc="train")

    def step(self, rec: dict) -> None:
        n = int(rec["step"])
        scalars = {tag: float(rec[k]) for k, tag in SCALARS.items() if rec.get(k) is not None}
        if self.tb is not None:
            self._tb_write(n, scalars)
        if self.wandb is not None:
            self.wandb.log(scalars, step=n)
        if self.bar is not None and "loss" in rec:
            self.bar.set_postfix(loss=f"{rec['loss']:.4f}", tok_s=f"{rec.get('tokens_per_s', 0):.0f}", refresh=False)
            self.bar.update(n - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            try:
                self.tb.close()
            except OSError as e:
                self._tb_failed(e, "when closing")
        if self.tb_problem:
            print(f"warning: {self.tb_problem}", file=self.stream)
        if self.wandb is not None:
            self.wandb.finish()


    def _tb_write(self, step: int, scalars: dict[str, float]) -> None:
        """One event per step, written and flushed in this thread: a disk that fills or a directory made
        read-only mid-run stops the events (said once, at the end), never the run."""
        from tensorboardX.proto import event_pb2  # deferred: optional logger (logging.tensorboard)
        from tensorboardX.summary import scalar  # deferred: optional logger (logging.tensorboard)

        try:
            for tag, v in scalars.items():
                self.tb.write_event(event_pb2.Event(wall_time=time.time(), step=step, summary=scalar(tag, v)))
            self.tb.flush()
        except OSError as e:
            self._tb_failed(e, f"at step {step}")

    def _tb_failed(self, e: OSError, when: str) -> None:
        self.tb_problem = (f"logging.tensorboard: the event file stopped {when} ({e.strerror or e}); the run itself "
                           "went on, metrics.jsonl has every step")
        try:
            self.tb.close()
        except OSError:
            pass
        self.tb = None


def _events_writer(logdir: Path):
    """tensorboardX's synchronous event-file writer (its SummaryWriter writes from a thread through a
    bounded queue: a write error there kills the thread, and the next steps block on the full queue)."""
    from tensorboardX.event_file_writer import EventsWriter  # deferred: optional logger (logging.tensorboard)

    try:
        logdir.mkdir(exist_ok=True)
        return EventsWriter(str(logdir / "events"))
    except OSError as e:
        raise RecipeError(f"{e.filename or logdir}: cannot write TensorBoard events ({e.strerror}); logging.tensorboard "
                          "needs a writable directory there (remove what is in the way, free space) or set "
                          "logging.tensorboard=false") from None


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of a run's TensorBoard event files, read back with tensorboardX's protobufs (each
    record's length and data CRCs checked), so a run can be plotted or compared without TensorBoard."""

    from tensorboardX.proto import event_pb2  # deferred: optional logger (logging.tensorboard)
    from tensorboardX.record_writer import masked_crc32c  # deferred: optional logger (logging.tensorboard)

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(RunDir(run_dir).tensorboard.glob("events.out.tfevents.*")):
        raw = f.read_bytes()
        pos = 0
        while pos + 12 <= len(raw):
            header = raw[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            (hcrc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
            if hcrc == masked_crc32c(header) and pos + 16 + length > len(raw):
                break   # the last record was cut (a writer stopped by a full disk or a kill): the rest stand
            data = raw[pos + 12:pos + 12 + length]
            (dcrc,) = struct.unpack("<I", raw[pos + 12 + length:pos + 16 + length])
            if hcrc != masked_crc32c(header) or dcrc != masked_crc32c(data):
                raise RecipeError(f"{f}: damaged TensorBoard record at byte {pos}")
            pos += 16 + length
            ev = event_pb2.Event.FromString(data)
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((int(ev.step), float(v.simple_value)))
    return out
