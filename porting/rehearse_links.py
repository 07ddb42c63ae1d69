"""The ``links`` rung of `port rehearse`: the node rung's TP and DP groups made as the training step makes
them (porting/launch/workers/smoke_collectives.py, under msrun), each collective run at a size that measures
bandwidth rather than latency, turned into bus bandwidth and set beside the per-die figures the plan's
roofline uses (porting/train/plan/roofline.py ``links``), so a measured figure can replace a documented one
(``cluster.intra_node_gb_s``, ``cluster.inter_node_gb_s``). Each collective is also timed at 1 KiB
(``latency_ms``, its fixed cost), which the calibrated plan adds per call (porting/train/plan/calibrated.py).

Bus bandwidth is nccl-tests' measure (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): the algorithm
bandwidth S / t times the share of the data each rank's link carries, so it compares with the link's
own speed whatever the group size:

- AllReduce: S is one rank's buffer, bus = S / t x 2 (n - 1) / n;
- ReduceScatter: S is one rank's input (all n chunks), bus = S / t x (n - 1) / n;
- AllGather: S is the gathered output (n chunks), bus = S / t x (n - 1) / n.

The CPU's emulations (AllReduce + slice, AllReduce of a zero-padded buffer) are all-reduces of the
buffer they send and are measured as such. On a CPU the figures are MindSpore's shared-memory
collectives between processes, not HCCS or RoCE: they show that every group carries data, not what a
910C link does. On a 910C node they are the HCCS figures of the dies the rung used.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # hints only
    from porting.train.recipe.schema import Recipe

ELEMENTS_CPU = 1 << 20     # 4 MiB of float32 per rank: past the CPU collectives' fixed cost, quick on 2 cores
ELEMENTS_NPU = 1 << 26     # 256 MiB: the flat part of nccl-tests-style sweeps on a fast link
ELEMENTS_LATENCY = 256     # 1 KiB: the collective's fixed cost (latency), for the calibrated plan's per-op term


def bus_gb_s(op: str, ranks: int, bytes_per_rank: int, ms: float) -> float | None:
    """nccl-tests bus bandwidth (GB/s) of one timed collective (None for a group of one or no time)."""
    if ranks < 2 or ms <= 0:
        return None
    share = (ranks - 1) / ranks
    if op == "AllReduce" or op.startswith("ReduceScatter (AllReduce"):
        moved, factor = bytes_per_rank, 2 * share
    elif op.startswith("AllGather (AllReduce"):
        moved, factor = bytes_per_rank * ranks, 2 * share    # the zero-padded buffer is all-reduced
    elif op == "ReduceScatter":
        moved, factor = bytes_per_rank, share
    elif op == "AllGather":
        moved, factor = bytes_per_rank * ranks, share
    else:
        return None
    return moved / (ms / 1e3) * factor / 1e9


def measure(rec: Recipe, timeout_s: float) -> tuple[str, str, dict[str, Any]]:
    """(status, detail, links) of the links rung for the node rung's recipe ``rec`` (one node)."""
    from porting.cluster.smoke_shape import smoke_at_shape
    from porting.train.plan.roofline import links as plan_links

    elements = ELEMENTS_NPU if rec.cluster.device == "ascend" else ELEMENTS_CPU
    # one launch times both sizes: each collective at the bandwidth size, then at 1 KiB
    row = smoke_at_shape(rec, 0, timeout_s=timeout_s, elements=(elements, ELEMENTS_LATENCY))
    tp, world = rec.parallel.tensor_parallel, rec.world_size
    sizes = {"world": world, "tp": tp, "dp": world // tp}
    measured: dict[str, Any] = {}
    for key, ms in sorted((row.get("collectives") or {}).items()):
        group, op = key.split(" ", 1)
        if op == "create":
            continue
        bw = bus_gb_s(op, sizes.get(group, 0), elements * 4, ms)
        measured[key] = {"ranks": sizes.get(group), "ms": round(ms, 3), "bytes_per_rank": elements * 4,
                         "bus_gb_s": None if bw is None else round(bw, 3)}
    small = row["collectives_at"].get(ELEMENTS_LATENCY * 4, {}) if row["status"] == "ok" else {}
    for key, ms in small.items():   # each collective's cost at 1 KiB: its latency
        if key in measured:
            measured[key]["latency_ms"] = round(ms, 3)
    assumed = plan_links(rec)
    figures = {"tp_gb_s": assumed.tp_bytes_per_s / 1e9, "dp_gb_s": assumed.dp_bytes_per_s / 1e9,
               "intra_node": assumed.intra_node}
    doc = {"measured": measured, "plan": figures, "elements": elements}
    if row["status"] != "ok":
        return "fail", row["detail"], doc
    listing = "; ".join(f"{k} {v['bus_gb_s']:.2f} GB/s" for k, v in measured.items() if v["bus_gb_s"] is not None)
    slowest = min((v["bus_gb_s"] for v in measured.values() if v["bus_gb_s"]), default=None)
    if rec.cluster.device == "ascend" and slowest is not None:
        doc["suggest"] = f"--set cluster.intra_node_gb_s={slowest:.1f}"
        use = f"; the plan assumes {figures['tp_gb_s']:.0f} GB/s per die ({figures['intra_node']}): {doc['suggest']}"
    else:
        use = (f"; the plan's figures ({figures['tp_gb_s']:.0f} GB/s per die, {figures['intra_node']}) stay: "
               "these are the CPU's shared-memory collectives, not a 910C link")
    return "pass", f"bus bandwidth, {elements * 4 >> 20} MiB per rank: {listing}{use}", doc


def recipe_of(path: Path) -> Recipe:
    """The node rung's recipe as `port train` loads it."""
    from porting.train import load_recipe

    return load_recipe(str(path), [], check_files=False)


def command_of(rec: Recipe, timeout_s: float, elements: int) -> list[str]:
    """The msrun command the rung ran (its log folder a placeholder)."""
    from porting.cluster.smoke_shape import launch_command

    try:
        return launch_command(rec, 0, Path("LOGDIR"), timeout_s, (elements, ELEMENTS_LATENCY))
    except FileNotFoundError:
        return []
