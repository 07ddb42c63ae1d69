"""Training checkpoints: the run directory's ``checkpoints/step_<n>/``, written atomically, the last K kept.

A checkpoint is per-rank (porting/train/run/checkpoint/format.py): ``layout.json`` (the layout record: every
piece of every tensor, the rank files' sizes and chunk digests, the run's identity), one
``rank_<r>.safetensors`` per rank and ``state.json`` (step, loss scale, data position). This module keeps
the directory protocol: :func:`save` builds a checkpoint under a temporary name and renames it into place
only when every file is complete, so a crash or a full disk while saving leaves the previous checkpoints
as they were; :func:`latest` finds the newest complete one; :func:`load_whole` reads one into a one-device
model and optimizer. A directory without ``layout.json`` is not a checkpoint port reads: it is refused in one line
(porting/train/run/checkpoint/record.py ``require_layout``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from model_zoo import files
from model_zoo.errors import CheckpointError
from porting.train.run.checkpoint.read import full_state
from porting.train.run.checkpoint.format import (LAYOUT_FILE, complete, identity, live_layout, live_pieces, needed, piece_bytes, rss,
                                            write_rank, write_record)

STEP_DIR = re.compile(r"^step_(\d+)$")
LEFTOVER_DIR = re.compile(r"^\.(tmp|old)_step_\d+(_\d+)?$")
STATE_FILE = "state.json"

MAX_STATE_BYTES = 1 << 20
# state.json's ranges: steps and updates as the recipe's (schema.BIG), ranks as the layout record's
# (ckpt_shards.MAX_WORLD), the seed as the recipe's (32-bit), the loss scale finite in float32
MAX_COUNT = 10 ** 9
MAX_RANKS = 1 << 16
MAX_SEED = 2 ** 32 - 1
MAX_SCALE = 3.0e38


def damaged_advice(ckdir: Path) -> str:
    """The one advice for a damaged checkpoint, with or without --resume."""
    return (f"the checkpoint is damaged: delete {ckdir} and rerun with --resume to continue from the checkpoint "
            "before it (run without --resume when none is left), or start another run with --run-dir NEW_DIR")


@dataclasses.dataclass(frozen=True)
class TrainState:
    """``state.json``: where the run stands after ``step`` (the loop's counters beside the tensors)."""
    adam_t: int            # optimizer updates applied (AdamW bias correction)
    loss_scale: float      # the loss scale to continue with
    good_steps: int        # finite steps since the scale last changed (dynamic scaling)
    next_step: int         # the first step the resumed run performs (0-based)
    world_size: int
    seed: int
    step: int = 0
    shards: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"adam_t": self.adam_t, "loss_scale": {"scale": self.loss_scale, "good": self.good_steps},
                "next_step": self.next_step, "world_size": self.world_size, "seed": self.seed,
                "step": self.step, "shards": self.shards}

    @classmethod
    def read(cls, path: Path) -> TrainState:
        """Parse and check ``path``; every defect is one line naming the file and the key."""
        fix = damaged_advice(path.parent)
        try:
            doc = files.read_json_object(path, what="checkpoint state", max_bytes=MAX_STATE_BYTES,
                                         error=CheckpointError)
        except CheckpointError as e:
            raise CheckpointError(f"{e}; {fix}") from None

        def integer(d: dict, key: str, where: str, low: int, high: int = MAX_COUNT) -> int:
            v = d.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                found = "missing" if key not in d else f"{type(v).__name__} {str(v)[:40]}"
                raise CheckpointError(f"{path}: key '{where}' is {found}, expected an integer in [{low}, {high}]; {fix}")
            return v

        ls = doc.get("loss_scale")
        if not isinstance(ls, dict):
            raise CheckpointError(f"{path}: key 'loss_scale' is {type(ls).__name__ if 'loss_scale' in doc else 'missing'}"
                                  f", expected an object {{\"scale\": number, \"good\": integer}}; {fix}")
        scale = ls.get("scale")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= MAX_SCALE:
            raise CheckpointError(f"{path}: key 'loss_scale.scale' is {str(scale)[:40]}, expected a number in (0, "
                                  f"{MAX_SCALE:g}]; {fix}")
        st = cls(adam_t=integer(doc, "adam_t", "adam_t", 0), loss_scale=float(scale),
                 good_steps=integer(ls, "good", "loss_scale.good", 0),
                 next_step=integer(doc, "next_step", "next_step", 0),
                 world_size=integer(doc, "world_size", "world_size", 1, MAX_RANKS),
                 seed=integer(doc, "seed", "seed", 0, MAX_SEED),
                 step=integer(doc, "step", "step", 0) if "step" in doc else 0,
                 shards=integer(doc, "shards", "shards", 1, MAX_RANKS) if "shards" in doc else 1)
        # counters that cannot disagree in a checkpoint port wrote: updates applied <= steps done, finite steps
        # since the scale changed <= updates, one file per rank at most
        for bad, what in ((st.adam_t > st.next_step, f"adam_t {st.adam_t} > next_step {st.next_step}"),
                          (st.good_steps > st.adam_t, f"loss_scale.good {st.good_steps} > adam_t {st.adam_t}"),
                          (st.shards > st.world_size, f"shards {st.shards} > world_size {st.world_size}")):
            if bad:
                raise CheckpointError(f"{path}: {what}, which no run writes; {fix}")
        return st


def _complete(p: Path) -> bool:
    """state.json, the layout record and every rank file it lists are there (a state.json or record that does
    not parse still counts: each was renamed into place whole, so it is damaged, not partial, and loading it
    names the bad key). A directory without layout.json is not a checkpoint port reads."""
    return (p / STATE_FILE).is_file() and (p / LAYOUT_FILE).is_file() and complete(p)


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and _complete(p):
            out.append((int(m.group(1)), p))
    return sorted(out)


