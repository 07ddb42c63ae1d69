"""What one collective of a step costs, and where that figure comes from: one :class:`CommFigure` per collective
of the plan (porting/train/plan/sharding.py ``collectives``), for the roofline (porting/train/plan/roofline.py: every
figure the peak link's) and for the calibrated estimate (porting/train/plan/calibrated.py), in this order:

1. **measured at group size N on <device>**: the compute rung's graph-mode calls of that kind on groups of the
   collective's own size (porting/launch/workers/collectives.py), interpolated at the call's own payload
   (:func:`per_call_s`). On the CPU, ReduceScatter and a sub-group's AllGather are what port runs there (an
   AllReduce and a slice; an AllReduce of a zero-padded buffer: porting/train/run/step/zero.py), and the plan
   lists them as those AllReduces, so their figure is the AllReduce's at that size, named as the emulation.
2. **half the AllReduce measured at group size N** for a native ReduceScatter (HCCL's) where no ReduceScatter
   was timed: a ring ReduceScatter sends (n-1)/n of its payload, an AllReduce 2(n-1)/n of the same payload (an
   AllReduce is a ReduceScatter then an AllGather; nccl-tests doc/PERFORMANCE.md, the bus-bandwidth factors of
   the two, github.com/NVIDIA/nccl-tests), so the native one costs about half an AllReduce of the same payload.
3. **extrapolated from group size M to N** where the node did not hold a group of N (a one-node rehearsal of a
   multi-node recipe): a ring of N ranks takes N-1 steps, each one call's fixed cost, and moves f(N) of the
   payload per rank (f = 2(N-1)/N for AllReduce, (N-1)/N for ReduceScatter and AllGather: nccl-tests, as above),
   so the time measured at M is split into its fixed part (the 1 KiB call) scaled by (N-1)/(M-1) and the rest
   scaled by f(N)/f(M). M is the measured size nearest N from below (else the smallest above).
4. **measured at group size N on <device> (PyNative, links rung)**: the links rung's bus bandwidth and latency
   (porting/rehearse_links.py), where the compute rung timed nothing of that size.
5. **peak link figure**: wire bytes / the roofline's link figure of the group (Ascend), else nothing (a CPU has no
   peak figure: "not measured", 0 s).

**Synchronisation waits** (:func:`contention`, :func:`wait_s`): a collective timed alone is not what it costs inside a
step whose workers compute between the calls; the compute rung's synchronisation chain (porting/launch/workers/
collectives.py ``time_contention``) times matmul chunks on every rank with and without a 1 KiB AllReduce after each,
so ``with - together - the 1 KiB call alone`` is the wait one synchronising call adds at that chunk length, and
``together / alone`` at the longest chunk (the median over group sizes, at least 1) what computing beside the
node's other workers costs a worker. The calibrated plan adds the
wait to every tensor-parallel call (its chunk: the step's compute over those calls) and to each data-parallel
synchronisation (the gradient reduction, and ZeRO's gather after the update), interpolated between the two chunk
lengths measured and held at the nearer end beyond them.

A data-parallel group of a multi-node recipe spans the nodes, while one node measures it inside itself: on
Ascend its figure is then at least the inter-node peak link figure (the slower of the two), and the label says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from porting.train.plan.estimates import CommFigure
from porting.train.plan.layout import EMULATED, GATHER_EMULATED
from porting.train.plan.sharding import Collective

RS_HALF = ("a ring ReduceScatter sends (n-1)/n of the payload, an AllReduce 2(n-1)/n: nccl-tests "
           "doc/PERFORMANCE.md")
RING = "ring: the 1 KiB call's time x (N-1)/(M-1), the rest x f(N)/f(M), nccl-tests doc/PERFORMANCE.md"


def bus_factor(op: str, n: int) -> float:
    """The share of the payload one rank of a ring sends (nccl-tests' bus-bandwidth factor)."""
    return 2 * (n - 1) / n if op == "AllReduce" else (n - 1) / n


def per_call_s(points: list[list[float]], nbytes: float) -> float:
    """Seconds of one call of ``nbytes`` from measured (bytes, ms) points: linear between the two around it,
    the nearest segment's slope beyond them, never below the smallest call."""
    pts = sorted((float(b), float(t)) for b, t in points)
    if len(pts) == 1:
        return pts[0][1] / 1e3
    i = next((k for k in range(1, len(pts)) if nbytes <= pts[k][0]), len(pts) - 1)
    (b0, t0), (b1, t1) = pts[i - 1], pts[i]
    return max(t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0), pts[0][1]) / 1e3


