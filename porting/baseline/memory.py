"""Peak memory by training phase, measured the same way wherever it runs.

CUDA: ``torch.cuda`` allocator peaks (reset before each phase), as the H200 baselines were made.
CPU: the process's resident-set high-water mark (``VmHWM``), reset before each phase by writing
``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). That is HOST memory of the whole process
(framework runtime included), labelled as such; where the reset is not possible the meter says so
and reports the process-lifetime peak instead of pretending to have phase peaks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

GIB = float(2**30)
# The phases of a training step whose peaks are measured, recorded and estimated, in this order.
PHASES = ("forward", "backward", "optimizer")


class PhaseMeter(Protocol):
    kind: str          # what is measured, recorded in the baseline file
    per_phase: bool    # False when peaks cannot be reset between phases

    def reset(self) -> None: ...

    def peak_gib(self) -> float: ...

    def current_gib(self) -> float: ...


@dataclass
class CudaMeter:
    kind: str = "cuda_max_memory_allocated"
    per_phase: bool = True

    def reset(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float:
        import torch

        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / GIB

    def current_gib(self) -> float:
        import torch

        return torch.cuda.memory_allocated() / GIB


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    m = re.search(rf"^{field}:\s+(\d+)\s+kB", _STATUS.read_text(), re.M)
    if m is None:
        raise OSError(f"{_STATUS}: no {field} line")
    return int(m.group(1))


def _can_reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        _status_kib("VmHWM")
        return True
    except OSError:
        return False


@dataclass
class HostRssMeter:
    kind: str = "host_rss_hwm"
    per_phase: bool = True

    def __post_init__(self) -> None:
        if not _STATUS.is_file():
            raise OSError("host memory needs /proc/self/status (Linux)")
        if not _can_reset_hwm():
            self.kind, self.per_phase = "host_rss_process_peak", False

    def reset(self) -> None:
        if self.per_phase:
            _CLEAR_REFS.write_text("5")

    def peak_gib(self) -> float:
        return _status_kib("VmHWM") * 1024 / GIB

    def current_gib(self) -> float:
        return _status_kib("VmRSS") * 1024 / GIB


METERS: dict[str, Callable[[], PhaseMeter]] = {"cuda": CudaMeter, "cpu": HostRssMeter}


def meter_for(device: str) -> PhaseMeter:
    return METERS[device]()
