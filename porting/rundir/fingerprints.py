"""Fingerprints of a run: per logical tensor and sampled step, statistics that compose across shards.

Written by `port train` (``logging.fingerprint_every: N``, porting/train/run/fingerprint.py) into
``RUN/fingerprints/rank_<r>.jsonl`` and by `port baseline run` (porting/baseline/fingerprint_torch.py) beside its
file; read by `port diverge` (porting/diverge/). One JSON line per record, after one header line:

    {"step": 3, "phase": "forward", "name": "model.layers.1", "count": 8192, "sum": ..., "sumsq": ...,
     "maxabs": ..., "nonfinite": 0, "digest": "<16 hex digits>"}

``phase``: ``batch`` (the step's input tokens: the data order), ``forward`` (a decoder layer's output on the real
positions of every row), ``collective`` (a gradient bucket's all-reduce: its input on one data-parallel rank, or its
output), ``gradient`` (a parameter's gradient of the step's mean token loss, reduced over the data parallel ranks,
before clipping) or ``update`` (parameter after the step minus before). ``name`` is the HF name
(converters/names.py; ``model.layers.<i>`` for a layer's output), so a port run and its torch baseline line up.

A ``collective`` record's name is the bucket and the side (:data:`COLLECTIVE`): ``allreduce/bucket_<k>/input/dp_<d>``
(data-parallel rank d's local bucket before the all-reduce: one per rank, never added across ranks) or
``allreduce/bucket_<k>/output`` (after it, written once: every rank holds it), with ``/tp_<t>`` after the bucket
under tensor parallelism (each tensor-parallel rank reduces its own shards). Three more fields say which gradients
the bucket's flat buffer holds, in its order: ``first`` and ``last`` (HF names) and ``tensors`` (how many), so
two runs' buckets are compared only where they hold the same gradients.

Why these statistics: count, sum, sum of squares and the maximum magnitude of a tensor are the sums (or maximum)
of its shards' own, so a tensor-parallel slice, a data-parallel rank's rows or a ZeRO shard each write their own
record and the reader adds them, with no gather in the run. The sums are taken in float32 over chunks of
``CHUNK`` elements (NumPy's pairwise summation: relative error below ~30 float32 roundings, 2e-6, of the sum of
magnitudes) and added in float64 across chunks: a hundredth of `port diverge`'s tightest envelope (2.4e-4,
docs/diverge.md), at a third of the float64 conversion's cost.

The digest (format 2) is the sum mod 2^64 of a hash of each logical *pair* of elements: the float32 bits of
elements 2p and 2p+1 of the flattened logical tensor as one little-endian 64-bit word w_p (an odd count pads with
zero bits), hashed as SplitMix64's finaliser of w_p + (p+1)*0x9E3779B97F4A7C15 (Steele, Lea, Flood, "Fast
splittable pseudorandom number generators", OOPSLA 2014: the generator's p-th output from state w_p).
Order-independent and additive, so two runs whose digests agree hold the same bits at the same logical places
(up to a 2^-64 collision for changes not built against the constant), whatever their layout. A shard composes
when its pairs are logical pairs (a tensor-parallel slice whose slab below the split axis holds an even count:
every zoo model's); `port train` refuses another before its first step, :func:`stat_of` one it is handed. Format 1 hashed each element with its index (twice the hashing); its
files are still read, and `port diverge` compares two runs of one format only. Elements are hashed in float32
(exact for bfloat16 and float16 values).
"""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

import numpy as np

from model_zoo.errors import PortingError
from model_zoo.files import parse_json, read_text

