"""The run's tokenised data, written once by the launching `port train` and read by each of its msrun workers.

Without it every worker of a node loads the HF tokenizer (transformers, which imports torch: about 250 MB
more peak host RAM per worker, measured by benchmarks/worker_tokens.py) and tokenises the whole dataset,
the same work once per rank. Megatron-LM and MindSpeed-LLM tokenise once, ahead of training (Megatron-LM
tools/preprocess_data.py, MindSpeed-LLM preprocess_data.py: an indexed binary dataset every rank maps);
here the launcher does it for the run it starts (``token_cache.for_workers``, which can take the tokens from
``PORT_TOKEN_CACHE``), into ``RUN/data_tokens_node<N>.npz`` (N: its node).

The worker learns the file and its sha256 from :data:`ENV`, set by the launcher in the workers'
environment; it reads nothing the digest does not match, the file must sit in its own run directory, and
the arrays are checked against each other before any example is built. A worker started without the
variable (a multi-node command run by hand from ``--dry-run``) tokenises as before.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from dataclasses import fields
from pathlib import Path

import numpy as np

from model_zoo.errors import RecipeError
from model_zoo.files import write_atomic
from porting.train.data.examples import DataReport, Example, TokenizedData
from porting.train.recipe.schema import Recipe

ENV = "PORT_TOKENS"            # "<sha256>:<file name in the run directory>"
FILE = "data_tokens_node{node}.npz"   # one per node: nodes sharing a run directory never replace each other's
NAME = re.compile(r"^data_tokens_node\d{1,4}\.npz$")
FORMAT = 1
MAX_BYTES = 64 << 30           # 8 bytes per token (ids and labels): ~8 billion tokens, far past any SFT set
MAX_META_BYTES = 4 << 20       # the report and the data section: a few KB
ARRAYS = {"ids": np.int32, "labels": np.int32, "offsets": np.int64, "sources": np.int64, "meta": np.uint8}


def identity(recipe: Recipe, model_dir: Path) -> dict:
    """What the tokens depend on: the recipe's data section and the tokenizer's directory."""
    return {"data": recipe.data.model_dump(mode="json"), "tokenizer": str(Path(model_dir).resolve())}


def encode(data: TokenizedData, ident: dict) -> bytes:
    """The token file's bytes of ``data`` for the run identified by ``ident`` (:func:`identity`)."""
    ex = data.examples
    lengths = data.lengths
    offsets = np.zeros(len(ex) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    meta = json.dumps({"format": FORMAT, "pad_id": int(data.pad_id), "report": data.report.as_dict(), **ident})
    buf = io.BytesIO()
    np.savez(buf, ids=np.concatenate([e.input_ids for e in ex]).astype(np.int32, copy=False),
             labels=np.concatenate([e.labels for e in ex]).astype(np.int32, copy=False), offsets=offsets,
             sources=np.fromiter((e.source for e in ex), np.int64, len(ex)),
             meta=np.frombuffer(meta.encode("utf-8"), np.uint8))
    return buf.getvalue()


def write(run_dir: Path, data: TokenizedData, ident: dict, node: int = 0) -> str:
    """Write ``data`` to ``run_dir/FILE`` (atomically) and return :data:`ENV`'s value for node ``node``'s
    workers."""
    return write_raw(run_dir, encode(data, ident), node)


def write_raw(run_dir: Path, raw: bytes, node: int = 0) -> str:
    """Write a token file's bytes (:func:`encode`) to ``run_dir/FILE`` and return :data:`ENV`'s value."""
    path = Path(run_dir) / FILE.format(node=node)
    # digested before it is renamed into place: the digest is of the bytes port wrote, so a file swapped in
    # after the rename (another process in the run directory) is refused by the workers, never trusted
    digest = hashlib.sha256(raw).hexdigest()
    write_atomic(path, raw, error=RecipeError)
    return f"{digest}:{path.name}"


def read(value: str, run_dir: Path, ident: dict) -> TokenizedData:
    """The launcher's tokens named by :data:`ENV`'s ``value``, checked; one RecipeError line otherwise."""
    digest, _, name = value.partition(":")
    if len(digest) != 64 or not NAME.match(name):
        raise RecipeError(f"{ENV}={value[:100]!r}: expected '<sha256>:data_tokens_node<N>.npz', as `port train` "
                          "sets it for its workers; unset it to let each worker tokenise the data itself")
    path = Path(run_dir) / name
    fix = f"rerun `port train` (it writes {name} before it launches the workers)"
    raw = checked_bytes(path, digest, "the launcher wrote (changed after the launch)", fix)
    return decode(path, raw, ident, fix)


def checked_bytes(path: Path, digest: str, whose: str, fix: str) -> bytes:
    """The bytes of token file ``path``: a regular file (never a link) of at most :data:`MAX_BYTES` whose bytes
    hash to ``digest`` (the one ``whose`` names); one RecipeError line (ending with ``fix``) otherwise."""
    if not path.is_file() or path.is_symlink():
        raise RecipeError(f"{path}: missing or not a regular file; {fix}")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise RecipeError(f"{path}: {size:,} bytes, more than the {MAX_BYTES:,} a token file may have; {fix}")
    raw = path.read_bytes()   # hashed and parsed from the same bytes: no swap between the check and the use
    if hashlib.sha256(raw).hexdigest() != digest:
        raise RecipeError(f"{path}: its sha256 is not the one {whose}; {fix}")
    return raw


def decode(path: Path, raw: bytes, ident: dict, fix: str) -> TokenizedData:
    """The examples in a token file's bytes ``raw`` (read from ``path``), checked against each other and
    against ``ident``; one RecipeError line (ending with ``fix``) otherwise."""
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k in ARRAYS}
            extra = sorted(set(z.files) - set(ARRAYS))
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise RecipeError(f"{path}: not a token file ({exc}); {fix}") from None
    return _examples(path, arrays, extra, ident, fix)


