"""Progress lines of the long reads of a per-rank checkpoint (a restore, a merge, an export): one per parameter
group, so a supervisor watching the log sees it move (porting/train/run/checkpoint/read.py, merge.py)."""

from __future__ import annotations

import re
import time
from typing import Callable

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def group_of(name: str) -> str:
    """The parameter group a progress line covers: a decoder layer, or the tensors outside the layers."""
    m = _LAYER.search(name)
    return f"layer {m.group(1)}" if m else "embedding" if "embedding" in name else "final norm and head"


class Progress:
    """One log line per parameter group (tensors, bytes, seconds): a long restore or merge is never silent."""

    def __init__(self, log: Callable[[str], None] | None, what: str, counter: Callable[[], int]):
        self.log, self.what, self.counter = log, what, counter
        self.group: str | None = None
        self.total_bytes, self.t_start = 0, time.perf_counter()

    def step(self, group: str) -> None:
        if group != self.group:
            self.done()
            self.group, self.n, self.b0, self.t0 = group, 0, self.counter(), time.perf_counter()
        self.n += 1

    def done(self) -> None:
        if self.group is None:
            return
        nbytes, sec = self.counter() - self.b0, time.perf_counter() - self.t0
        self.total_bytes += nbytes
        if self.log is not None:
            self.log(f"{self.what}: {self.group}: {self.n} tensor(s), {nbytes} bytes in {sec:.2f} s "
                     f"({nbytes / max(sec, 1e-9) / 1e6:.0f} MB/s)")
        self.group = None
