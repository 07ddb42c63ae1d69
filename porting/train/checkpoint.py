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


def checkpoint_dirs(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and (p / STATE_FILE).is_file() and (p / WEIGHTS_FILE).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest(root: Path) -> tuple[int, Path] | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def save(root: Path, step: int, params: list, state: dict, keep_last: int) -> Path:
    """Write ``step_<step>`` atomically, then drop all but the newest ``keep_last``."""
    import mindspore as ms

    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        ms.save_checkpoint([{"name": p.name, "data": p} for p in params], str(tmp / WEIGHTS_FILE))
        body = json.dumps(dict(state, step=step), indent=2)
        with open(tmp / STATE_FILE, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except (OSError, RuntimeError, ValueError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        prev = latest(root)
        kept = f"; the previous checkpoint {prev[1]} is intact" if prev else ""
        raise CheckpointError(f"{final}: could not write the checkpoint ({exc}){kept}; free disk space and "
                              "rerun with --resume") from None
    for _, old in checkpoint_dirs(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path, params: list) -> dict:
    """Load a checkpoint into ``params`` strictly (every name present, same shapes); returns state.json."""
    import mindspore as ms

    try:
        saved = ms.load_checkpoint(str(path / WEIGHTS_FILE))
        state = json.loads((path / STATE_FILE).read_text())
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
