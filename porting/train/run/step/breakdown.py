"""Sampling where a `port train` step's time goes, per rank (``logging.breakdown_every``; off by default).

On a sampled step every rank (each on its own; nothing is exchanged) records the host's marks around the
step and around each compiled-cell call, with a device synchronisation before and after each call, and runs
MindSpore's profiler for that step alone (``mindspore.Profiler``, started before and analysed after it, into
``RUN/breakdown/profile/rank_<r>/step_<n>/``). The kernels of the profile (``trace_view.json``: on the CPU
the "CPU OP" process, on Ascend the device's and the communication's processes) and the marks make one
:class:`porting.rundir.breakdown.Breakdown` line in ``RUN/breakdown/rank_<r>.jsonl``; the definitions of
compute, exposed communication, host and idle are in that module.

What it costs, stated because it is paid on the sampled steps only and bounded: at most
:data:`porting.rundir.breakdown.MAX_SAMPLES` steps per run (never step 1, never a step that compiles);
on each, the synchronisations (the step cannot overlap host work with the device) and the profiler's
analysis after the step (about 1 s on a 2-core CPU; on Ascend the msprof export, seconds to a minute,
and the profile folder, kept for MindStudio Insight). The sampled step's own time in ``metrics.jsonl`` is
the step as measured, with the synchronisations; the analysis is outside it and recorded as ``cost_s``.
``logging.breakdown_source: timestamps`` skips the profiler (the marks alone: compute and host, no split of
communication); where the profiler fails, the record falls back to the marks and says why (``note``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from porting.rundir import breakdown as bd

MAX_TRACE_BYTES = 256 << 20


def sampled(step: int, every: int, total: int, taken: int) -> bool:
    """Steps measured: every ``every``-th from the second on, and the last, up to MAX_SAMPLES."""
    if every <= 0 or step == 1 or taken >= bd.MAX_SAMPLES:
        return False
    return step % every == 0 or step == total


def _sync() -> None:
    import mindspore as ms  # deferred: the pure parts of this module are read without MindSpore

    ms.runtime.synchronize()


class StepSampler:
    """One rank's sampler; ``begin(step)`` before a step (True when it is sampled), ``call`` around each cell
    of that step, ``end(step, compiled)`` after it."""

    def __init__(self, logging_cfg: Any, run_dir: Path, rank: int, total_steps: int,
                 sync: Callable[[], None] = _sync):
        self.every, self.total = int(logging_cfg.breakdown_every), total_steps
        self.use_profiler = logging_cfg.breakdown_source == "profiler"
        self.run_dir, self.rank, self.sync = Path(run_dir), rank, sync
        self.taken = 0
        self.active = False
        self.cells: list[tuple[str, int, int]] = []
        self.window_start = 0
        self.profiler = None
        self.prof_dir: Path | None = None
        self.problem: str | None = None

    def around(self, step: int, run: Callable[[], Any], log: Any) -> Any:
        """``run()`` (one training step, its StepResult), sampled when it is due; the record logged."""
        self.begin(step)
        r = run()
        rec = self.end(step, bool(r.compile))
        if rec is not None:
            log.info(f"breakdown step {step}: {json.dumps(rec.to_dict())[:600]}")
        return r

    def begin(self, step: int) -> bool:
        self.active = sampled(step, self.every, self.total, self.taken)
        if not self.active:
            return False
        self.cells = []
        self.sync()
        if self.use_profiler:
            self._start_profiler(step)
        self.window_start = time.time_ns()
        return True

    def call(self, name: str, fn: Callable, *args):
        """``fn(*args)``; on a sampled step timed between two synchronisations."""
        if not self.active:
            return fn(*args)
        self.sync()
        t0 = time.time_ns()
        out = fn(*args)
        self.sync()
        self.cells.append((name, t0, time.time_ns()))
        return out

    def end(self, step: int, compiled: bool) -> bd.Breakdown | None:
        if not self.active:
            return None
        self.sync()
        window = (self.window_start, time.time_ns())
        self.active = False
        t0 = time.perf_counter()
        kernels = self._stop_profiler() if self.profiler is not None else None
        cost = round(time.perf_counter() - t0, 3)
        if compiled:   # a step that compiled says nothing of the steady state: not kept, not counted
            return None
        self.taken += 1
        if kernels is None:
            note = None if not self.use_profiler else f"profiler unavailable ({self.problem}); host marks only"
            rec = bd.from_marks(step, self.rank, window, self.cells, note)
        else:
            rec = bd.from_timeline(step, self.rank, "mindspore-profiler", window, self.cells, kernels, cost)
        bd.append(self.run_dir, rec)
        return rec

    # -- the profiler, one per sampled step (a restarted one keeps only its last window on the CPU)
    def _start_profiler(self, step: int) -> None:
        self.prof_dir = self.run_dir / bd.DIR / "profile" / f"rank_{self.rank}" / f"step_{step}"
        try:
            from mindspore import Profiler  # deferred: only a sampled step profiles

            if self.prof_dir.exists():   # a resumed run samples the step again: port made this folder
                shutil.rmtree(self.prof_dir)
            self.prof_dir.mkdir(parents=True)
            self.profiler = Profiler(output_path=str(self.prof_dir), start_profile=False)
            self.profiler.start()
        except Exception as e:  # noqa: BLE001  (any profiler failure leaves the step to the host marks)
            self.problem, self.profiler = f"{type(e).__name__}: {str(e)[:160]}", None

    def _stop_profiler(self) -> list[bd.Kernel] | None:
        prof, self.profiler = self.profiler, None
        try:
            prof.stop()
            prof.analyse()
            return kernels_of(self.prof_dir)
        except Exception as e:  # noqa: BLE001  (the run goes on; the record says why it has marks only)
            self.problem = f"{type(e).__name__}: {str(e)[:160]}"
            return None


DEVICE_PROCESSES = ("CPU OP", "Ascend Hardware", "Communication", "HCCL")


def kernels_of(prof_dir: Path) -> list[bd.Kernel]:
    """The kernels of a profile folder's ``trace_view.json`` (Chrome trace events, microseconds): those of
    the processes that run kernels (:data:`DEVICE_PROCESSES`)."""
    found = [p for p in prof_dir.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json") if not p.is_symlink()]
    if not found:
        raise FileNotFoundError(f"{prof_dir}: the profiler wrote no trace_view.json")
    p = found[0]
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise ValueError(f"{p}: {p.stat().st_size >> 20} MiB, more than the {MAX_TRACE_BYTES >> 20} MiB read")
    events = json.loads(p.read_text(encoding="utf-8"))
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    names = {e.get("pid"): str((e.get("args") or {}).get("name", "")) for e in events
             if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name"}
    keep = {pid for pid, n in names.items() if any(n.startswith(d) for d in DEVICE_PROCESSES)}
    out = []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("pid") in keep:
            try:
                start, dur = float(e["ts"]), float(e["dur"])
            except (KeyError, TypeError, ValueError):
                continue
            out.append(bd.Kernel(str(e.get("name", ""))[:400], int(start * 1000), int(dur * 1000)))
    return out
