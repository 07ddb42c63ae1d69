"""The preflight's collective smoke test at the run's real shape, run by msrun on every worker of every
node (porting/cluster/smoke_shape.py launches it): the world group, this rank's tensor-parallel and
data-parallel groups made as ``porting/train/run/step/grid.py`` makes them (Megatron order: TP ranks are
neighbours on one node), and on each group the collectives the training step runs, checked against
their expected values and timed.

On Ascend: AllReduce, ReduceScatter and AllGather on every group (HCCL). On the CPU (MindSpore's CPU
collectives): AllReduce on every group and AllGather on the world group run natively; native
ReduceScatter (no CPU kernel: a stub) and AllGather on a sub-group (the CPU's AllGather takes the world
group only) are not run; their emulations, the ones the CPU training uses (porting/train/run/step/zero.py:
AllReduce + slice, AllReduce of a zero-padded buffer), run instead.

Every collective is announced before it starts and confirmed after it ends, so a worker that stops in
one names the group and the collective (smoke_shape.py reads these lines):

    smoke rank R node N group G ranks A,B op OP start
    smoke rank R node N group G op OP ok 0.412 ms 1048576 bytes

The fourth argument sets each collective's float32 count per rank; several, comma-separated, run every
collective of a group at each size in turn within one launch (`port rehearse`'s links rung times the
bandwidth size and the 1 KiB latency size together).
"""

from __future__ import annotations

import statistics
import sys
import time

ELEMENTS = 1 << 18     # 1 MiB of float32 per collective: enough to time a link, small enough for a CPU
REPEATS = 3


def groups(rank: int, world: int, tp: int) -> list[tuple[str, list[int]]]:
    """(name, ranks) of every group this rank belongs to, in the order every rank creates them."""
    from porting.train.run.step.grid import dp_ranks, tp_ranks

    out = [("world", list(range(world)))]
    if tp > 1:
        out.append((f"tp_{tp_ranks(rank, tp)[0]}", tp_ranks(rank, tp)))
        if world // tp > 1:
            out.append((f"dp_{rank % tp}", dp_ranks(rank, world, tp)))
    return out


def _timed(fn, check) -> float:
    """Median milliseconds of REPEATS calls after one warm-up; ``check`` validates the last result."""
    out = fn()
    out.asnumpy()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = fn()
        out.asnumpy()
        times.append((time.perf_counter() - t0) * 1e3)
    check(out.asnumpy())
    return statistics.median(times)


def collectives(ms, ops, np, name: str, members: list[int], rank: int, native: bool,
                elements: int = ELEMENTS) -> dict:
    """op name -> (callable, check) for one group: real HCCL ops, or the CPU's working ones."""
    n, me = len(members), members.index(rank)
    x = ms.Tensor(np.full((elements,), float(rank + 1), np.float32))
    total = float(sum(r + 1 for r in members))
    kw = {} if name == "world" else {"group": name}
    allreduce = ops.AllReduce(ops.ReduceOp.SUM, **kw)
    chunk = elements // n

    def close(want):
        def check(got):
            if not np.allclose(got, want):
                raise RuntimeError(f"group {name}: got {got.ravel()[:4]} ..., expected {np.ravel(want)[:4]} ...")
        return check

    gathered = np.concatenate([np.full((elements,), float(r + 1), np.float32) for r in members])
    out = {"AllReduce": (lambda: allreduce(x), close(np.full((elements,), total)))}
    if native:
        out["ReduceScatter"] = (lambda: ops.ReduceScatter(ops.ReduceOp.SUM, **kw)(x), close(np.full((chunk,), total)))
    else:   # zero.py's CPU emulation: AllReduce, then this rank's slice
        out["ReduceScatter (AllReduce + slice)"] = (lambda: allreduce(x)[me * chunk:(me + 1) * chunk],
                                                   close(np.full((chunk,), total)))
    if native or name == "world":
        out["AllGather"] = (lambda: ops.AllGather(**kw)(x), close(gathered))
    else:   # zero.py's CPU emulation: this rank's piece at its offset in zeros, summed over the group
        padded = np.zeros((n * elements,), np.float32)
        padded[me * elements:(me + 1) * elements] = rank + 1
        y = ms.Tensor(padded)
        out["AllGather (AllReduce of zero-padded)"] = (lambda: allreduce(y), close(gathered))
    return out


def main() -> int:
    import numpy as np
    import mindspore as ms
    from mindspore import ops
    from mindspore.communication import create_group, get_group_size, get_rank, init

    target, tp, node = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sizes = [int(e) for e in sys.argv[4].split(",")] if len(sys.argv) > 4 else [ELEMENTS]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device(target)
    init()
    rank, world = get_rank(), get_group_size()
    say = lambda text: print(f"smoke rank {rank} node {node} {text}", flush=True)  # noqa: E731
    for name, members in groups(rank, world, tp):
        ranks = ",".join(map(str, members))
        if name != "world":
            say(f"group {name} ranks {ranks} op create start")
            t0 = time.perf_counter()
            create_group(name, members)
            say(f"group {name} op create ok {(time.perf_counter() - t0) * 1e3:.3f} ms 0 bytes")
        for elements in sizes:
            for op, (fn, check) in collectives(ms, ops, np, name, members, rank, target != "CPU", elements).items():
                say(f"group {name} ranks {ranks} op {op} start")
                try:
                    ms_taken = _timed(fn, check)
                except Exception as e:   # the worker's own failure, named; the launcher reads it
                    say(f"group {name} op {op} FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
                    return 1
                say(f"group {name} op {op} ok {ms_taken:.3f} ms {elements * 4} bytes")
    print(f"rank {rank}/{world} step 1 loss 0.0 smoke collectives ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