def _examples(path: Path, a: dict, extra: list, ident: dict, fix: str) -> TokenizedData:
    bad = extra or sorted(set(ARRAYS) - set(a)) or [k for k, t in ARRAYS.items() if a[k].dtype != t or a[k].ndim != 1]
    if bad:
        raise RecipeError(f"{path}: arrays {bad[:5]} missing, unexpected or of the wrong type; {fix}")
    ids, labels, offsets, sources = a["ids"], a["labels"], a["offsets"], a["sources"]
    n = len(sources)
    if (len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(ids) or len(labels) != len(ids)
            or (n and (np.diff(offsets) < 0).any())):
        raise RecipeError(f"{path}: the example offsets do not match the token arrays; {fix}")
    if len(a["meta"]) > MAX_META_BYTES:
        raise RecipeError(f"{path}: its record is {len(a['meta']):,} bytes, more than {MAX_META_BYTES:,}; {fix}")
    try:
        meta = json.loads(a["meta"].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RecipeError(f"{path}: its record is not JSON ({exc}); {fix}") from None
    known = {f.name for f in fields(DataReport)}
    rep = meta.get("report") if isinstance(meta, dict) else None
    if (not isinstance(meta, dict) or meta.get("format") != FORMAT or type(meta.get("pad_id")) is not int
            or not isinstance(rep, dict) or not set(rep) <= known):
        raise RecipeError(f"{path}: not a format-{FORMAT} token record; {fix}")
    for key in ("data", "tokenizer"):
        if meta.get(key) != ident[key]:
            raise RecipeError(f"{path}: written for another {'data section' if key == 'data' else 'tokenizer'} "
                              f"than this worker's recipe ({key}); {fix}")
    try:
        report = DataReport(**rep)
    except TypeError as exc:
        raise RecipeError(f"{path}: its data report is malformed ({exc}); {fix}") from None
    examples = [Example(ids[s:e], labels[s:e], int(src)) for s, e, src in zip(offsets[:-1], offsets[1:], sources)]
    return TokenizedData(examples, report, meta["pad_id"])
