"""Fixture program for `port diagnose` tests: a real MindSpore data-parallel job under msrun.

Every step does a real AllReduce of a gradient-sized tensor and logs ``step N``. One chosen rank
stalls (sleeps) or raises at a chosen step, so the other ranks fail in the collective and msrun's
scheduler reports timeouts. Usage (under msrun):

    msrun --worker_num=2 --local_worker_num=2 --master_port=P --log_dir=D --join=True \
        tests/diagnostics/dp_fault_job.py --steps 6 --fault-rank 1 --fault-step 3 --fault stall
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--fault-rank", type=int, default=-1)
    ap.add_argument("--fault-step", type=int, default=-1)
    ap.add_argument("--fault", choices=("none", "stall", "raise"), default="none")
    ap.add_argument("--stall-s", type=float, default=600.0)
    args = ap.parse_args(argv)

    import numpy as np
    import mindspore as ms
    from mindspore import ops
    from mindspore.communication import get_rank, get_group_size, init

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    init()
    rank, size = get_rank(), get_group_size()
    allreduce = ops.AllReduce()
    grad = ms.Tensor(np.full((1024,), float(rank + 1), dtype=np.float32))
    print(f"rank {rank}/{size} initialised", flush=True)
    for step in range(1, args.steps + 1):
        if rank == args.fault_rank and step == args.fault_step:
            if args.fault == "stall":
                print(f"rank {rank} stalling at step {step}", flush=True)
                time.sleep(args.stall_s)
            elif args.fault == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        total = allreduce(grad)
        value = float(total.asnumpy()[0])
        expected = size * (size + 1) / 2
        if abs(value - expected) > 1e-4:
            raise RuntimeError(f"AllReduce gave {value}, expected {expected}")
        print(f"step {step} loss {1.0 / step:.4f} allreduce_sum {value:.1f}", flush=True)
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
