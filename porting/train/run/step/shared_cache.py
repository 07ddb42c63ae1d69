"""A compile cache shared by runs: ``PORT_COMPILE_CACHE_SHARED=DIR``, off unless set.

Why: a graph-mode run compiles its step graphs before step 1 (porting/train/run/step/precompile.py), a few seconds
per graph per rank on the CPU; a rerun of the same recipe in the same run directory loads them from
``RUN/compile_cache/<key>`` instead (8.0 -> 1.4 s, BENCHMARKS.md "Compiles before step 1"). Runs in *other*
directories with the same graphs (a sweep over learning-rate schedules or step counts, the rehearsal's rungs,
the test suite's many runs of one recipe) compile them again. With this variable set, a rank that compiled
fresh publishes its folder to ``DIR/<key>-<entry>/rank_<r>`` and a later run's rank with the same key copies it
into its own run directory before it compiles, so MindSpore loads the graphs. What makes it safe:

- the key is precompile's (every recipe value, the model's config, the shapes, the world size, the MindSpore
  version, port's graph-building sources and the paths of the C++ kernel libraries a graph loads: a graph
  compiled with ``PORT_KERNEL_CACHE`` or ``HOME`` elsewhere names a library that may be gone) without the
  values that cannot reach a graph (:data:`NOT_GRAPH`),
  plus the entry script (MindSpore checks the sources its entry script imports: a graph cached by an msrun
  worker is not offered to a single-process run). Left out: the master's address and port; the model's
  directory (its config is in the key; the weights are the run's own Parameters, loaded before the compile
  and never taken from a cache: a run of other weights and another schedule that adopts a graph gives the
  losses of its own fresh compile bit for bit, tests/train/test_shared_cache.py); the output directory;
  ``schedule`` (the learning rate and the bias corrections are inputs of the update cell, run/step/cells.py
  ``construct(grads, lr, bc1, bc2, finite)``, computed on the host each step); ``checkpointing`` and
  ``logging`` (host-side; the barrier and sampling graphs they add are compiled outside the cached block,
  run/step/precompile.py ``compile_cache``);
- MindSpore never writes into ``DIR``: a rank copies the published folder into its own run directory and the
  cache is used there as before (the copy is bounded: :data:`MAX_BYTES`; a cached graph holds the weights
  it was compiled with, 275 MB per rank for a 120 M-parameter model, so large models are not shared);
- publishing is atomic per rank: the folder is copied beside its final name and renamed into place, the
  first of two racing runs wins, the other's copy is removed; a folder without its ``READY`` file is never
  read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

ENV = "PORT_COMPILE_CACHE_SHARED"
READY = "READY"
MAX_BYTES = 64 << 20            # per rank folder: a tiny model's graphs are about 0.5 MB
# recipe values that never reach a step graph: (section, key), or (section,) for the whole section or value
NOT_GRAPH = (("cluster", "master_port"), ("cluster", "master_addr"), ("model", "source"), ("output_dir",),
             ("schedule",), ("checkpointing",), ("logging",))


def graph_doc(recipe_doc: dict) -> dict:
    """``recipe_doc`` without the values that never reach a graph (the shared key is taken over the rest)."""
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in recipe_doc.items()}
    for path in NOT_GRAPH:
        if len(path) == 1:
            doc.pop(path[0], None)
        elif isinstance(doc.get(path[0]), dict):
            doc[path[0]].pop(path[1], None)
    return doc


def folder(key: str, environ=None) -> Path | None:
    """The shared folder of ``key`` for this process's entry script, or None when the variable is unset."""
    root = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not root:
        return None
    entry = hashlib.sha256(os.path.abspath(sys.argv[0] or "-").encode()).hexdigest()[:8]
    return Path(root) / f"{key}-{entry}"


def _size(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def adopt(shared: Path | None, own: Path, rank: int) -> bool:
    """Copies the published ``shared/rank_<rank>`` into ``own/rank_<rank>`` when the run has none yet; True
    when it did. Anything odd (no READY, a link, too large, a copy error) leaves the run to compile."""
    if shared is None:
        return False
    src, dst = shared / f"rank_{rank}", own / f"rank_{rank}"
    if dst.exists() or not (src / READY).is_file() or src.is_symlink() or _size(src) > MAX_BYTES:
        return False
    tmp = own / f".rank_{rank}.adopt-{os.getpid()}"
    try:
        own.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns(READY))
        if any(p.is_symlink() for p in tmp.rglob("*")):
            return False
        os.rename(tmp, dst)
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(shared: Path | None, own: Path, rank: int) -> bool:
    """Publishes this rank's freshly written ``own/rank_<rank>`` to ``shared`` (atomic rename; the first
    writer wins); True when this call published it."""
    if shared is None:
        return False
    src, dst = own / f"rank_{rank}", shared / f"rank_{rank}"
    if not src.is_dir() or dst.exists() or _size(src) > MAX_BYTES:
        return False
    tmp = shared / f".rank_{rank}.publish-{os.getpid()}"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, tmp, symlinks=True)
        (tmp / READY).write_text("")
        os.rename(tmp, dst)   # fails when another run published first: its folder stays
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
