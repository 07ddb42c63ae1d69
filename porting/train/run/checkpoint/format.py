"""Per-rank training checkpoints (format 2): every rank writes what it owns, plus one layout record.

``checkpoints/step_<n>/`` holds ``rank_<r:05d>.safetensors`` for every rank that owns state,
``layout.json`` (:class:`Layout` and the run's identity, written once by rank 0 after every rank has
written) and ``state.json`` (:class:`porting.train.run.checkpoint.save.TrainState`: the step, AdamW's update
count, the loss scale; the data cursor is the step, since the data order is a function of the seed and
the step). No rank reads another rank's file while training, and nothing is merged inside the job.

What a rank owns (:func:`owned`), in four kinds of state, each kept per parameter so that any later
layout can be cut from it: ``param`` (the weight in its own dtype), ``master`` (fp32 master weights,
when the parameters are bf16/fp16), ``adam_m`` and ``adam_v`` (fp32). A stored piece is a flat element
range ``[a, b)`` of the tensor-parallel slice ``t`` of one parameter (its TP-local tensor in row-major
order). With ZeRO (porting/train/run/step/zero.py) data-parallel rank ``d`` owns the range ``[d n, (d + 1) n)`` of
each flat bucket (n = padded / dp) and so the pieces of the parameters that fall in it, for all four
kinds (the weights too: the copy work spreads over the ranks); without ZeRO data-parallel rank 0 of
each tensor-parallel slice owns everything. Megatron's ``fully_reshardable`` distributed-optimizer
format makes the same choice of storing optimizer state per parameter rather than per flat bucket
(NVIDIA/Megatron-LM megatron/core/optimizer/distrib_optimizer.py, ``sharded_state_dict``).

Reading back (any layout) is :mod:`porting.train.run.checkpoint.read`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from converters import dtypes
from converters.safetensors_io import OutTensor, encode_header, write_all
from model_zoo import files
from model_zoo.errors import CheckpointError

if TYPE_CHECKING:   # hints only: a merge and an export load no recipe schema (pydantic, 0.13 CPU-s)
    from porting.train.recipe.schema import Recipe

FORMAT = 2
LAYOUT_FILE = "layout.json"
RANK_FILE = re.compile(r"^rank_(\d{5})\.safetensors$")
MAX_LAYOUT_BYTES = 64 << 20
MAX_WORLD = 1 << 16
OPT_KINDS = ("master", "adam_m", "adam_v")
CODES = {"F32": 4, "BF16": 2, "F16": 2}
# Recipe keys that only say how the work is laid out (or how long and how loudly it runs): they may
# change across a resume. Everything else must be equal, or the continued run is not the same run.
# nonfinite: its caps and data windows decide what later steps do, never what a checkpoint holds (a supervised
# rollback resumes with a new window, porting/train/run/step/nonfinite.py)
LAYOUT_KEYS = ("cluster", "parallel", "checkpointing", "logging", "model", "output_dir", "execution",
               "batching.micro_batch_size", "batching.grad_accum_steps", "schedule.max_steps", "nonfinite")


def rank_file(rank: int) -> str:
    return f"rank_{rank:05d}.safetensors"


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]   # the full (unsharded) shape
    axis: int | None         # tensor-parallel split axis; None: replicated on every TP rank
    dtype: str               # safetensors code of the parameter: F32, BF16, F16

    def local_shape(self, tp: int) -> tuple[int, ...]:
        if self.axis is None or tp == 1:
            return self.shape
        s = list(self.shape)
        s[self.axis] //= tp
        return tuple(s)

    def local_numel(self, tp: int) -> int:
        return math.prod(self.local_shape(tp))   # Python integers: a hostile shape cannot wrap around


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a run's state is spread: world, TP, ZeRO stage, the parameters and the flat buckets."""

    world: int
    tp: int
    zero: int                                        # 0: optimizer states replicated; 1 or 2: ZeRO stage
    masters: bool                                    # fp32 master weights are part of the state
    params: tuple[ParamSpec, ...]
    buckets: tuple[tuple[tuple[int, ...], int], ...]  # ZeRO: (parameter indices, padded elements)

    @property
    def dp(self) -> int:
        return self.world // self.tp

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("param",) + (OPT_KINDS if self.masters else OPT_KINDS[1:])

    def to_dict(self) -> dict[str, Any]:
        return {"world": self.world, "tp": self.tp, "zero": self.zero, "masters": self.masters,
                "params": [{"name": p.name, "shape": list(p.shape), "axis": p.axis, "dtype": p.dtype}
                           for p in self.params],
                "buckets": [{"params": list(idx), "padded": n} for idx, n in self.buckets]}