def interrupted_saves(root: Path) -> list[Path]:
    """Temporary directories of saves that never completed (a kill or a crash mid-save). They are never
    loaded; they are named in the log so a user can free the space (port deletes only its own current ones)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and LEFTOVER_DIR.match(p.name))


def latest(root: Path) -> tuple[int, Path] | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def save(root: Path, step: int, state: TrainState, keep_last: int, *, write: Callable[[Path], None],
         finish: Callable[[Path], int], rank: int = 0, shards: int = 1, barrier: Callable[[], None] | None = None,
         part: Callable[[str], None] = lambda _part: None) -> Path:
    """Write ``step_<step>`` atomically, then drop all but the newest ``keep_last``.

    Every rank's ``write(tmp)`` writes its own file into the same temporary directory, all meet at
    ``barrier`` (``shards`` > 1), then rank 0's ``finish(tmp)`` writes the layout record and returns the
    shard count, rank 0 writes state.json and renames the directory into place. ``part(name)`` announces each part
    as it begins (porting/rundir/ranklog.py ``SAVE_PARTS``: its line and heartbeat), so that a rank frozen inside
    the save is told from the ranks waiting for it at a barrier.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / (f".tmp_step_{step}_{os.getpid()}" if shards == 1 else f".tmp_step_{step}")
    try:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if barrier is not None:
            part("wait")
            barrier()
        tmp.mkdir(exist_ok=True)
        part("write")
        write(tmp)
        if barrier is not None:
            part("barrier")
            barrier()
        if rank != 0:
            part("done")
            return final
        part("record")
        shards = finish(tmp) or 1
        body = json.dumps(dataclasses.replace(state, step=step, shards=shards).to_dict(), indent=2)
        with open(tmp / STATE_FILE, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        files.swap_in(tmp, final, root / f".old_step_{step}_{os.getpid()}")
    except (OSError, RuntimeError, ValueError) as exc:
        # Any rank that fails ends the save (rank 0 renames only after every rank passed the second barrier),
        # so whichever fails first removes the shared temporary directory; the launcher removes what a rank
        # killed mid-save leaves (porting/launch/outcome.py).
        shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(root)
        kept = f"; the previous checkpoint {prev[1]} is intact" if prev else ""
        raise CheckpointError(f"{final}: could not write the checkpoint ({exc}){kept}; free disk space and "
                              "rerun with --resume") from None
    for _, old in checkpoint_dirs(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    part("done")
    return final


def load_whole(path: Path, params: list, *, allowed: set[str] | None = None) -> TrainState:
    """Load a checkpoint, every tensor whole, into one device's ``params`` strictly (every name present, same
    shapes); returns state.json. ``allowed``: the other tensors the checkpoint may hold (fp32 masters a
    float32 model does not keep)."""
    import mindspore as ms  # deferred: the launcher reads checkpoint names without loading MindSpore

    state = TrainState.read(path / STATE_FILE)
    try:
        saved = {k: ms.Tensor(v) for k, v in full_state(path).items()}
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({exc}); delete it to resume from an "
                              "earlier one") from None
    by_name = {p.name: p for p in params}
    missing = sorted(set(by_name) - set(saved))
    unexpected = sorted(set(saved) - set(by_name) - (allowed or set()))
    if missing or unexpected:
        raise CheckpointError(f"{path}: does not match this run's model and optimizer: missing "
                              f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}; "
                              "resume with the same recipe and model")
    for name, p in by_name.items():
        t = saved[name]
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(f"{path}: {name} has shape {tuple(t.shape)}, the model needs {tuple(p.shape)}")
        p.set_data(t.astype(p.dtype))
    return state


def save_ranks(trainer: Any, root: Path, step: int, announce: Callable[[int, str], None] | None = None) -> Path:
    """Every rank writes its own file into the temporary directory; rank 0 writes the record and
    renames the directory into place (:func:`save`: the atomic swap). ``announce(step, part)`` says each part of the
    save as it begins (its rank-log line and heartbeat)."""
    layout = live_layout(trainer)
    written = []

    def write(tmp: Path) -> None:
        if (late := trainer.faults.save_delay_for(trainer.rank)) > 0:   # test hook, off unless set (faults.py)
            trainer.log.info(f"checkpoint step {step}: test hook PORT_TEST_SAVE_DELAY: rank {trainer.rank} writes "
                             f"{late:g} s late")
            time.sleep(late)
        t0 = time.perf_counter()
        written.append(write_rank(tmp, trainer.rank, live_pieces(trainer, layout)))
        sec = time.perf_counter() - t0
        trainer.log.info(f"checkpoint step {step}: rank_{trainer.rank:05d}.safetensors written, {written[-1]} bytes in "
                         f"{sec:.1f} s ({written[-1] / max(sec, 1e-9) / 1e6:.0f} MB/s)")

    def finish(tmp: Path) -> int:
        write_record(tmp, layout, identity(trainer))
        return trainer.world

    barrier = trainer.barrier if trainer.world > 1 else None
    before = rss(reset_peak=True)
    out = save(root, step, trainer.state(step), trainer.recipe.checkpointing.keep_last, write=write, finish=finish,
               rank=trainer.rank, shards=trainer.world, barrier=barrier,
               part=(lambda p: announce(step, p)) if announce is not None else (lambda _p: None))
    shard = piece_bytes(layout, needed(layout, trainer.rank))
    peak = rss()
    grew = f"; peak host RSS during the save +{peak[1] - before[0]} bytes" if peak and before else ""
    trainer.log.info(f"checkpoint step {step}: this rank wrote {written[0] if written else 0} bytes "
                     f"(its shard {shard} bytes){grew}")
    return out
