"""Training checkpoints: MindSpore format, written atomically, the last K kept.

``checkpoints/step_<n>/`` holds ``train_state.ckpt`` (model parameters and AdamW moments, names as in
the cells) and ``state.json`` (step, loss scale, data position). A checkpoint directory is built under
a temporary name and renamed into place only when every file is complete, so a crash or a full disk
while saving leaves the previous checkpoints as they were.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from model_zoo.errors import CheckpointError

STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "state.json"
WEIGHTS_FILE = "train_state.ckpt"


def shard_file(rank: int, shards: int) -> str:
    """One file when optimizer states are replicated; one per rank when they are sharded."""
    return WEIGHTS_FILE if shards == 1 else f"train_state.rank{rank}.ckpt"


def _complete(p: Path) -> bool:
    try:
        shards = int(json.loads((p / STATE_FILE).read_text()).get("shards", 1))
    except (OSError, ValueError):
        return False
    return all((p / shard_file(r, shards)).is_file() for r in range(shards))


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


def latest(root: Path) -> tuple[int, Path] | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def save(root: Path, step: int, params: list, state: dict, keep_last: int, *, rank: int = 0, shards: int = 1,
         barrier=None) -> Path:
    """Write ``step_<step>`` atomically, then drop all but the newest ``keep_last``.

    Sharded (``shards`` > 1): every rank writes its file into the same temporary directory, all meet at
    ``barrier``, then rank 0 writes state.json and renames the directory into place.
    """
    import mindspore as ms

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / (f".tmp_step_{step}_{os.getpid()}" if shards == 1 else f".tmp_step_{step}")
    try:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if barrier is not None:
            barrier()
        tmp.mkdir(exist_ok=True)
        ms.save_checkpoint([{"name": p.name, "data": p} for p in params], str(tmp / shard_file(rank, shards)))
        if barrier is not None:
            barrier()
        if rank != 0:
            return final
        body = json.dumps(dict(state, step=step, shards=shards), indent=2)
        with open(tmp / STATE_FILE, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except (OSError, RuntimeError, ValueError) as exc:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(root)
        kept = f"; the previous checkpoint {prev[1]} is intact" if prev else ""
        raise CheckpointError(f"{final}: could not write the checkpoint ({exc}){kept}; free disk space and "
                              "rerun with --resume") from None
    for _, old in checkpoint_dirs(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path, params: list, rank: int = 0) -> dict:
    """Load a checkpoint into ``params`` strictly (every name present, same shapes); returns state.json."""
    import mindspore as ms

    try:
        state = json.loads((path / STATE_FILE).read_text())
        saved = ms.load_checkpoint(str(path / shard_file(rank, int(state.get("shards", 1)))))
    except (OSError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({exc}); delete it to resume from an "
                              "earlier one") from None
    by_name = {p.name: p for p in params}
    missing = sorted(set(by_name) - set(saved))
    unexpected = sorted(set(saved) - set(by_name))
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
