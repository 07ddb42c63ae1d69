"""Where a step's time went, per rank: the record of one sampled step (``RUN/breakdown/rank_<r>.jsonl``), the
one definition of its four parts from a kernel timeline, and its reader.

The four parts follow MindSpeed-LLM's performance guide, which writes a step as
``step_time = computation_time + unhidden_communication_time + device_free_time``
(docs/en/pytorch/tuning/fsdp2_backend_performance_optimization.md, "Calculating Single-Step Iteration Time"),
with the device's free time split by where the host was:

* ``compute_s``: time some compute kernel runs (the union of their intervals: overlapping kernels count once);
* ``comm_s``: exposed communication, time a collective runs while no compute kernel does. A rank that reaches
  a collective first waits in it for the last one: that wait is inside ``comm_s``; the report splits it out
  across ranks (:func:`waits`), since the slowest rank's collectives are the shortest;
* ``host_s``: no kernel runs and the host is outside the compiled step (turning a batch into tensors, Python,
  reading the loss back): the step is host-bound for that long;
* ``idle_s``: no kernel runs although the host is inside a compiled cell (the executor's launch gaps).

``host_s + idle_s`` is MindSpeed's ``Free``. The parts add up to ``wall_s``, the step as the host timed it.
A record made from port's own timestamps alone (no profiler) has ``compute_s`` = the time inside the compiled
cells (their kernels and collectives together) and no ``comm_s``/``idle_s`` (null): it says less, not
something else.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from porting.rundir.records import RunDirError, _type_problem, finite

DIR = "breakdown"
MAX_SAMPLES = 8                   # sampled steps per run, per rank (each costs a profiler analysis)
MAX_COLLECTIVES = 4096            # collective durations kept per record (the wait split needs them in order)
MAX_LAYERS = 512
MAX_FILE_BYTES = 16 << 20
MAX_LINE_BYTES = 1 << 20          # one record: 4,096 collectives and 512 layers are about 100 KB
MAX_TOTAL_BYTES = 64 << 20        # every rank's file together, as `port report` reads them
MAX_FILES = 4096                  # ranks read
MAX_STEP_S = 86400.0              # a sampled step (and any one collective in it): at most a day
MAX_STEP = 10 ** 12
MAX_RANK = 1 << 20
SOURCES = ("mindspore-profiler", "timestamps", "torch-profiler")
PHASES = ("forward", "backward", "optimizer", "communication", "other")

# Collective kernels, by name: MindSpore's CPU ops (AllReduce-op0), HCCL's (hcom_allReduce_, HcclAllReduce),
# NCCL's (ncclDevKernel_AllReduce...), torch's c10d calls.
COLLECTIVE = re.compile(r"allreduce|allgather|reducescatter|reduce_scatter|all_reduce|all_gather|broadcast|"
                        r"alltoall|all_to_all|hcom_|hccl|nccl|send|receive|recv|barrier", re.IGNORECASE)


@dataclass(frozen=True)
class Kernel:
    """One kernel of a timeline: its name (the scope path where the profiler gives one), start and length (ns)."""

    name: str
    start_ns: int
    dur_ns: int

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns

    @property
    def collective(self) -> bool:
        return bool(COLLECTIVE.search(self.name.rsplit("/", 1)[-1]))


def union(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping cover of ``spans`` ((start, end) pairs)."""
    out: list[list[int]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(spans: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in spans)


def intersect(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intersection of two unions."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo)]


@dataclass(frozen=True)
class Breakdown:
    """One sampled step of one rank (module docstring). Seconds; ``phases`` compute seconds by phase,
    ``layers`` per decoder layer {"forward": s, "backward": s} where the timeline names layers."""

    step: int
    rank: int
    source: str
    wall_s: float
    compute_s: float
    host_s: float
    comm_s: float | None = None
    idle_s: float | None = None
    phases: dict = field(default_factory=dict)
    layers: dict = field(default_factory=dict)
    collectives_s: tuple[float, ...] = ()
    cost_s: float | None = None      # what sampling this step cost on top of it (profiler analysis)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["collectives_s"] = list(self.collectives_s)
        return {k: v for k, v in d.items() if v is not None}

    @property
    def free_s(self) -> float | None:
        """MindSpeed's Free: no kernel runs (host-bound and launch gaps)."""
        return None if self.idle_s is None else self.host_s + self.idle_s


def _phase(k: Kernel, cell: str | None, backward_end: int) -> str:
    """The phase of a kernel: by its cell (``update`` is the optimizer), by its scope (MindSpore names the
    backward's kernels ``Gradients/...`` and the optimizer's ``.../optimizer-...``), and in a one-graph step by
    its place: what runs after the last backward kernel (clipping, the update) is the optimizer's."""
    if k.collective:
        return "communication"
    if cell in ("forward", "backward", "optimizer"):   # a loop that marks its phases (the torch baseline)
        return cell
    if cell == "update" or "optimizer" in k.name.lower():
        return "optimizer"
    if k.name.startswith("Gradients/") or "backward" in k.name.lower():
        return "backward"
    if cell == "step" and k.start_ns >= backward_end:
        return "optimizer"
    return "forward" if cell in ("forward_backward", "step") else "other"


LAYER = re.compile(r"layers(?:-CellList)?[/.](\d+)")


def from_timeline(step: int, rank: int, source: str, window: tuple[int, int], cells: list[tuple[str, int, int]],
                  kernels: list[Kernel], cost_s: float | None = None) -> Breakdown:
    """The record of one step from its kernels and the host's marks: ``window`` (start, end) of the step and
    ``cells`` (name, start, end) of each compiled-cell call, all in ns on one clock."""
    lo, hi = window
    ks = [k for k in kernels if k.end_ns > lo and k.start_ns < hi]
    comp = clip(union((k.start_ns, k.end_ns) for k in ks if not k.collective), lo, hi)
    comm = clip(union((k.start_ns, k.end_ns) for k in ks if k.collective), lo, hi)
    busy = union(comp + comm)
    inside = clip(union((a, b) for _, a, b in cells), lo, hi)
    wall = hi - lo
    idle = length(inside) - length(intersect(busy, inside))
    exposed = length(comm) - length(intersect(comm, comp))
    host = wall - length(busy) - idle
    # per phase and per layer: the union of their kernels' intervals (nested operators count once)
    by_phase: dict[str, list[tuple[int, int]]] = {}
    by_layer: dict[tuple[str, str], list[tuple[int, int]]] = {}
    backward_end = max((k.end_ns for k in ks if k.name.startswith("Gradients/")), default=hi)
    for k in ks:
        cell = next((n for n, a, b in cells if a <= k.start_ns < b), None)
        ph = _phase(k, cell, backward_end)
        by_phase.setdefault(ph, []).append((k.start_ns, k.end_ns))
        m = LAYER.search(k.name)
        if m and ph in ("forward", "backward") and len(by_layer) < 2 * MAX_LAYERS:
            by_layer.setdefault((m.group(1), ph), []).append((k.start_ns, k.end_ns))
    phases = {ph: length(clip(union(sp), lo, hi)) / 1e9 for ph, sp in by_phase.items()}
    layers: dict[str, dict[str, float]] = {}
    for (i, ph), sp in by_layer.items():
        layers.setdefault(i, {})[ph] = length(clip(union(sp), lo, hi)) / 1e9
    colls = tuple(round(k.dur_ns / 1e9, 6) for k in sorted(ks, key=lambda k: k.start_ns) if k.collective)
    r6 = lambda x: round(x / 1e9, 6)  # noqa: E731
    return Breakdown(step, rank, source, r6(wall), r6(length(comp)), r6(host), r6(exposed), r6(idle),
                     {k: round(v, 6) for k, v in sorted(phases.items())},
                     {k: {p: round(s, 6) for p, s in v.items()} for k, v in sorted(layers.items(), key=lambda x: int(x[0]))},
                     colls[:MAX_COLLECTIVES], cost_s)


def from_marks(step: int, rank: int, window: tuple[int, int], cells: list[tuple[str, int, int]],
               note: str | None = None) -> Breakdown:
    """The record from the host's marks alone: compute = inside the cells (their collectives included)."""
    lo, hi = window
    inside = clip(union((a, b) for _, a, b in cells), lo, hi)
    phases: dict[str, float] = {}
    for name, a, b in cells:
        phases[name] = round(phases.get(name, 0.0) + (b - a) / 1e9, 6)
    return Breakdown(step, rank, "timestamps", round((hi - lo) / 1e9, 6), round(length(inside) / 1e9, 6),
                     round((hi - lo - length(inside)) / 1e9, 6), phases=phases, note=note)


# ------------------------------------------------------------------------------------------ across ranks
def waits(records: dict[int, Breakdown]) -> dict[int, float]:
    """Seconds each rank waited for the others inside the collectives of one step: the k-th collective runs
    on every rank (SPMD) and ends on all of them together, so the shortest is the transfer and the rest of
    each rank's is waiting. Ranks whose collective counts differ (different groups) are left out."""
    counts = {len(r.collectives_s) for r in records.values()}
    if len(records) < 2 or len(counts) != 1 or not counts.pop():
        return {}
    rows = list(zip(*(r.collectives_s for r in records.values())))
    fastest = [min(col) for col in rows]
    return {rank: round(sum(d - f for d, f in zip(rec.collectives_s, fastest)), 6) for rank, rec in records.items()}


# ------------------------------------------------------------------------------------------ file
_SPEC = {"step": (int,), "rank": (int,), "source": (str,), "wall_s": (int, float), "compute_s": (int, float),
         "host_s": (int, float), "comm_s": (int, float), "idle_s": (int, float), "phases": (dict,),
         "layers": (dict,), "collectives_s": (list,), "cost_s": (int, float), "note": (str,)}


def from_dict(doc: Any, where: str) -> Breakdown:
    if not isinstance(doc, dict):
        raise RunDirError(f"{where}: expected a JSON object, found {type(doc).__name__}")
    for k in ("step", "rank", "source", "wall_s", "compute_s", "host_s"):
        if k not in doc:
            raise RunDirError(f"{where}: missing key '{k}'")
    problem = _type_problem(doc, _SPEC, where)
    if problem:
        raise RunDirError(problem)
    if doc["source"] not in SOURCES:
        raise RunDirError(f"{where}: source {doc['source'][:40]!r}, expected one of {', '.join(SOURCES)}")
    nums = [doc[k] for k in ("wall_s", "compute_s", "host_s") if k in doc] + list(doc.get("collectives_s") or [])
    nums += [v for v in (doc.get("phases") or {}).values()]
    nums += [s for v in (doc.get("layers") or {}).values() if isinstance(v, dict) for s in v.values()]
    if not all(finite(x) for x in nums) or len(doc.get("collectives_s") or []) > MAX_COLLECTIVES:
        raise RunDirError(f"{where}: times must be finite numbers of seconds (at most {MAX_COLLECTIVES} collectives)")
    problem = _bounds_problem(doc)
    if problem:
        raise RunDirError(f"{where}: {problem}")
    keys = {f.name for f in dataclasses.fields(Breakdown)}
    vals = {k: doc[k] for k in keys if k in doc}
    vals["collectives_s"] = tuple(float(x) for x in doc.get("collectives_s") or ())
    return Breakdown(**vals)


def _bounds_problem(doc: dict[str, Any]) -> str | None:
    """What makes a record impossible, or None: the parts of a step are each 0 to its wall time and add up to it
    (compute + exposed communication + host + idle, module docstring; a timestamps record: compute + host), each
    phase, layer and the sampling cost 0 to its bound. docs/promises.md lists these bounds with their tests."""
    wall = doc["wall_s"]
    if not 0 < wall <= MAX_STEP_S:
        return f"wall_s {wall:g}: expected above 0 and at most {MAX_STEP_S:g} s"
    if not 0 <= doc["step"] <= MAX_STEP or not 0 <= doc["rank"] <= MAX_RANK:
        return f"step {doc['step']} / rank {doc['rank']}: expected 0 to {MAX_STEP:g} / 0 to {MAX_RANK:,}"
    tol = 1e-5 + 1e-3 * wall   # each part is rounded to 1e-6 s where it is written
    parts = {k: doc[k] for k in ("compute_s", "comm_s", "host_s", "idle_s") if doc.get(k) is not None}
    for k, v in list(parts.items()) + [(f"phases.{k}", v) for k, v in (doc.get("phases") or {}).items()] + [
            (f"layers.{i}.{k}", v) for i, d in (doc.get("layers") or {}).items() if isinstance(d, dict) for k, v in d.items()]:
        if not finite(v) or not 0 <= v <= wall + tol:
            return f"{str(k)[:40]} {v:g}: expected 0 to the step's wall time {wall:g} s"
    if abs(sum(parts.values()) - wall) > tol:
        return (f"the parts ({', '.join(parts)}) add up to {sum(parts.values()):g} s, the step's wall time is {wall:g} s; "
                "a record port writes has them add up")
    if not all(0 <= x <= MAX_STEP_S for x in doc.get("collectives_s") or []) or doc.get("cost_s") is not None and \
            not (finite(doc["cost_s"]) and 0 <= doc["cost_s"] <= MAX_STEP_S):
        return f"collectives_s and cost_s: expected 0 to {MAX_STEP_S:g} s each"
    if any(not isinstance(v, dict) for v in (doc.get("layers") or {}).values()):
        return "layers: expected {layer: {phase: seconds}}"
    return None


def path_for(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / DIR / f"rank_{rank}.jsonl"


def append(run_dir: Path, rec: Breakdown) -> Path:
    """One line per sampled step, in this rank's own file (no rank writes another's)."""
    p = path_for(run_dir, rec.rank)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec.to_dict()) + "\n")
    return p


def read(run_dir: str | Path, notes: list[str] | None = None) -> dict[int, list[Breakdown]]:
    """Every rank's sampled steps ({rank: [records]}); a bad line or file is skipped with a note. Bounded: at most
    :data:`MAX_FILES` files, :data:`MAX_FILE_BYTES` each, :data:`MAX_LINE_BYTES` a line, ``4 x MAX_SAMPLES`` lines a
    file and :data:`MAX_TOTAL_BYTES` read in all (the rest skipped with a note); never through a link, never a FIFO."""
    d = Path(run_dir) / DIR
    notes = notes if notes is not None else []
    out: dict[int, list[Breakdown]] = {}
    if d.is_symlink() or not d.is_dir():
        return out
    budget = [MAX_TOTAL_BYTES]
    for rank, p in _rank_files(d):
        if budget[0] <= 0:
            notes.append(f"{d}: more than {MAX_TOTAL_BYTES >> 20} MiB of breakdown records; the rest not read")
            break
        for i, line in _lines(p, budget, notes):
            try:
                rec = from_dict(json.loads(line), f"{p}: line {i}")
                if rec.rank != rank:
                    raise RunDirError(f"{p}: line {i}: rank {rec.rank} in the file of rank {rank}")
            except (ValueError, RecursionError, RunDirError) as e:
                notes.append(f"{p}: line {i} skipped ({str(e)[:200]})")
                continue
            out.setdefault(rank, []).append(rec)
    return out


def _rank_files(d: Path) -> list[tuple[int, Path]]:
    """(rank, path) of the first :data:`MAX_FILES` ``rank_<r>.jsonl`` names, by rank (a folder of a million names is
    not listed whole)."""
    found = []
    with os.scandir(d) as it:
        for n, e in enumerate(it):
            m = re.fullmatch(r"rank_(\d{1,6})\.jsonl", e.name)
            if m:
                found.append((int(m.group(1)), d / e.name))
            if n >= 16 * MAX_FILES:
                break
    return sorted(found)[:MAX_FILES]


def _lines(p: Path, budget: list[int], notes: list[str]) -> list[tuple[int, str]]:
    """The first ``4 x MAX_SAMPLES`` lines of a regular file, each at most :data:`MAX_LINE_BYTES`, charged to
    ``budget``; none (with a note) for a link, a FIFO or a file past :data:`MAX_FILE_BYTES`."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        notes.append(f"{p}: not read ({e.strerror})")
        return []
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            notes.append(f"{p}: not a regular file, not read")
            return []
        if st.st_size > MAX_FILE_BYTES:
            notes.append(f"{p}: larger than {MAX_FILE_BYTES >> 20} MiB, not read")
            return []
        out = []
        for i in range(1, 4 * MAX_SAMPLES + 1):
            raw = f.readline(min(MAX_LINE_BYTES + 1, max(budget[0], 0) + 1))
            if not raw:
                break
            budget[0] -= len(raw)
            if len(raw) > MAX_LINE_BYTES or budget[0] < 0:
                notes.append(f"{p}: line {i} longer than {MAX_LINE_BYTES >> 20} MiB or past the "
                             f"{MAX_TOTAL_BYTES >> 20} MiB read in all; the rest of the file not read")
                break
            out.append((i, raw.decode("utf-8", errors="replace")))
    return out