VERSION = 2
VERSIONS = (1, 2)        # what the reader reads; digests compare within one version only
PHASES = ("batch", "forward", "collective", "gradient", "update")
# a collective record's name: (bucket: the all-reduce and its bucket, with its tensor-parallel rank), then the side
COLLECTIVE = re.compile(r"(allreduce/bucket_([0-9]{1,6})(?:/tp_[0-9]{1,6})?)/(?:input/dp_([0-9]{1,6})|output)")
_HF_NAME = re.compile(r"[A-Za-z0-9_.]{1,256}")
MAX_FILE_BYTES = 256 << 20      # one rank's file; the writer stops (and says so) before it
MAX_LINE_BYTES = 4096
CHUNK = 1 << 18                 # elements at a time: constant memory for any tensor, a chunk in cache
_M = 0xFFFFFFFFFFFFFFFF


class FingerprintError(PortingError):
    """A fingerprint file that cannot be read."""


@dataclass(frozen=True)
class Stat:
    """One record's statistics; ``+`` composes two shards of one logical tensor."""

    count: int
    sum: float
    sumsq: float
    maxabs: float
    nonfinite: int
    digest: int

    def __add__(self, o: "Stat") -> "Stat":
        return Stat(self.count + o.count, self.sum + o.sum, self.sumsq + o.sumsq, max(self.maxabs, o.maxabs),
                    self.nonfinite + o.nonfinite, (self.digest + o.digest) & _M)

    def as_dict(self) -> dict:
        return {"count": self.count, "sum": _num(self.sum), "sumsq": _num(self.sumsq), "maxabs": _num(self.maxabs),
                "nonfinite": self.nonfinite, "digest": f"{self.digest:016x}"}


