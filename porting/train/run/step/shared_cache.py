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
- a folder is adopted only when it proves what it holds: its ``READY`` file is the manifest the publisher wrote
  (:class:`Identity`: the key, a digest of the model's config, a digest of the configuration, and every file with
  its size and sha256), and the folder holds nothing else than those regular files (no link, FIFO or extra
  file); each file is hashed as it is copied, and a copy that differs is dropped. A folder named by this run's
  key but holding another configuration's graph (it trained to that configuration's losses) or another model's
  (every step NaN) is passed over with one log line and the run compiles;
- nothing under ``DIR`` is read or written through a link: ``DIR/<key>-<entry>``, ``rank_<r>`` and every file
  below are opened relative to their parent's descriptor with ``O_NOFOLLOW``, so a link planted there (the
  graphs hold the weights) is refused, never followed. ``DIR`` itself is the user's path; one that names a file
  is refused before the launch (porting/train/plan/execution.py ``compile_cache_problem``);
- MindSpore never writes into ``DIR``: a rank copies the published folder into its own run directory and the
  cache is used there as before (the copy is bounded: :data:`MAX_BYTES`, :data:`MAX_FILES`; a cached graph holds
  the weights it was compiled with, 275 MB per rank for a 120 M-parameter model, so large models are not shared);
- publishing is atomic per rank: the folder is copied beside its final name and renamed into place, the
  first of two racing runs wins, the other's copy is removed; a folder without its ``READY`` file is never
  read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from model_zoo.errors import PortingError
from porting.train.plan.execution import SHARED_CACHE_ENV

ENV = SHARED_CACHE_ENV
READY = "READY"                 # the manifest, written last: its presence says the folder is whole
FORMAT = "port-compile-cache/1"
MAX_BYTES = 64 << 20            # per rank folder: a tiny model's graphs are about 0.5 MB
MAX_FILES = 256                 # MindSpore writes 2 files per rank folder (graph_cache/*.mindir, *.hash)
MAX_DEPTH = 4
MAX_MANIFEST_BYTES = 1 << 20
# recipe values that never reach a step graph: (section, key), or (section,) for the whole section or value
NOT_GRAPH = (("cluster", "master_port"), ("cluster", "master_addr"), ("model", "source"), ("output_dir",),
             ("schedule",), ("checkpointing",), ("logging",))
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK   # O_NONBLOCK: a FIFO planted there never blocks the open


class Refused(PortingError):
    """Why a shared folder is not adopted or not published (one log line; the run compiles as without it)."""


def graph_doc(recipe_doc: dict) -> dict:
    """``recipe_doc`` without the values that never reach a graph (the shared key is taken over the rest)."""
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in recipe_doc.items()}
    for path in NOT_GRAPH:
        if len(path) == 1:
            doc.pop(path[0], None)
        elif isinstance(doc.get(path[0]), dict):
            doc[path[0]].pop(path[1], None)
    return doc


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Identity:
    """What a published folder was compiled for; its manifest must name this run's, field for field."""

    key: str             # precompile.cache_key over graph_doc(recipe): the folder's name holds it too
    model: str           # sha256 of the model's config
    configuration: str   # sha256 of the graph-reaching recipe values, the shapes and the world size

    @classmethod
    def of(cls, key: str, recipe_doc: dict, model_config: dict, shapes: list, world: int) -> "Identity":
        return cls(key, _digest(model_config),
                   _digest({"recipe": graph_doc(recipe_doc), "shapes": [list(s) for s in shapes], "world": world}))


def folder(key: str, environ=None) -> Path | None:
    """The shared folder of ``key`` for this process's entry script, or None when the variable is unset."""
    root = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not root:
        return None
    entry = hashlib.sha256(os.path.abspath(sys.argv[0] or "-").encode()).hexdigest()[:8]
    return Path(root) / f"{key}-{entry}"


# ------------------------------------------------------------------------------------------ one tree, by descriptors
def _open_dir(name: str, parent: int | None, what: str) -> int:
    """``name`` under the descriptor ``parent`` as a directory, never through a link."""
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"{what} is a link or not a folder: not followed") from None
        raise


