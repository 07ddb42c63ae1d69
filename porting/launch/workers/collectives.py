"""Entry point of one `msrun` worker of the compute rung's collective timing (porting/rehearse_compute.py):
``msrun ... collectives.py SPEC OUT``. SPEC names the group sizes to time (the recipe's tensor- and data-parallel
sizes that this node holds, and the node's whole group); for each size the world is cut into groups of that many
neighbouring ranks, all timed at once (as every TP or DP group of a step runs its collective at the same time), and
on each group every kind the step runs is timed as port runs it on this device:

* ``AllReduce``: native everywhere;
* ``ReduceScatter``: HCCL's own on Ascend; on the CPU MindSpore's ReduceScatter is a stub that computes nothing
  (MCCL, mindspore-ai/mindspore plugin/cpu/res_manager/collective/ms_collective_comm_lib.cc), so port runs an
  AllReduce and keeps its slice (porting/train/run/step/zero.py), and that is what is timed, named as emulated;
* ``AllGather``: native on Ascend and on the CPU's world group; on a CPU sub-group (no AllGather there) port
  all-reduces a zero buffer holding its piece at its offset (zero.py), timed as such.

Each collective is chained in one compiled cell (the per-call cost, not a launch: 8 calls up to 512 KiB, 2 of
4 MiB and 16 MiB), at payloads of 1 KiB to 16 MiB as the plan counts them (porting/train/plan/sharding.py: the
input of AllReduce and ReduceScatter, the gathered output of AllGather, whose pieces are 1/N of it); rank 0 writes
(payload bytes, ms a call) points per kind and group size.

Then the cost of *synchronising* workers that compute, which a collective timed alone does not hold (on a CPU node
whose workers outnumber its cores, 4 one-thread workers on 2 cores, the step's tensor-parallel collectives took
about twice their alone-timed figure, port's step breakdown of a TP 4 run; BENCHMARKS.md): for each group size,
a chain of matmul chunks of two sizes is timed with every rank computing and nothing else (``together_ms``), then
with a 1 KiB AllReduce on the group after each chunk that the next chunk depends on, as a tensor-parallel layer's
(``with_ms``), and on rank 0 alone while the others sleep (``alone_ms``, what the compute rung's one-process
pieces are). The plan (porting/train/plan/comm_price.py ``contention``) takes together / alone as the node's
compute factor and ``with - together - the 1 KiB call`` as the wait a synchronising call adds. A script in porting/launch/workers/ with the other msrun entry points (msrun runs a
script path; one in ``porting/`` itself would put that folder first on ``sys.path``, where ``porting/bisect``
hides the standard library's ``bisect``), started by the one launcher (porting/launch/jobs.py)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import create_group, get_group_size, get_rank, init
from mindspore.device_context.cpu.op_tuning import threads_num

REPEATS = 9
COLLECTIVE_ELEMENTS = (256, 1 << 14, 1 << 17, 1 << 20, 1 << 22)   # 1 KiB .. 16 MiB of float32 per rank
RS_EMULATED = ("AllReduce + this rank's slice (MindSpore's CPU ReduceScatter is a stub in MCCL; port's ZeRO runs "
               "this instead, porting/train/run/step/zero.py)")
AG_EMULATED = ("AllReduce of a zero buffer holding this rank's piece at its offset (the CPU's AllGather takes the "
               "world group only; port's ZeRO runs this instead, porting/train/run/step/zero.py)")


class Chain(nn.Cell):
    """``calls`` of one collective in one graph, as port runs it (``how``: "AllReduce", "ReduceScatter",
    "AllGather", or an emulation: "AllReduce + slice", "AllReduce of zero-padded"), each call's output turned back
    into an input of the same length for the next call."""

    def __init__(self, how: str, calls: int, kw: dict[str, str], n: int, me: int, elements: int):
        super().__init__()
        self.how, self.calls, self.n, self.elements = how, calls, n, elements
        self.chunk = elements // n
        self.lo, self.hi = me * self.chunk, (me + 1) * self.chunk
        self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, **kw)
        self.reduce_scatter = ops.ReduceScatter(ops.ReduceOp.SUM, **kw) if how == "ReduceScatter" else None
        self.all_gather = ops.AllGather(**kw) if how == "AllGather" else None
        mask = np.zeros((n * elements,), np.float32) if how == "AllReduce of zero-padded" else np.zeros((1,), np.float32)
        mask[me * elements:(me + 1) * elements] = 1.0
        self.mask = ms.Tensor(mask)   # this rank's piece at its offset, zeros elsewhere

    def one(self, x):
        if self.how == "AllReduce":
            return self.allreduce(x) * 0.5
        if self.how == "ReduceScatter":
            return ops.tile(self.reduce_scatter(x) * 0.5, (self.n,))
        if self.how == "AllReduce + slice":
            return ops.tile(self.allreduce(x)[self.lo:self.hi] * 0.5, (self.n,))
        if self.how == "AllGather":
            return self.all_gather(x)[:self.elements] * 0.5
        return self.allreduce(ops.tile(x, (self.n,)) * self.mask)[:self.elements] * 0.5   # AllReduce of zero-padded

    def construct(self, x):
        for _ in range(self.calls):
            x = self.one(x)
        return x


def kinds(native: bool, world_group: bool) -> dict[str, tuple[str, str]]:
    """kind -> (how port runs it on this device and group, why when emulated ("" native))."""
    return {"AllReduce": ("AllReduce", ""),
            "ReduceScatter": ("ReduceScatter", "") if native else ("AllReduce + slice", RS_EMULATED),
            "AllGather": ("AllGather", "") if native or world_group else ("AllReduce of zero-padded", AG_EMULATED)}


def time_group(native: bool, size: int, rank: int, world: int, counts: tuple[int, ...] = COLLECTIVE_ELEMENTS,
               repeats: int = REPEATS) -> dict[str, Any]:
    """Every kind on this rank's group of ``size`` neighbouring ranks: {kind: {"ranks", "points_bytes_ms", ...}}."""
    first = rank // size * size
    kw: dict[str, str] = {} if size == world else {"group": f"rehearse_{size}_{first}"}
    if kw:   # each rank creates the group it belongs to (MindSpore's create_group: called by its members)
        create_group(kw["group"], list(range(first, first + size)))
    out: dict[str, Any] = {}
    for name, (how, emulated) in kinds(native, size == world).items():
        points = []
        for e in counts:   # the payload: AllReduce's and ReduceScatter's input, AllGather's output
            elements = e // size * size   # N equal chunks (a ReduceScatter's input, an AllGather's output)
            calls = 8 if elements <= 1 << 17 else 2   # enough calls to see past the launch, few of the large ones
            piece = elements // size if name == "AllGather" else elements   # what one rank passes in
            cell = Chain(how, calls, kw, size, rank - first, piece)
            x = ms.Tensor(np.ones((piece,), np.float32))
            per_call = _median_of(lambda: cell(x).asnumpy(), repeats) / calls
            points.append([piece * 4 * (size if name == "AllGather" else 1), round(per_call * 1e3, 4)])
        out[name] = {"ranks": size, "points_bytes_ms": points, "latency_ms": points[0][1], "graph_mode": True,
                     "runs": how, "emulated": emulated}
    return out


