"""Entry point of one `msrun` worker of the compute rung's collective timing (porting/rehearse_compute.py):
``msrun ... collectives.py SPEC OUT``. Each collective is chained in one compiled cell (the per-call cost,
not a launch: 8 calls up to 512 KiB, 2 of 4 MiB and 16 MiB), timed at 1 KiB to 16 MiB per rank; rank 0 writes
(bytes, ms a call) points. A script in porting/launch/workers/ with the other msrun entry points (msrun runs a
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
from mindspore.communication import get_group_size, get_rank, init
from mindspore.device_context.cpu.op_tuning import threads_num

REPEATS = 9
COLLECTIVE_ELEMENTS = (256, 1 << 14, 1 << 17, 1 << 20, 1 << 22)   # 1 KiB .. 16 MiB of float32 per rank


def collectives_child(spec_path: str, out_path: str) -> None:
    """One msrun worker: each collective chained in one graph at each size; rank 0 writes the points."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device({"cpu": "CPU", "ascend": "Ascend"}[spec["device"]])
    if spec["device"] == "cpu":
        threads_num(int(spec["threads"]))
    init()
    rank, n = get_rank(), get_group_size()

    class Chain(nn.Cell):
        def __init__(self, op, calls: int):
            super().__init__()
            self.op, self.calls = op, calls

        def construct(self, x):
            for _ in range(self.calls):
                x = self.op(x)[: x.shape[0]] * 0.5
            return x

    out: dict[str, Any] = {}
    for name, op in (("AllReduce", ops.AllReduce()), ("AllGather", ops.AllGather())):
        points = []
        for elements in COLLECTIVE_ELEMENTS:   # the buffer one rank passes in (its payload, for AllGather its piece)
            calls = 8 if elements <= 1 << 17 else 2   # enough calls to see past the launch, few of the large ones
            cell, x = Chain(op, calls), ms.Tensor(np.ones((elements,), np.float32))
            per_call = _median_of(lambda: cell(x).asnumpy(), REPEATS) / calls
            points.append([elements * 4 * (n if name == "AllGather" else 1), round(per_call * 1e3, 4)])
        out[name] = {"ranks": n, "points_bytes_ms": points, "latency_ms": points[0][1], "graph_mode": True}
    if rank == 0:
        Path(out_path).write_text(json.dumps(out, indent=1), encoding="utf-8")


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