def _copy_tree(src: int, dst: int, budget: list[int], rel: str = "", depth: int = 0,
               skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """Copies the regular files and folders under the descriptor ``src`` into ``dst`` (created with O_EXCL, never
    through a link), hashing each as it is read; {relative path: {bytes, sha256}}. A link, FIFO, socket or
    device, a tree deeper than :data:`MAX_DEPTH`, or more than ``budget`` = [files, bytes] is Refused; ``skip``:
    names left out at the top (the manifest, checked on its own)."""
    out: dict[str, dict] = {}
    with os.scandir(src) as it:
        entries = sorted((e for e in it if e.name not in skip), key=lambda e: e.name)
    for e in entries:
        name = rel + e.name
        st = os.stat(e.name, dir_fd=src, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            if depth >= MAX_DEPTH:
                raise Refused(f"{name}: folders nested deeper than {MAX_DEPTH}")
            sub, os_dst = _open_dir(e.name, src, name), None
            try:
                os.mkdir(e.name, 0o755, dir_fd=dst)
                os_dst = _open_dir(e.name, dst, name)
                out.update(_copy_tree(sub, os_dst, budget, name + "/", depth + 1))
            finally:
                os.close(sub)
                if os_dst is not None:
                    os.close(os_dst)
        elif stat.S_ISREG(st.st_mode):
            budget[0] -= 1
            if budget[0] < 0:
                raise Refused(f"more than {MAX_FILES} files")
            out[name] = _copy_file(e.name, src, dst, budget, name)
        else:
            kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file (a FIFO, socket or device)"
            raise Refused(f"{name} is {kind}")
    return out


def _copy_file(name: str, src: int, dst: int, budget: list[int], rel: str) -> dict:
    fd = os.open(name, _FILE, dir_fd=src)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{rel} is not a regular file")
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dst)
        h, n = hashlib.sha256(), 0
        try:
            while block := os.read(fd, min(1 << 20, budget[1] + 1)):
                n += len(block)
                budget[1] -= len(block)
                if budget[1] < 0:
                    raise Refused(f"more than {MAX_BYTES >> 20} MiB")
                h.update(block)
                os.write(out, block)
        finally:
            os.close(out)
        return {"bytes": n, "sha256": h.hexdigest()}
    finally:
        os.close(fd)


def _staged(parent: int, tmp: str, final: str, fill: Callable[[int], None]) -> None:
    """``tmp`` made under ``parent``, filled by ``fill(fd)`` and renamed to ``final`` (the first writer wins: a
    published folder is never replaced); removed whatever happens."""
    os.mkdir(tmp, 0o755, dir_fd=parent)
    try:
        fd = _open_dir(tmp, parent, tmp)
        try:
            fill(fd)
        finally:
            os.close(fd)
        os.rename(tmp, final, src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        shutil.rmtree(tmp, dir_fd=parent, ignore_errors=True)


# ------------------------------------------------------------------------------------------ adopt and publish
def _check_manifest(raw: bytes, want: Identity) -> dict[str, dict]:
    """The files a READY manifest lists, after its identity is checked against this run's."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Refused("its READY is not a port manifest (a folder of an older port or not port's)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise Refused(f"its READY is not a {FORMAT} manifest")
    for field, mine in asdict(want).items():
        if doc.get(field) != mine:
            what = {"key": "another key", "model": "another model", "configuration": "another configuration"}[field]
            raise Refused(f"it was compiled for {what} ({field} {str(doc.get(field))[:20]!r}, this run's "
                          f"{mine[:20]!r})")
    listed = doc.get("files")
    if not isinstance(listed, dict) or not listed or len(listed) > MAX_FILES or not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) and type(v.get("bytes")) is int
            for v in listed.values()):
        raise Refused("its manifest lists no files, or files without their size and sha256")
    return listed


def adopt(shared: Path | None, own: Path, rank: int, want: Identity) -> tuple[bool, str]:
    """Copies the published ``shared/rank_<rank>`` into ``own/rank_<rank>`` when the run has none yet and the
    folder proves it is this run's (module docstring); (adopted, the line to log: empty when there was nothing
    to adopt)."""
    if shared is None or (own / f"rank_{rank}").exists():
        return False, ""
    where = f"{shared}/rank_{rank}"
    fds: list[int] = []
    try:
        fds.append(os.open(shared.parent, os.O_RDONLY | os.O_DIRECTORY))
        fds.append(_open_dir(shared.name, fds[-1], str(shared)))
        fds.append(_open_dir(f"rank_{rank}", fds[-1], where))
        raw = _read_small(READY, fds[-1])
        listed = _check_manifest(raw, want)
        own.mkdir(parents=True, exist_ok=True)
        parent = os.open(own, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _staged(parent, f".rank_{rank}.adopt-{os.getpid()}", f"rank_{rank}",
                    lambda dst: _verify(_copy_tree(fds[-1], dst, [MAX_FILES, MAX_BYTES], skip=(READY,)), listed))
        finally:
            os.close(parent)
        return True, f"compile cache of rank {rank} copied from {shared} ({ENV}; its manifest checked)"
    except FileNotFoundError:
        return False, ""
    except Refused as e:
        return False, f"compile cache {where} not adopted: {e}; compiling ({ENV})"
    except OSError as e:
        return False, f"compile cache {where} not adopted: {e.strerror}; compiling ({ENV})"
    finally:
        for fd in fds:
            os.close(fd)


def _read_small(name: str, parent: int) -> bytes:
    fd = os.open(name, _FILE, dir_fd=parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"its {name} is not a regular file")
        raw = os.read(fd, MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise Refused(f"its {name} is larger than {MAX_MANIFEST_BYTES >> 20} MiB")
    return raw


def _verify(copied: dict[str, dict], listed: dict[str, dict]) -> None:
    extra, missing = sorted(copied.keys() - listed.keys()), sorted(listed.keys() - copied.keys())
    if extra or missing:
        raise Refused(f"it holds {len(extra)} file(s) its manifest does not list ({', '.join(extra[:3])}) and lacks "
                      f"{len(missing)} it lists ({', '.join(missing[:3])})")
    bad = sorted(k for k, v in copied.items() if v != {"bytes": listed[k]["bytes"], "sha256": listed[k]["sha256"]})
    if bad:
        raise Refused(f"{', '.join(bad[:3])} differ(s) from the sha256 its manifest records")


def publish(shared: Path | None, own: Path, rank: int, ident: Identity) -> tuple[bool, str]:
    """Publishes this rank's freshly written ``own/rank_<rank>`` to ``shared`` with its manifest (atomic rename;
    the first writer wins); (published, the line to log: empty when there was nothing to say)."""
    if shared is None or not (own / f"rank_{rank}").is_dir():
        return False, ""
    fds: list[int] = []

    def fill(dst: int) -> None:
        src = _open_dir(f"rank_{rank}", fds[0], f"{own}/rank_{rank}")
        try:
            files = _copy_tree(src, dst, [MAX_FILES, MAX_BYTES], skip=(READY,))
        finally:
            os.close(src)
        doc = {"format": FORMAT, **asdict(ident), "files": files}
        fd = os.open(READY, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dst)
        try:
            os.write(fd, json.dumps(doc, indent=1, sort_keys=True).encode())
        finally:
            os.close(fd)

    try:
        fds.append(os.open(own, os.O_RDONLY | os.O_DIRECTORY))
        shared.parent.mkdir(parents=True, exist_ok=True)
        fds.append(os.open(shared.parent, os.O_RDONLY | os.O_DIRECTORY))
        try:
            os.mkdir(shared.name, 0o755, dir_fd=fds[-1])
        except FileExistsError:
            pass
        fds.append(_open_dir(shared.name, fds[-1], str(shared)))
        if _exists(f"rank_{rank}", fds[-1]):
            return False, ""   # another run published first: its folder stays
        _staged(fds[-1], f".rank_{rank}.publish-{os.getpid()}", f"rank_{rank}", fill)
        return True, f"compile cache of rank {rank} published to {shared} ({ENV})"
    except Refused as e:
        return False, f"compile cache not published to {shared}: {e} ({ENV})"
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False, ""   # lost the race: the other run's folder stays
        return False, f"compile cache not published to {shared}: {e.strerror} ({ENV})"
    finally:
        for fd in fds:
            os.close(fd)


def _exists(name: str, parent: int) -> bool:
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
