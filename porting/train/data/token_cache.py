"""Tokens kept between runs: ``PORT_TOKEN_CACHE=DIR``, off unless set.

Why: every `port train` tokenises its data before step 1 (porting/train/data/token_file.py: the launcher once
for its msrun workers, a one-process run itself). Loading the HF tokenizer imports transformers and torch,
about 3 CPU-s on this machine before a single token, and a large SFT set takes minutes more; a relaunch, a
sweep over seeds or layouts, or the test suite's many runs of one recipe repeat the same work. Megatron-LM and
MindSpeed-LLM tokenise once, ahead of training, into files every run reads (Megatron-LM
tools/preprocess_data.py, MindSpeed-LLM preprocess_data.py); this is that, kept automatically.

With the variable set, a run looks for ``DIR/<key>-<sha256>.npz`` before it tokenises and, after a miss,
stores what it tokenised there. What makes it safe:

- the key covers everything the tokens depend on: the recipe's data section (with the data path and the
  tokenizer's directory, :func:`porting.train.data.token_file.identity`), the data's content (sha256 of the
  file, or of a dataset directory's files), every file of the tokenizer's directory but the weights (by
  content), the installed transformers, tokenizers and sentencepiece versions, and port's own tokenisation
  sources; a change to any of them is a miss;
- an entry is the token file format the workers already check (:mod:`token_file`), named by the sha256 of its
  bytes: a regular file (never a link), at most :data:`token_file.MAX_BYTES`, whose bytes hash to its name and
  whose record names this run's data and tokenizer; anything else is passed over with one warning and the
  data tokenised again;
- entries are written beside their final name and renamed into place (two racing runs write the same bytes);
  port never deletes from ``DIR``. A failed write (read-only, full disk) is one warning, not a failed run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from model_zoo.errors import RecipeError
from model_zoo.files import sha256_file, write_atomic
from porting.train.data import token_file
from porting.train.data.examples import TokenizedData
from porting.train.data.tables import data_sha256
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import Recipe

ENV = "PORT_TOKEN_CACHE"
ENTRY = re.compile(r"^([0-9a-f]{32})-([0-9a-f]{64})\.npz$")
# files of a model directory that hold weights, never read by a tokenizer (left out of the key: hashing 26 GB
# of a 13B model's shards at every launch would cost more than tokenising)
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".npz")
MAX_KEY_FILE = 256 << 20       # a tokenizer file: the largest public tokenizer.json is a few tens of MB
PACKAGES = ("transformers", "tokenizers", "sentencepiece")
SOURCES = (Path(__file__).resolve().parent, Path(__file__).resolve().parents[2] / "tokenizer.py")


@dataclass
class Tokens:
    """A run's tokens, the token file's bytes (:func:`token_file.encode`) and where they came from."""
    data: TokenizedData
    raw: bytes
    origin: str          # "tokenised", or "PORT_TOKEN_CACHE <entry name>"


def _versions() -> dict:
    out = {}
    for pkg in PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _sources() -> str:
    h = hashlib.sha256()
    for src in SOURCES:
        for f in sorted(src.glob("*.py")) if src.is_dir() else [src]:
            h.update(f"{f.name}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def _tokenizer_files(model_dir: Path) -> dict:
    out = {}
    for f in sorted(Path(model_dir).iterdir()):
        if f.is_symlink() or not f.is_file() or f.name.endswith(WEIGHTS):
            continue
        size = f.stat().st_size
        out[f.name] = sha256_file(f) if size <= MAX_KEY_FILE else f"{size} bytes, {f.stat().st_mtime_ns}"
    return out


def _data_digest(recipe: Recipe) -> str | None:
    """sha256 of the run's data, or None when the data path does not exist (tokenising says why)."""
    path = Path(recipe.data.path)
    return data_sha256(path) if path.is_file() or path.is_dir() else None


def key(recipe: Recipe, model_dir: Path, ident: dict, data_digest: str | None = None) -> str | None:
    """The cache key of this run's tokens (``data_digest``: the data's sha256 when already taken), or None
    when the data path does not exist."""
    data_digest = data_digest or _data_digest(recipe)
    if data_digest is None:
        return None
    doc = {"format": token_file.FORMAT, "identity": ident, "data": data_digest,
           "tokenizer": _tokenizer_files(model_dir), "versions": _versions(), "port": _sources()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def lookup(root: Path, k: str, ident: dict, warn: Callable[[str], None]) -> Tokens | None:
    """The entry of key ``k`` under ``root`` that passes every check, or None."""
    if not root.is_dir():
        return None
    for entry in sorted(root.glob(f"{k}-*.npz")):
        m = ENTRY.match(entry.name)
        if not m or m[1] != k:
            continue
        fix = "port tokenises the data again"
        try:
            raw = token_file.checked_bytes(entry, m[2], "in its name (changed after it was written)", fix)
            data = token_file.decode(entry, raw, ident, fix)
        except (OSError, RecipeError) as exc:
            warn(f"{ENV}: passed over {exc}")
            continue
        return Tokens(data, raw, f"{ENV} {entry.name}")
    return None


def store(root: Path, k: str, raw: bytes, warn: Callable[[str], None]) -> None:
    """Keep ``raw`` as key ``k``'s entry under ``root`` (created if missing); a failure is one warning."""
    dest = root / f"{k}-{hashlib.sha256(raw).hexdigest()}.npz"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not dest.exists() and not dest.is_symlink():
            write_atomic(dest, raw, error=RecipeError)
    except (OSError, RecipeError) as exc:
        warn(f"{ENV}: could not keep the tokens in {root} ({exc}); the run goes on without")


def tokenised(recipe: Recipe, model_dir: Path, warn: Callable[[str], None], environ=None) -> Tokens:
    """This run's tokens: from the cache when ``PORT_TOKEN_CACHE`` is set and holds them, else tokenised here
    (transformers loaded only then) and kept in the cache when it is set."""
    ident = token_file.identity(recipe, model_dir)
    root = (os.environ if environ is None else environ).get(ENV, "").strip()
    digest = _data_digest(recipe) if root else None   # taken once: the key, and the data report on a miss
    k = key(recipe, model_dir, ident, digest) if digest else None
    if k:
        hit = lookup(Path(root), k, ident, warn)
        if hit is not None:
            return hit
    from porting.tokenizer import load_tokenizer  # deferred: transformers (and torch), loaded on a miss only

    data = tokenize_dataset(recipe.data, load_tokenizer(model_dir), data_digest=digest)
    raw = token_file.encode(data, ident)
    if k:
        store(Path(root), k, raw, warn)
    return Tokens(data, raw, "tokenised")


def for_workers(recipe: Recipe, run_dir: Path, node: int = 0, warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """Tokenise the run's data here, once, or take it from ``PORT_TOKEN_CACHE``, into the run directory's token
    file (:mod:`token_file`), and return the environment entry (:data:`token_file.ENV`) of this node's workers."""
    from porting.model_paths import resolve_hf  # deferred: only a launch needs it

    model_dir = resolve_hf(recipe.model.source)
    tokens = tokenised(recipe, model_dir, warn or _stderr)
    if tokens.origin != "tokenised":
        _stderr(f"tokens: {tokens.data.report.examples} examples from {tokens.origin}")
    return {token_file.ENV: token_file.write_raw(run_dir, tokens.raw, node)}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