CHUNKS = ((512, 512), (2048, 512))   # (rows, width) of one matmul chunk: ~1.5 and ~6 ms on one EPYC thread alone
SYNC_CALLS = 16   # chunks a timing: scheduling on a shared CPU averages over more of them
SYNC_ELEMENTS = 256   # float32 elements each synchronising AllReduce carries (1 KiB), whatever the chunk's width


class Chunks(nn.Cell):
    """``calls`` matmul chunks, each (with ``sync``) followed by a 1 KiB AllReduce on the group that the next chunk
    waits for: a tensor-parallel layer's compute-then-collective, at a payload whose own time is small."""

    def __init__(self, calls: int, kw: dict[str, str], width: int, sync: bool):
        super().__init__()
        self.calls, self.sync = calls, sync
        self.w = ms.Tensor(np.eye(width, dtype=np.float32) * 0.5 + 0.01)
        self.allreduce = ops.AllReduce(ops.ReduceOp.SUM, **kw)

    def construct(self, x):
        for _ in range(self.calls):
            x = ops.tanh(ops.matmul(x, self.w))
            if self.sync:
                x = x + ops.mean(self.allreduce(ops.reshape(x, (-1,))[:SYNC_ELEMENTS])) * 1e-6
        return x


def time_contention(size: int, rank: int, world: int, repeats: int = REPEATS,
                    chunk_shapes: tuple[tuple[int, int], ...] = CHUNKS, calls: int = SYNC_CALLS) -> dict[str, Any]:
    """The synchronisation points of ``size``-rank groups (module docstring): per chunk size the per-chunk ms of
    rank 0 alone, of every rank computing, and of every rank computing and synchronising on its group."""
    first = rank // size * size
    kw: dict[str, str] = {} if size == world else {"group": f"rehearse_{size}_{first}"}   # made by time_group
    barrier = ops.AllReduce(ops.ReduceOp.SUM)
    one = ms.Tensor(np.ones((1,), np.float32))

    def timed(cell, x, n):   # every rank starts together (a world barrier not timed), the median per chunk
        ts = []
        for i in range(n + 2):
            barrier(one).asnumpy()
            t0 = time.perf_counter()
            cell(x).asnumpy()
            if i >= 2:
                ts.append(time.perf_counter() - t0)
        return statistics.median(ts) / calls * 1e3

    chunks = []
    for rows, width in chunk_shapes:
        x = ms.Tensor(np.full((rows, width), 0.1, np.float32))
        plain, sync = Chunks(calls, kw, width, False), Chunks(calls, kw, width, True)
        together, with_sync = timed(plain, x, repeats), timed(sync, x, repeats)
        # rank 0 alone: the others sleep through its timing (a rank waiting inside a collective may spin on a core),
        # its 2 warm calls and ``repeats`` timed ones, each at most the together time
        est = barrier(ms.Tensor(np.array([together if rank == 0 else 0.0], np.float32))).asnumpy()[0]
        barrier(one).asnumpy()
        if rank == 0:
            alone = _median_of(lambda: plain(x).asnumpy(), repeats) / calls * 1e3
        else:
            time.sleep((repeats + 2) * calls * est / 1e3 * 1.5 + 0.2)
            alone = 0.0
        barrier(one).asnumpy()
        chunks.append({"rows": rows, "width": width, "calls": calls, "alone_ms": round(alone, 4),
                       "together_ms": round(together, 4), "with_ms": round(with_sync, 4),
                       "payload_bytes": 4 * SYNC_ELEMENTS})
    return {"ranks": size, "chunks": chunks}