def extrapolated_s(points: list[list[float]], op: str, m: int, n: int, nbytes: float) -> float:
    """One call of ``nbytes`` on a ring of ``n`` from points measured on ``m`` (module docstring, item 3)."""
    fixed = min(float(t) for _, t in points) / 1e3
    rest = max(per_call_s(points, nbytes) - fixed, 0.0)
    return fixed * (n - 1) / (m - 1) + rest * bus_factor(op, n) / bus_factor(op, m)


def table(doc: dict[str, Any]) -> tuple[dict[tuple[str, int], dict[str, Any]], str]:
    """(op, group size) -> the compute rung's measurement, and the device it ran on, from calibration.json's
    ``collectives`` (``{"device", "workers", "measured": {"OP@N": {...}}}``; an older file's ``{"OP": {"ranks"}}``
    reads as its world group)."""
    col = doc.get("collectives") or {}
    device = str(col.get("device") or doc.get("device") or "this machine")
    out: dict[tuple[str, int], dict[str, Any]] = {}
    measured = col.get("measured") if isinstance(col.get("measured"), dict) else \
        {f"{k}@{v.get('ranks')}": v for k, v in col.items() if isinstance(v, dict) and "ranks" in v}
    for key, v in measured.items():
        op, _, n = key.partition("@")
        if isinstance(v, dict) and v.get("points_bytes_ms") and n.isdigit():
            out[(op, int(n))] = v
    return out, device


def _nearest(sizes: list[int], n: int) -> int:
    below = [m for m in sizes if m < n]
    return max(below) if below else min(sizes)


def stands_for(c: Collective) -> str:
    """The kind a collective of the plan is: an AllReduce the CPU runs for a ReduceScatter or a sub-group's
    AllGather (sharding.py names the emulation in its purpose) is that kind."""
    if c.op == "AllReduce" and f"({EMULATED})" in c.purpose:
        return "ReduceScatter"
    if c.op == "AllReduce" and f"({GATHER_EMULATED})" in c.purpose:
        return "AllGather"
    return c.op


def measured(c: Collective, tab: dict[tuple[str, int], dict[str, Any]], device: str, native_rs: bool
             ) -> tuple[float, str, str, int] | None:
    """(seconds of the step's calls, basis, figure, measured size) from the compute rung's points, or None."""
    per_call = c.payload_bytes / max(c.count, 1)
    kind = stands_for(c)
    e = tab.get((kind, c.ranks)) if kind != c.op and tab.get((kind, c.ranks), {}).get("emulated") else None
    e = e or tab.get((c.op, c.ranks))
    if e is not None:
        how = f" ({kind} as port runs it there: {e['runs']}, emulated)" if e.get("emulated") else ""
        return (c.count * per_call_s(e["points_bytes_ms"], per_call), "measured",
                f"measured at group size {c.ranks} on {device}{how}", c.ranks)
    ar = tab.get(("AllReduce", c.ranks))
    if c.op == "ReduceScatter" and native_rs and ar is not None:
        return (c.count * 0.5 * per_call_s(ar["points_bytes_ms"], per_call), "half of measured AllReduce",
                f"half the AllReduce measured at group size {c.ranks} on {device} ({RS_HALF})", c.ranks)
    op = c.op if any(k[0] == c.op for k in tab) else ("AllReduce" if c.op == "ReduceScatter" and native_rs else "")
    sizes = sorted(k[1] for k in tab if k[0] == op and k[1] >= 2)
    if not sizes or c.ranks < 2:
        return None
    m = _nearest(sizes, c.ranks)
    half = 0.5 if op != c.op else 1.0
    t = c.count * half * extrapolated_s(tab[(op, m)]["points_bytes_ms"], op, m, c.ranks, per_call)
    what = f"{op} " if op != c.op else ""
    return (t, "extrapolated", f"extrapolated from the {what}measured at group size {m} to {c.ranks} on {device} "
            f"({RING}{'; then halved: ' + RS_HALF if half < 1 else ''})", m)


