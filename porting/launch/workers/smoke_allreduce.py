"""The preflight's smoke test, run by msrun on every worker: one real AllReduce of a small tensor,
checked against the expected sum. Output lines are what `port diagnose` reads when it fails."""

from __future__ import annotations

import sys


def main() -> int:
    import numpy as np
    import mindspore as ms
    from mindspore import ops
    from mindspore.communication import get_group_size, get_rank, init

    target = sys.argv[1] if len(sys.argv) > 1 else "CPU"
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target=target)
    init()
    rank, size = get_rank(), get_group_size()
    total = ops.AllReduce()(ms.Tensor(np.full((256,), float(rank + 1), dtype=np.float32)))
    value, expected = float(total.asnumpy()[0]), size * (size + 1) / 2
    if abs(value - expected) > 1e-4:
        raise RuntimeError(f"smoke all-reduce on rank {rank} gave {value}, expected {expected}")
    print(f"rank {rank}/{size} step 1 loss 0.0 smoke all-reduce ok ({value:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
