"""Communication wait of a data-parallel `port train` run, measured on sampled steps.

What is measured: on a sampled step every rank, once its step is done (the compiled step returned
its loss, so the step's own gradient all-reduce is over) and rank 0 has run the step's evaluation,
enters an all-reduce of one number and times how long it is blocked there. A rank that arrives
early waits for the last one; the last one waits only the all-reduce's own latency. So a rank's
``comm_wait_s`` is "how long this rank waited for the slowest rank at the end of the step", and the
rank whose wait is smallest while the others' are large is the one they wait for.

Why a timed barrier and not the profiler: it costs two one-number all-reduces on a sampled step (one
timed, one to bring every rank's value to rank 0), runs the same on the CPU and on Ascend, and needs
no profile files to be parsed afterwards. What it does not see: an imbalance absorbed inside the
compiled step (a slower device waits in the gradient all-reduce of the same graph); that needs
MindSpore's profiler on Ascend.

The values of all ranks reach every rank through the second all-reduce of a vector that holds each
rank's wait at its own index (AllReduce only, which MindSpore's CPU backend has). Rank 0 writes them
into ``metrics.jsonl`` (``comm_wait_s``: its own; ``comm_wait_ranks_s``: every rank's); each rank logs
its own in ``logs/rank_<r>.log``. A single process runs no collective and records nothing.

Test hook: ``PORT_TEST_COMM_DELAY=RANK:SECONDS`` (porting/train/run/faults.py) makes that rank sleep before the
timed all-reduce on every sampled step, so the tests can show a slow rank.
"""

from __future__ import annotations

import time

import numpy as np

from porting.train.run import faults


def sampled(step: int, every: int, total: int) -> bool:
    """Steps measured: the first, every ``every``-th and the last (so a short run has numbers)."""
    return step == 1 or step == total or (every > 0 and step % every == 0)


class CommWait:
    """The timed barrier of one rank; ``measure(step)`` on every step, the same steps on every rank."""

    def __init__(self, every: int, rank: int, world_size: int, total_steps: int):
        self.every, self.rank, self.world, self.total = every, rank, world_size, total_steps
        self.enabled = world_size > 1 and every > 0
        self.delay = faults.active().delay_for(rank) if self.enabled else 0.0
        if self.enabled:
            import mindspore as ms  # deferred: only an injected test delay needs the barrier cell

            from porting.train.run.step.cells import Barrier  # deferred: step.py imports MindSpore; only an injected delay needs it

            self.ms = ms
            self.cell = Barrier()     # an all-reduce (sum) of its input
            self.zeros = ms.Tensor(np.zeros((world_size,), np.float32))
            # The first call compiles the all-reduce's graph (about 0.5 s on the CPU): done here, on every
            # rank at the same point of the run, so that no sampled step counts compile time as waiting.
            self.cell(self.zeros).asnumpy()

    def measure(self, step: int) -> tuple[float, ...] | None:
        """Every rank's wait in seconds (index = rank) on a sampled step; None otherwise."""
        if not self.enabled or not sampled(step, self.every, self.total):
            return None
        if self.delay:
            time.sleep(self.delay)
        t0 = time.perf_counter()
        self.cell(self.zeros).asnumpy()          # asnumpy: returns once the all-reduce is done
        wait = time.perf_counter() - t0
        mine = np.zeros((self.world,), np.float32)
        mine[self.rank] = wait
        every_rank = self.cell(self.ms.Tensor(mine)).asnumpy()
        return tuple(round(float(w), 5) for w in every_rank)
