"""Training checkpoints: MindSpore format, written atomically, the last K kept.

``checkpoints/step_<n>/`` holds ``train_state.ckpt`` (model parameters and AdamW moments, names as in
the cells) and ``state.json`` (step, loss scale, data position). A checkpoint directory is built under
a temporary name and renamed into place only when every file is complete, so a crash or a full disk
while saving leaves the previous checkpoints as they were.

`port train` now writes per-rank checkpoints (format 2: porting/train/run/ckpt_shards.py, through
:func:`save`'s ``write`` hook, in every layout); this module keeps the directory protocol (atomic
swap, keep_last, completeness) and reads format 1 (``train_state.ckpt``, :func:`load` and
:func:`merge_tensor_parallel`'s merged tensor-parallel file) for resuming older runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from model_zoo import files
from model_zoo.errors import CheckpointError
from porting.train.run.ckpt_read import full_state
from porting.train.run.ckpt_shards import (LAYOUT_FILE, complete, identity, live_layout, live_pieces, needed, piece_bytes, rss,
                                            write_rank, write_record)
from porting.train.run.grid import param_of

STEP_DIR = re.compile(r"^step_(\d+)$")
LEFTOVER_DIR = re.compile(r"^\.(tmp|old)_step_\d+(_\d+)?$")
STATE_FILE = "state.json"
WEIGHTS_FILE = "train_state.ckpt"
# ZeRO's flat-shard states (porting/train/run/zero.py ShardedAdamW): adam_m.shard3.rank1, master.shard0.tp1.rank0
FLAT_SHARD = re.compile(r"^(adam_m|adam_v|master)\.shard\d+\.(tp\d+\.)?rank\d+$")


def shard_file(rank: int, shards: int) -> str:
    """One file when optimizer states are replicated; one per rank when they are sharded."""
    return WEIGHTS_FILE if shards == 1 else f"train_state.rank{rank}.ckpt"


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
    """state.json and every weights file are there. A state.json that does not parse still counts (it
    was renamed into place whole, so it is damaged, not partial): loading it names the bad key."""
    if not (p / STATE_FILE).is_file():
        return False
    if (p / "layout.json").is_file():   # per-rank format (porting/train/run/ckpt_shards.py)
        return complete(p)
    try:
        shards = int(json.loads((p / STATE_FILE).read_text(encoding="utf-8")).get("shards", 1))
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
        return (p / WEIGHTS_FILE).is_file() or (p / shard_file(0, 2)).is_file()
    return shards >= 1 and all((p / shard_file(r, shards)).is_file() for r in range(min(shards, 4096)))


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


def save(root: Path, step: int, params: list, state: TrainState, keep_last: int, *, rank: int = 0, shards: int = 1,
         barrier=None, merge=None, write=None) -> Path:
    """Write ``step_<step>`` atomically, then drop all but the newest ``keep_last``.

    Sharded (``shards`` > 1): every rank writes its file into the same temporary directory, all meet at
    ``barrier``, then rank 0 writes state.json and renames the directory into place. ``merge(tmp)``
    (tensor parallel): rank 0 first turns the rank files into one full file (state.json says 1 shard).
    ``write(tmp)`` writes this rank's file instead of ``params`` (the per-rank format, ckpt_shards.py); its
    ``merge`` writes the layout record and returns the shard count for state.json.
    """
    import mindspore as ms  # deferred: the CLI's run-directory guard reads checkpoint names without loading MindSpore

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / (f".tmp_step_{step}_{os.getpid()}" if shards == 1 else f".tmp_step_{step}")
    try:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if barrier is not None:
            barrier()
        tmp.mkdir(exist_ok=True)
        if write is not None:
            write(tmp)
        else:
            ms.save_checkpoint([{"name": p.name, "data": p} for p in params], str(tmp / shard_file(rank, shards)))
        if barrier is not None:
            barrier()
        if rank != 0:
            return final
        if merge is not None:
            shards = merge(tmp) or 1
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
    return final


def load(path: Path, params: list, rank: int = 0, *, shard=None, allowed: set[str] | None = None) -> TrainState:
    """Load a checkpoint into ``params`` strictly (every name present, same shapes); returns state.json.

    Tensor parallel: ``shard(name, full array)`` slices each full tensor for this rank, and ``allowed``
    names the other tensors the full file may hold (other ranks' optimizer states)."""
    import mindspore as ms  # deferred: the CLI's run-directory guard reads checkpoint names without loading MindSpore

    state = TrainState.read(path / STATE_FILE)
    try:
        if (path / LAYOUT_FILE).is_file():   # per-rank format 2: every tensor whole (a one-device reader)
            saved = {k: ms.Tensor(v) for k, v in full_state(path).items()}
        else:
            saved = ms.load_checkpoint(str(path / shard_file(rank, state.shards)))
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
        if shard is not None:
            t = ms.Tensor(shard(name, _numpy(t)))
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(f"{path}: {name} has shape {tuple(t.shape)}, the model needs {tuple(p.shape)}")
        p.set_data(t.astype(p.dtype))
    return state


def _numpy(t):
    """A checkpoint tensor as NumPy (bf16 through float32: NumPy 2 has no bfloat16)."""
    import mindspore as ms  # deferred: the CLI's run-directory guard reads checkpoint names without loading MindSpore

    return t.astype(ms.float32).asnumpy() if t.dtype == ms.bfloat16 else t.asnumpy()


def merge_tensor_parallel(tmp: Path, world: int, tp: int, layout: dict[str, int]) -> None:
    """Merge the ``world`` rank files in ``tmp`` into one full ``train_state.ckpt`` and remove them.

    Rank r holds tensor-parallel slice ``r % tp`` (:mod:`porting.train.run.grid`); ``layout`` maps a parameter
    name to its split axis (absent: replicated, tp rank 0's copy is kept). A tensor some ranks lack (an
    optimizer state kept by its data-parallel owner only) is taken from the ranks that have it. ZeRO's
    flat shards (porting/train/run/zero.py, named by tensor-parallel and data-parallel rank) are not parameter
    slices: each is kept as it is under its own name, and the rank that owns it loads it back unsliced."""
    import mindspore as ms  # deferred: the CLI's run-directory guard reads checkpoint names without loading MindSpore

    from model_zoo.parallel import merge_shards  # deferred: imports MindSpore (see above)

    files = [tmp / shard_file(r, world) for r in range(world)]
    loaded = [ms.load_checkpoint(str(f)) for f in files]
    names = list(dict.fromkeys(n for d in loaded for n in d))
    out = []
    for name in names:
        if FLAT_SHARD.match(name):   # a ZeRO flat shard: one rank's own state, kept as it is
            out.append({"name": name, "data": next(d[name] for d in loaded if name in d)})
            continue
        parts = []
        for t in range(tp):
            holder = next((d for r, d in enumerate(loaded) if r % tp == t and name in d), None)
            if holder is None:
                raise CheckpointError(f"{tmp}: {name} has no copy on tensor-parallel rank {t}")
            parts.append(holder[name])
        axis = layout.get(param_of(name))
        if axis is None:
            out.append({"name": name, "data": parts[0]})
        else:
            full = merge_shards([_numpy(p) for p in parts], axis)
            out.append({"name": name, "data": ms.Tensor(full).astype(parts[0].dtype)})
    ms.save_checkpoint(out, str(tmp / WEIGHTS_FILE))
    del loaded
    for f in files:
        f.unlink()


def save_ranks(trainer: Any, root: Path, step: int) -> Path:
    """Every rank writes its own file into the temporary directory; rank 0 writes the record and
    renames the directory into place (:func:`save`: the atomic swap)."""
    layout = live_layout(trainer)
    written = []

    def write(tmp: Path) -> None:
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
    out = save(root, step, [], trainer.state(step), trainer.recipe.checkpointing.keep_last,
                    rank=trainer.rank, shards=trainer.world, barrier=barrier, merge=finish, write=write)
    shard = piece_bytes(layout, needed(layout, trainer.rank))
    peak = rss()
    grew = f"; peak host RSS during the save +{peak[1] - before[0]} bytes" if peak and before else ""
    trainer.log.info(f"checkpoint step {step}: this rank wrote {written[0] if written else 0} bytes "
                     f"(its shard {shard} bytes){grew}")
    return out