def collectives_child(spec_path: str, out_path: str) -> None:
    """One msrun worker: each kind on each group size, chained in one graph at each byte size; rank 0 writes."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device({"cpu": "CPU", "ascend": "Ascend"}[spec["device"]])
    if spec["device"] == "cpu":
        threads_num(int(spec["threads"]))
    init()
    rank, world = get_rank(), get_group_size()
    sizes = sorted({int(s) for s in spec.get("sizes") or [world] if 2 <= int(s) <= world and world % int(s) == 0})
    out: dict[str, Any] = {}
    counts = tuple(int(e) for e in spec.get("elements") or ()) or COLLECTIVE_ELEMENTS
    repeats = int(spec.get("repeats") or REPEATS)
    for size in sizes:
        for name, v in time_group(spec["device"] == "ascend", size, rank, world, counts, repeats).items():
            out[f"{name}@{size}"] = v
    shapes = tuple((int(r), int(w)) for r, w in spec.get("chunks") or ()) or CHUNKS
    calls = int(spec.get("sync_calls") or SYNC_CALLS)
    contention = {str(size): time_contention(size, rank, world, repeats, shapes, calls) for size in sizes}
    if rank == 0:
        doc = {"device": spec["device"], "workers": world, "threads": int(spec.get("threads") or 0), "sizes": sizes,
               "measured": out, "contention": contention}
        Path(out_path).write_text(json.dumps(doc, indent=1), encoding="utf-8")


def _median_of(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv: list[str]) -> int:
    collectives_child(argv[0], argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