def zero_ranges(layout: Layout, d: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(bucket, parameter, a, b, position in the shard) of data-parallel rank ``d``'s ZeRO shards."""
    for k, (idx, padded) in enumerate(layout.buckets):
        n = padded // layout.dp
        lo, hi, off = d * n, (d + 1) * n, 0
        for i in idx:
            numel = layout.params[i].local_numel(layout.tp)
            a, b = max(lo, off) - off, min(hi, off + numel) - off
            if a < b:
                yield k, i, a, b, off + a - lo
            off += numel


def owned_ranges(layout: Layout) -> Iterator[tuple[int, int, int, int]]:
    """(data-parallel rank, parameter, a, b) of every range any rank owns, in O(parameters + ranges): the
    ranks of a bucket's parameter are found by division, not by walking every rank (a record of world
    65,536 is answered as fast as one of world 8)."""
    if not layout.zero:
        yield from ((0, i, a, b) for i, a, b in _full(layout))
        return
    for idx, padded in layout.buckets:
        n, off = padded // layout.dp, 0
        for i in idx:
            numel = layout.params[i].local_numel(layout.tp)
            for d in range(off // n, (off + numel - 1) // n + 1):
                yield d, i, max(d * n, off) - off, min((d + 1) * n, off + numel) - off
            off += numel


def count_ranges(layout: Layout) -> int:
    """How many ranges :func:`owned_ranges` yields (arithmetic only: the bound checked before it runs)."""
    if not layout.zero:
        return len(layout.params)
    total = 0
    for idx, padded in layout.buckets:
        n, off = padded // layout.dp, 0
        for i in idx:
            numel = layout.params[i].local_numel(layout.tp)
            total += (off + numel - 1) // n - off // n + 1
            off += numel
    return total


def owners(layout: Layout) -> list[int]:
    """The ranks that write a rank file, in O(buckets): data-parallel rank d owns something when some
    bucket's real elements (not its padding) reach its range."""
    if not layout.zero:
        dps = 1
    else:
        dps = max((-(-sum(layout.params[i].local_numel(layout.tp) for i in idx) // (padded // layout.dp))
                   for idx, padded in layout.buckets), default=0)
    return [d * layout.tp + t for d in range(min(dps, layout.dp)) for t in range(layout.tp)]


def _full(layout: Layout) -> list[tuple[int, int, int]]:
    return [(i, 0, p.local_numel(layout.tp)) for i, p in enumerate(layout.params)]


def owned(layout: Layout, rank: int) -> list[tuple[str, int, int, int]]:
    """(kind, parameter, a, b): what ``rank`` writes. See the module docstring."""
    d = rank // layout.tp
    if layout.zero:
        ranges = [(i, a, b) for _, i, a, b, _ in zero_ranges(layout, d)]
    else:
        ranges = _full(layout) if d == 0 else []
    return [(kind, i, a, b) for kind in layout.kinds for i, a, b in ranges]


def needed(layout: Layout, rank: int) -> list[tuple[str, int, int, int]]:
    """What ``rank`` holds while training: its whole TP-local weights and its share of the optimizer."""
    opt = [(i, a, b) for _, i, a, b, _ in zero_ranges(layout, rank // layout.tp)] if layout.zero else _full(layout)
    return ([("param", i, a, b) for i, a, b in _full(layout)]
            + [(kind, i, a, b) for kind in layout.kinds[1:] for i, a, b in opt])


def piece_bytes(layout: Layout, pieces: list[tuple[str, int, int, int]]) -> int:
    return sum((b - a) * (CODES[layout.params[i].dtype] if kind == "param" else 4) for kind, i, a, b in pieces)


def piece_key(kind: str, name: str, t: int, a: int, b: int) -> str:
    """The tensor name of a piece inside a rank file."""
    return f"{kind}/{name}/tp{t}/{a}-{b}"


# --------------------------------------------------------------------------- the live run's layout
def _code(p) -> str:
    import mindspore as ms  # deferred: the launcher reads checkpoints' records without loading MindSpore

    return {ms.float32: "F32", ms.bfloat16: "BF16", ms.float16: "F16"}[p.dtype]


def live_layout(trainer) -> Layout:
    """The layout of a running :class:`porting.train.run.loop.Trainer`."""
    params = list(trainer.model.trainable_params())
    tp = trainer.grid.tp
    specs = []
    for p in params:
        axis = trainer.layout.get(p.name) if tp > 1 else None
        shape = list(p.shape)
        if axis is not None:
            shape[axis] *= tp
        specs.append(ParamSpec(p.name, tuple(shape), axis, _code(p)))
    opt, zero = trainer.optimizer, trainer.zero
    buckets = ()
    if zero is not None:
        buckets = tuple((tuple(idx), n * opt.dp) for idx, n in zip(opt.bucket_idx, opt.shard_sizes))
    return Layout(trainer.world, tp, zero.stage if zero is not None else 0, bool(opt.use_masters), tuple(specs),
                  buckets)


def identity(trainer) -> dict[str, Any]:
    """What must be equal for a resume to continue this run exactly, whatever the layout. A LoRA run's record
    also names its frozen base (``lora_base``, not compared: the checkpoint holds the adapters only, and the
    offline readers, `port ckpt merge` and `port compare`'s probe, find the base there)."""
    ident = identity_of(trainer.recipe, trainer.model.config.to_hf())
    if getattr(trainer.recipe, "lora", None) is not None:
        ident["lora_base"] = str(trainer.tokenizer_dir)
    return ident


def identity_of(recipe: Recipe, cfg: dict[str, Any]) -> dict[str, Any]:
    """:func:`identity` from the recipe and the model's HF config (what `port train` checks before launch)."""
    from porting.train.recipe.schema import recipe_dict  # deferred: pydantic's schemas (0.5 s); a merge reads records only

    rec = recipe_dict(recipe)
    for key in LAYOUT_KEYS:
        *path, last = key.split(".")
        d = rec
        for part in path:
            d = d.get(part, {})
        d.pop(last, None)
    return {"seed": recipe.seed, "global_batch": recipe.global_batch_size,
            "model_config_sha256": hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest(),
            "model_config": cfg, "recipe": rec}


def _f32(p, a: int, b: int) -> np.ndarray:
    """Elements [a, b) of ``p`` flattened, as float32 NumPy: sliced on the device before the copy to the
    host, so a save holds one piece on the host, not the whole parameter."""
    import mindspore as ms  # deferred: the launcher reads checkpoints' records without loading MindSpore

    part = ms.ops.reshape(p, (-1,))[a:b]
    return (part.astype(ms.float32) if part.dtype != ms.float32 else part).asnumpy()


def live_pieces(trainer, layout: Layout) -> list[tuple[str, str, int, Callable[[], np.ndarray]]]:
    """(key, dtype code, elements, read) of every piece this rank owns; ``read`` copies it off the live
    tensors when the writer gets to it, so one piece at a time is in host memory."""
    params = list(trainer.model.trainable_params())
    opt, t, d = trainer.optimizer, trainer.grid.tp_rank, trainer.grid.dp_rank
    states = {"master": opt.masters, "adam_m": opt.m, "adam_v": opt.v}
    where = {(i, a): (k, pos) for k, i, a, _, pos in zero_ranges(layout, d)} if layout.zero else {}
    out = []
    for kind, i, a, b in owned(layout, trainer.rank):
        spec = layout.params[i]
        if kind == "param":
            read = (lambda p=params[i], a=a, b=b: _f32(p, a, b))
        elif layout.zero:
            k, pos = where[(i, a)]
            read = (lambda s=states[kind][k], pos=pos, n=b - a: _f32(s, pos, pos + n))
        else:
            read = (lambda s=states[kind][i], a=a, b=b: _f32(s, a, b))
        out.append((piece_key(kind, spec.name, t, a, b), spec.dtype if kind == "param" else "F32", b - a, read))
    return out


# --------------------------------------------------------------------------- writing
CHUNK_BYTES = 4 << 20   # a rank file is verified in sha256 chunks of this size (layout.json lists them)
WRITEBACK_BYTES = 32 << 20   # a rank file's disk write is started every this many bytes (files.start_writeback)
# A rank file is hashed and written in slices small enough to stay in a core's L2 cache (2 MiB a core on the
# Xeon of BENCHMARKS.md "The first day of a 13B run"): an in-process reshard of a 1.43 GB checkpoint there took
# 2.2-2.5 s with 1 MiB slices, 3.5-6.4 s with 4 MiB slices and 4.4-7.5 s with whole pieces, the same bytes.
SLICE_BYTES = 1 << 20


def slices(data):
    """``data`` as consecutive byte views of at most :data:`SLICE_BYTES` bytes (read at each call)."""
    view, size = memoryview(data).cast("B"), SLICE_BYTES
    return (view[i:i + size] for i in range(0, len(view), size))


class ChunkDigests:
    """sha256 of every ``CHUNK_BYTES`` chunk of a byte stream, fed in any pieces. A reader checks only the
    chunks it reads (porting/train/run/checkpoint/read.py ``RankFiles``), so a resume that reads 1/8 of a file
    hashes 1/8 of it, while a flipped bit or a swapped file anywhere it reads is still refused."""

    def __init__(self, chunk: int = CHUNK_BYTES):
        self.chunk, self.done, self.digests = chunk, 0, []
        self._h = hashlib.sha256()

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self.chunk - self.done)
            self._h.update(view[:take])
            self.done, view = self.done + take, view[take:]
            if self.done == self.chunk:
                self.digests.append(self._h.hexdigest())
                self._h, self.done = hashlib.sha256(), 0

    def finish(self) -> list[str]:
        if self.done:
            self.digests.append(self._h.hexdigest())
            self._h, self.done = hashlib.sha256(), 0
        return self.digests


def write_rank(tmp: Path, rank: int, pieces: list) -> int:
    """Write ``rank_<r>.safetensors`` (header first, then each piece as it is read) and its sidecar
    ``.rank_<r>.json`` (bytes and the sha256 of every chunk, for rank 0's record); fsynced. Returns the
    bytes written."""

    if not pieces:
        return 0
    path = tmp / rank_file(rank)
    head = encode_header([OutTensor(key, code, (n,)) for key, code, n, _ in pieces],
                         {"format": f"port-train-rank/{FORMAT}", "rank": str(rank)})
    h = ChunkDigests()
    h.update(head)
    # each slice is hashed on a second thread while it is written (hashlib and write() release the GIL)
    with open(path, "wb") as f, ThreadPoolExecutor(max_workers=1) as hasher:
        write_all(f, head)
        hashed, started = None, 0
        for _, code, n, read in pieces:
            raw = dtypes.cast_bytes("F32", code, memoryview(np.ascontiguousarray(read(), np.float32)).cast("B"))
            for part in slices(raw):   # each slice hashed while it is written, both from a core's cache
                if hashed is not None:
                    hashed.result()   # one slice in flight: the digests stay in order
                hashed = hasher.submit(h.update, part)
                write_all(f, part)
            if f.tell() - started >= WRITEBACK_BYTES:   # the disk writes while the next pieces are read
                f.flush()
                files.start_writeback(f.fileno(), started, f.tell() - started)
                started = f.tell()
        if hashed is not None:
            hashed.result()
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    with open(tmp / f".rank_{rank:05d}.json", "w") as f:   # an OSError here fails the save like the file's
        f.write(json.dumps({"bytes": size, "chunk_bytes": h.chunk, "chunks": h.finish()}))
        f.flush()
        os.fsync(f.fileno())
    return size


def write_record(tmp: Path, layout: Layout, ident: dict[str, Any]) -> None:
    """Rank 0, after every rank wrote: gather the sidecars into ``layout.json`` (and remove them)."""
    want = owners(layout)
    table = {}
    for r in want:
        side = tmp / f".rank_{r:05d}.json"
        doc = files.read_json_object(side, what="rank file record", max_bytes=MAX_LAYOUT_BYTES, error=CheckpointError)
        table[rank_file(r)] = {"rank": r, "bytes": doc["bytes"], "chunk_bytes": doc["chunk_bytes"],
                               "chunks": doc["chunks"]}
    body = {"format": FORMAT, "layout": layout.to_dict(), "identity": ident, "files": table}
    with open(tmp / LAYOUT_FILE, "w") as f:   # inside the temporary directory: its rename is the atomic step
        f.write(json.dumps(body, indent=1))
        f.flush()
        os.fsync(f.fileno())
    for r in want:
        (tmp / f".rank_{r:05d}.json").unlink()


def rss(reset_peak: bool = False) -> tuple[int, int] | None:
    """(resident, peak resident) bytes of this process from /proc/self/status (Linux; None elsewhere).
    ``reset_peak`` first restarts the peak at the current size (``clear_refs`` 5, proc(5)), so a later
    call measures the peak of what ran in between."""
    try:
        if reset_peak:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        text = Path("/proc/self/status").read_text()
        kib = {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M)}
        return kib["VmRSS"] * 1024, kib["VmHWM"] * 1024
    except (OSError, KeyError, ValueError):
        return None


def complete(ckdir: Path) -> bool:
    """Every rank file the record lists is there (a record that does not parse still counts: it was
    renamed into place whole, so it is damaged, not partial, and loading it names the bad key)."""
    try:
        doc = files.read_json_object(ckdir / LAYOUT_FILE, what="checkpoint layout record",
                                     max_bytes=MAX_LAYOUT_BYTES, error=CheckpointError)
        names = [n for n in doc.get("files") or () if isinstance(n, str) and RANK_FILE.match(n)]
    except (CheckpointError, TypeError):
        return True
    return all((ckdir / n).is_file() for n in names)