EMPTY = Stat(0, 0.0, 0.0, 0.0, 0, 0)


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _mix(x: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, element-wise on uint64 in place (wrapping arithmetic, as the reference C)."""
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        np.right_shift(x, np.uint64(shift), out=tmp)
        x ^= tmp
        x *= np.uint64(mul)
    np.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp
    return x


_GAMMA = 0x9E3779B97F4A7C15
_STEPS = np.arange(1, CHUNK // 2 + 1, dtype=np.uint64) * np.uint64(_GAMMA)   # (j+1)*gamma, j a pair in a chunk


def _words(part: np.ndarray) -> np.ndarray:
    """A float32 chunk's pairs as little-endian 64-bit words (a copy when the count is odd: zero bits pad it)."""
    if part.size % 2:
        part = np.concatenate([part, np.zeros(1, np.float32)])
    return part.view(np.dtype("<u8"))


def _digest_run(part: np.ndarray, first_pair: int) -> int:
    """The digest of a chunk whose pairs are logical pairs ``first_pair``, ``first_pair + 1``, ... in order."""
    w = _words(part)
    x = np.add(w, _STEPS[:w.size])
    x += np.uint64((first_pair * _GAMMA) & _M)
    return int(_mix(x, np.empty_like(x)).sum(dtype=np.uint64))


def _digest_placed(part: np.ndarray, pos: np.ndarray, index_of) -> int:
    """The digest of a shard's chunk at local flat positions ``pos`` (even-length, starting even) placed by
    ``index_of``; each local pair must be a logical pair."""
    logical = index_of(pos.astype(np.int64))
    even, odd = logical[0::2], logical[1::2]
    if np.any(even % 2) or np.any(odd != even + 1):
        raise FingerprintError("a tensor shard whose element pairs are not pairs of the logical tensor (an odd last "
                               "dimension in a slice); its digest cannot compose")
    x = _words(part) + (even // 2 + 1).astype(np.uint64) * np.uint64(_GAMMA)
    return int(_mix(x, np.empty_like(x)).sum(dtype=np.uint64))


def _moments(part: np.ndarray) -> tuple[float, float, float, int]:
    """Sum, sum of squares, largest magnitude and the count of non-finite elements of a float32 chunk: float32
    pairwise sums (module docstring); the non-finite left out, and float64 where float32 sums overflow."""
    s = float(part.sum())
    q = float(np.square(part).sum())
    if not math.isfinite(s + q):   # only then: count and leave out the non-finite elements, sum in float64
        fin = part[np.isfinite(part)].astype(np.float64)
        if not fin.size:
            return 0.0, 0.0, 0.0, part.size
        return float(fin.sum()), float(np.dot(fin, fin)), float(np.abs(fin).max()), part.size - fin.size
    return s, q, (max(float(part.max()), -float(part.min())) if part.size else 0.0), 0


def stat_of(x: np.ndarray, index_of=None, minus: np.ndarray | None = None) -> Stat:
    """The statistics of ``x`` (any float array), or of ``x - minus`` in float32 (an update: after minus before,
    a chunk at a time, the whole difference never in memory). ``index_of(flat positions) -> logical indices``
    places a shard in its logical tensor; None: ``x`` is the whole tensor, its flat position is its index.
    Chunks run on up to ``THREADS`` threads (NumPy's loops release the GIL; the step's own threads are idle while
    the fingerprints are taken); their sums are added in chunk order, so the result does not depend on them."""
    flat = np.ascontiguousarray(x).reshape(-1)
    less = None if minus is None else np.ascontiguousarray(minus, dtype=np.float32).reshape(-1)
    if index_of is not None and flat.size % 2:
        raise FingerprintError("a tensor shard of an odd element count; its digest cannot compose")

    def chunk(lo: int) -> tuple[int, float, float, float, int]:   # CHUNK is even: a chunk starts on a pair
        part = np.ascontiguousarray(flat[lo:lo + CHUNK], dtype=np.float32)
        if less is not None:
            part = np.subtract(part, less[lo:lo + CHUNK])
        if index_of is None:
            d = _digest_run(part, lo // 2)
        else:
            d = _digest_placed(part, np.arange(lo, lo + part.size, dtype=np.int64), index_of)
        return (d, *_moments(part))

    starts = range(0, flat.size, CHUNK)
    parts = list(_pool().map(chunk, starts)) if len(starts) > 1 else [chunk(lo) for lo in starts]
    total, sumsq, big, bad, dig = 0.0, 0.0, 0.0, 0, 0
    for d, s, q, m, b in parts:
        total, sumsq, big, bad, dig = total + s, sumsq + q, max(big, m), bad + b, (dig + d) & _M
    return Stat(int(flat.size), total, sumsq, big, bad, dig)


THREADS = max(1, min(4, os.cpu_count() or 1))
_POOL: list = []


def _pool() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(THREADS, thread_name_prefix="port-fingerprints"))
    return _POOL[0]


def shard_index(local_shape: tuple[int, ...], full_shape: tuple[int, ...], axis: int, offset: int):
    """``index_of`` for a contiguous slice along ``axis`` starting at ``offset`` (a tensor-parallel shard)."""
    def index_of(pos: np.ndarray) -> np.ndarray:
        coords = list(np.unravel_index(pos, local_shape))
        coords[axis] = coords[axis] + offset
        return np.ravel_multi_index(tuple(coords), full_shape)
    return index_of


def rows_stat(x: np.ndarray, lengths: Iterable[int]) -> Stat:
    """The real positions of right-padded rows ``x`` (B, S, ...): row b's first ``lengths[b]`` positions, each
    element indexed by (position, feature): rows are a multiset, so any split of the rows over data-parallel ranks
    or micro-batches composes to the same record."""
    out = EMPTY
    for b, n in enumerate(lengths):
        out = out + stat_of(x[b, :int(n)])
    return out


class Writer:
    """One rank's fingerprint file: a header line, then one line per record, flushed per step; stops (with one
    warning record) before ``MAX_FILE_BYTES``. ``fresh``: the file starts again (a baseline run); else a launch
    appends after the earlier launches' lines with a header of its own (a resumed or relaunched run, whose
    re-run steps replace the earlier records: :func:`read_file`). A file that is not a fingerprint file is never
    written over."""

    def __init__(self, path: Path, header: dict, warn=None, fresh: bool = False):
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise FingerprintError(f"{path}: exists and is not a regular file; port writes fingerprints only there")
        if path.exists() and path.stat().st_size:
            with open(path, encoding="utf-8", errors="replace") as f:
                first = f.readline(MAX_LINE_BYTES)
            if not first.startswith('{"fingerprints":'):
                raise FingerprintError(f"{path}: exists and is not a fingerprint file port wrote; move it away")
        self.path, self.warn, self.full = path, warn or (lambda s: None), False
        self.f: IO[str] = open(path, "w" if fresh else "a", encoding="utf-8")
        self.bytes = 0 if fresh else path.stat().st_size
        self._line({"fingerprints": VERSION, **header})

    def _line(self, obj: dict) -> None:
        text = json.dumps(obj, separators=(",", ":")) + "\n"
        if self.bytes + len(text) > MAX_FILE_BYTES - MAX_LINE_BYTES:
            if not self.full:
                self.full = True
                self.f.write(json.dumps({"truncated": True}) + "\n")
                self.warn(f"{self.path}: reached {MAX_FILE_BYTES >> 20} MiB; no more fingerprints are written")
            return
        self.f.write(text)
        self.bytes += len(text)

    def record(self, step: int, phase: str, name: str, stat: Stat, bucket: dict | None = None) -> None:
        """One record; ``bucket`` a collective's ``first``, ``last`` and ``tensors`` (module docstring)."""
        self._line({"step": step, "phase": phase, "name": name, **(bucket or {}), **stat.as_dict()})

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


Key = tuple[int, str, str]   # (step, phase, name)
BucketInfo = tuple[str, str, int]   # a collective's (first, last, tensors)


def collective_name(bucket: int, dp_rank: int | None, tp_rank: int | None = None) -> str:
    """A collective record's name: bucket ``bucket``'s input on data-parallel rank ``dp_rank``, or (None) its
    output; ``tp_rank`` under tensor parallelism."""
    tp = "" if tp_rank is None else f"/tp_{tp_rank}"
    return f"allreduce/bucket_{bucket}{tp}/" + ("output" if dp_rank is None else f"input/dp_{dp_rank}")


@dataclass
class Fingerprints:
    """Every record of one run, composed over its files: ``stats[(step, phase, name)]``; ``headers`` one per
    file; ``names[phase]`` in the order first written (the order of a step's forward, its parameters)."""

    headers: list[dict]
    stats: dict[Key, Stat]
    names: dict[str, list[str]]
    truncated: bool = False
    buckets: dict[str, BucketInfo] = field(default_factory=dict)   # a collective's bucket -> what it holds

    @property
    def steps(self) -> list[int]:
        return sorted({k[0] for k in self.stats})


def _stat_from(row: dict, where: str) -> Stat:
    try:
        vals = [row[k] for k in ("count", "sum", "sumsq", "maxabs", "nonfinite", "digest")]
        c, s, q, m, n, d = vals
        ok = (isinstance(c, int) and isinstance(n, int) and 0 <= c < 1 << 62 and 0 <= n <= c
              and isinstance(d, str) and len(d) == 16
              and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in (s, q, m)))
        if not ok:
            raise ValueError
        nan = float("nan")
        return Stat(c, nan if s is None else float(s), nan if q is None else float(q),
                    nan if m is None else float(m), n, int(d, 16))
    except (KeyError, ValueError, TypeError):
        raise FingerprintError(f"{where}: expected a fingerprint record (count, sum, sumsq, maxabs, nonfinite, "
                               "digest of 16 hex digits); the file was edited or is not one port wrote") from None


def read_file(path: Path, into: Fingerprints) -> None:
    """Add one rank's file to ``into`` (bounded: ``MAX_FILE_BYTES``, ``MAX_LINE_BYTES`` a line). A later launch's
    record of a step replaces the earlier launch's (a resume re-runs the steps after its checkpoint)."""
    text = read_text(path, what="fingerprint file", max_bytes=MAX_FILE_BYTES, error=FingerprintError,
                     follow_links=False)
    mine: dict[Key, Stat] = {}
    launch: set[Key] = set()
    for i, line in enumerate(text.splitlines(), 1):
        where = f"{path} line {i}"
        if len(line) > MAX_LINE_BYTES:
            raise FingerprintError(f"{where}: a line of {len(line):,} characters, more than {MAX_LINE_BYTES}; "
                                   "not a fingerprint file port wrote")
        row = parse_json(line, where=where, what="fingerprint line", max_depth=4, error=FingerprintError)
        if not isinstance(row, dict):
            raise FingerprintError(f"{where}: expected a JSON object")
        if "fingerprints" in row or i == 1:
            if row.get("fingerprints") not in VERSIONS:
                raise FingerprintError(f"{where}: expected the header {{\"fingerprints\": {VERSION}, ...}} (or "
                                       f"{', '.join(map(str, VERSIONS[:-1]))}); not a fingerprint file of this port")
            into.headers.append(row)
            launch = set()
            continue
        if row.get("truncated") is True:
            into.truncated = True
            continue
        key, stat = _record(row, where)
        if key[1] == "collective":
            _bucket(row, key[2], where, into.buckets)
        if key not in launch:   # this launch's first record of the key replaces an earlier launch's
            launch.add(key)
            mine[key] = EMPTY
        mine[key] = mine[key] + stat
        if key[2] not in into.names.setdefault(key[1], []):
            into.names[key[1]].append(key[2])
    for key, stat in mine.items():
        into.stats[key] = into.stats.get(key, EMPTY) + stat


def _record(row: dict, where: str) -> tuple[Key, Stat]:
    step, phase, name = row.get("step"), row.get("phase"), row.get("name")
    if not (isinstance(step, int) and 1 <= step < 1 << 40 and phase in PHASES and isinstance(name, str)
            and 0 < len(name) <= 256):
        raise FingerprintError(f"{where}: expected step (>= 1), phase (one of {', '.join(PHASES)}) and name")
    return (step, phase, name), _stat_from(row, where)


def _bucket(row: dict, name: str, where: str, into: dict[str, BucketInfo]) -> None:
    """A collective record's name and bucket fields checked; the bucket added to ``into`` (one description each)."""
    m = COLLECTIVE.fullmatch(name)
    first, last, n = row.get("first"), row.get("last"), row.get("tensors")
    if m is None or not (isinstance(first, str) and _HF_NAME.fullmatch(first) and isinstance(last, str)
                         and _HF_NAME.fullmatch(last) and isinstance(n, int) and 1 <= n < 1 << 20):
        raise FingerprintError(f"{where}: expected a collective record: name "
                               "allreduce/bucket_<k>[/tp_<t>]/input/dp_<d> or .../output, first and last (HF names), tensors (a count); the file was edited or "
                               "is not one port wrote")
    seen = into.setdefault(m.group(1), (first, last, n))
    if seen != (first, last, n):
        raise FingerprintError(f"{where}: {m.group(1)} holds {first}..{last} ({n} tensors) here and "
                               f"{seen[0]}..{seen[1]} ({seen[2]}) in an earlier record; not a run port wrote")


def read(folder: Path, max_files: int = 4096) -> Fingerprints:
    """Every ``rank_<r>.jsonl`` of ``folder`` (a run's ``fingerprints/``), composed."""
    files = sorted(p for p in folder.glob("rank_*.jsonl"))[:max_files + 1] if folder.is_dir() else []
    if not files:
        raise FingerprintError(f"{folder}: no fingerprint files (rank_<r>.jsonl); run with "
                               "--set logging.fingerprint_every=N (port train, port baseline run)")
    if len(files) > max_files:
        raise FingerprintError(f"{folder}: more than {max_files} fingerprint files; not a run port wrote")
    out = Fingerprints([], {}, {})
    for p in files:
        read_file(p, out)
    return out