def links_rung(c: Collective, links: dict[str, Any], device: str) -> tuple[float, str, str, int] | None:
    """The links rung's PyNative figure of a group of this size: latency per call plus wire bytes at its bus
    bandwidth beyond the latency."""
    keys = [f"{c.group} {c.op}", f"world {c.op}"] + sorted(k for k in links if k.endswith(" " + c.op))
    for k in keys:
        m = links.get(k)
        if isinstance(m, dict) and m.get("ranks") == c.ranks and m.get("bus_gb_s"):
            lat, ms = (m.get("latency_ms") or 0.0), m.get("ms") or 0.0
            bus = m["bus_gb_s"] * (ms / (ms - lat) if ms > lat > 0 else 1.0) * 1e9
            return (c.count * lat / 1e3 + c.wire_bytes / bus, "links rung",
                    f"measured at group size {c.ranks} on {device} (PyNative calls, links rung: {k})", c.ranks)
    return None


def peak_figure(c: Collective, bytes_per_s: float, link: str) -> CommFigure:
    """The collective at the roofline's link figure of its group."""
    return CommFigure(c.op, c.group, c.ranks, c.count, round(c.wire_bytes / bytes_per_s, 9), "peak",
                      f"peak link figure ({link}, {bytes_per_s / 1e9:g} GB/s per die)")


def price(c: Collective, cal_doc: dict[str, Any], links: dict[str, Any], *, native_rs: bool, nodes: int,
          peak: tuple[float, str] | None) -> CommFigure:
    """The step's ``c`` priced from a calibration (module docstring's order); ``peak``: (bytes/s, link name) of its
    group on Ascend, None on a CPU."""
    tab, device = table(cal_doc)
    got = measured(c, tab, device, native_rs) or links_rung(c, links, device)
    if got is None:
        if peak is not None:
            return peak_figure(c, *peak)
        return CommFigure(c.op, c.group, c.ranks, c.count, 0.0, "not measured",
                          f"not measured (no group of {c.ranks} timed on {device}, no peak figure for it)")
    t, basis, figure, m = got
    if c.group == "dp" and nodes > 1:
        figure += f"; measured inside one node, the group spans {nodes} nodes"
        if peak is not None and c.wire_bytes / peak[0] > t:
            t = c.wire_bytes / peak[0]
            figure += f": taken at the inter-node peak link figure ({peak[1]}, {peak[0] / 1e9:g} GB/s per die), slower"
    return CommFigure(c.op, c.group, c.ranks, c.count, round(t, 9), basis, figure, m)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Contention:
    """The synchronisation chain's figures (module docstring): the node's compute factor and, by group size, the
    (chunk ms, wait ms) points of one synchronising call."""

    workers: int | None
    threads: int | None
    compute_factor: float                              # median over group sizes of together / alone, longest chunk
    waits: dict[int, list[tuple[float, float]]]        # group size -> [(chunk ms with every rank computing, wait ms)]


def contention(doc: dict[str, Any]) -> Contention | None:
    """The chain's figures of a calibration (checked by calibration_bounds.contention), or None when it has none."""
    col = doc.get("collectives") or {}
    chain = col.get("contention") or {}
    if not chain:
        return None
    tab, _ = table(doc)
    waits: dict[int, list[tuple[float, float]]] = {}
    for n, g in chain.items():
        ar = tab.get(("AllReduce", int(n)))
        pts = []
        for c in g["chunks"]:
            call_ms = per_call_s(ar["points_bytes_ms"], c["payload_bytes"]) * 1e3 if ar else 0.0
            pts.append((c["together_ms"], max(c["with_ms"] - c["together_ms"] - call_ms, 0.0)))
        waits[int(n)] = sorted(pts)
    # the longest chunk of each group size (the step's pieces are longer still; a short chunk's ratio is mostly
    # the scheduler's), never below 1: a worker beside others is not faster than alone
    factors = [max(g["chunks"], key=lambda c: c["together_ms"]) for g in chain.values()]
    return Contention(col.get("workers"), col.get("threads"),
                      max(1.0, statistics.median(c["together_ms"] / c["alone_ms"] for c in factors)), waits)


def wait_s(cont: Contention, ranks: int, chunk_s: float) -> float | None:
    """Seconds one synchronising call on a group of ``ranks`` adds after ``chunk_s`` of compute: linear between the
    measured chunk lengths, the nearer end's beyond them; None where no group of that size was timed."""
    pts = cont.waits.get(ranks)
    if not pts:
        return None
    c = chunk_s * 1e3
    if c <= pts[0][0] or len(pts) == 1:
        return pts[0][1] / 1e3
    if c >= pts[-1][0]:
        return pts[-1][1] / 1e3
    i = next(k for k in range(1, len(pts)) if c <= pts[k][0])
    (c0, w0), (c1, w1) = pts[i - 1], pts[i]
    return (w0 + (w1 - w0) * (c - c0) / (c1 - c0)) / 1e3
