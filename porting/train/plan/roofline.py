"""A roofline estimate of one optimizer step on Ascend 910C (Atlas A3) or 910B (Atlas A2), and working settings
ranked by it.

Compute and memory (public, third-party figures for the 910C package of 2 dies: about 780 TFLOPS BF16,
3.2 TB/s HBM): per die (one rank) 390 TFLOPS and 1.6 TB/s. 910B (Atlas 800T A2, one device a rank): 328
TFLOPS BF16 and an 8-device all-gather at 149 GB/s, third-party measurements (torch_npu matmul and
all_gather benchmarks on a 910B server, github.com/gameofdimension/limulidae README, CANN 8.0.0.beta1); HBM
1.6 TB/s taken as the 910C die's (no 910B figure with a source is held; the optimizer term is small).

Links, per die, applied to each parallel group separately (:func:`links`):
- inside a server: HCCS (Atlas 800T A3: two dies joined by SIO form a HiAM module, eight modules joined by
  HCCS; MindCluster scheduling guide, dl_affinity_0040,
  https://www.hiascend.com/document/detail/en/mindcluster/730/clustersched/schedulingug/dl_affinity_0040.html).
  About 400 GB/s chip-to-chip, 200 GB/s per die when both dies of a chip communicate at once.
- between servers: RoCE on the parameter-plane ports, one 400GE port per 910C chip (8 x 400 G per
  8-chip node, https://www.besthub.dev/articles/inside-huawei-atlas-900a3-superpod-cm384-supernode-wiring-scheme-a92f17277732):
  50 GB/s per chip, 25 GB/s per die; Atlas 800T A2: one 200GE port per 910B device, 25 GB/s (assumed
  from the same one-port-per-NPU design, not checked against a data sheet). Inside a SuperPoD
  (``cluster.superpod: true``) servers are joined by HCCS, and the intra-server figure applies.
  ``cluster.intra_node_gb_s`` / ``cluster.inter_node_gb_s`` replace either figure with a measured one.
- tensor-parallel groups stay inside a node (TP divides devices_per_node); a data-parallel group spans
  every node, and its ring runs at its slowest link: the inter-node one when nodes > 1.

    compute_s = FLOPs of the rank / 390 TFLOPS     (6 P per token for the matmuls, + 6 L h s per token
                                                   for causal attention, x 4/3 with recompute; / TP; LoRA:
                                                   4 per frozen weight, no weight gradient)
    memory_s  = optimizer bytes read and written / 1.6 TB/s (weights, gradients, masters, m, v)
    comm_s    = TP wire bytes / intra-node link + DP wire bytes / (inter-node link when nodes > 1)
    step_s    = compute_s + memory_s + comm_s     (no overlap assumed: none is measured on the device;
                                                   comm.EXPOSED_SOURCE)

It is an estimate at the hardware's peak: real steps run at a fraction of it, so use it to rank settings,
not to promise a step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from model_zoo.config import LlamaConfig
from porting.train.plan import comm_price, sharding
from porting.train.plan.estimates import RooflineStep, StepEstimate
from porting.train.plan.layout import Layout
from porting.train.plan.memory import MARGIN_GIB, estimate_memory, usable_hbm_gib
from porting.train.recipe.schema import Recipe

TFLOPS_PER_DIE = 390e12
HBM_BYTES_PER_S = 1.6e12
HCCS_BYTES_PER_S = 200e9      # per die, inside a server or a SuperPoD (module docstring)
# per server: (BF16 FLOP/s per device, HBM bytes/s, intra-server link bytes/s per device); module docstring
DEVICE = {"atlas-800t-a2": (328e12, HBM_BYTES_PER_S, 149e9), None: (TFLOPS_PER_DIE, HBM_BYTES_PER_S, HCCS_BYTES_PER_S)}


# where each server's peak BF16 FLOP/s comes from (the MFU's denominator, :func:`peak_flops`)
PEAK_SOURCE = {
    "atlas-800t-a2": "910B (Atlas 800T A2), 328 TFLOP/s BF16: torch_npu matmul benchmark on a 910B server, "
                     "github.com/gameofdimension/limulidae README (third-party measurement)",
    None: "910C die, 390 TFLOP/s BF16: half of the package's ~780 TFLOPS (public third-party figures, "
          "../shared/ASCEND_FACTS.md '910C hardware'; roofline.py module docstring)",
}


def device_figures(recipe: Recipe) -> tuple[float, float, float]:
    """(FLOP/s, HBM bytes/s, intra-server link bytes/s) of one device of the recipe's server (910C unless A2)."""
    return DEVICE.get(recipe.cluster.server, DEVICE[None])
ROCE_BYTES_PER_S = {"atlas-800t-a3": 25e9, "atlas-800t-a2": 25e9, None: 25e9}   # per die, between servers
TOP = 5


@dataclass(frozen=True)
class Links:
    """The link figure (bytes/s per die) each parallel group runs at, and where it comes from (plan.json ``links``)."""

    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    inter_node: str                  # where the inter-node figure comes from
    intra_node: str                  # where the intra-node figure comes from
    tp_bytes_per_s: float
    dp_bytes_per_s: float
    dp_spans_nodes: bool
    chip: str
    source: str

    def bytes_per_s(self, group: str) -> float:
        """The figure of a collective's group (``tp`` or ``dp``, as :class:`sharding.Collective` names it)."""
        return self.tp_bytes_per_s if group == "tp" else self.dp_bytes_per_s


@dataclass(frozen=True)
class Proposal:
    """One working setting at the recipe's global batch, with its memory and estimated step (plan.json
    ``proposals``)."""

    tensor_parallel: int
    data_parallel: int
    optimizer_sharding: bool
    recompute: bool
    micro_batch_size: int
    grad_accum_steps: int
    memory_gib: float
    margin_gib: float
    with_margin: bool                # leaves MARGIN_GIB of the usable HBM
    this_recipe: bool
    estimated_step_s: float
    estimate: StepEstimate
    set: tuple[str, ...]             # the --set overrides that give it


StepFn = Callable[[Recipe, LlamaConfig, Layout], StepEstimate]


def links(recipe: Recipe) -> Links:
    """The link figure (bytes/s per die) each parallel group runs at, and where it comes from."""
    c = recipe.cluster
    intra = c.intra_node_gb_s * 1e9 if c.intra_node_gb_s else device_figures(recipe)[2]
    if c.inter_node_gb_s:
        inter, how = c.inter_node_gb_s * 1e9, "cluster.inter_node_gb_s"
    elif c.superpod:
        inter, how = intra, "HCCS inside a SuperPoD (cluster.superpod)"
    else:
        inter, how = ROCE_BYTES_PER_S.get(c.server, ROCE_BYTES_PER_S[None]), "RoCE, one port per chip"
    dp_link = inter if c.nodes > 1 else intra
    return Links(intra_node_bytes_per_s=intra, inter_node_bytes_per_s=inter, inter_node=how,
                 intra_node="cluster.intra_node_gb_s" if c.intra_node_gb_s else "HCCS", tp_bytes_per_s=intra,
                 dp_bytes_per_s=dp_link, dp_spans_nodes=c.nodes > 1,
                 chip="910B" if c.server == "atlas-800t-a2" else "910C",
                 source="porting/train/plan/roofline.py module docstring")




def step_time(recipe: Recipe, cfg: LlamaConfig, layout: Layout | None = None) -> RooflineStep:
    """Estimated seconds of one optimizer step on one rank, by part (see the module docstring)."""
    layout = layout or sharding.layout_for(recipe, cfg)
    tp, dp = recipe.parallel.tensor_parallel, recipe.data_parallel_size
    seq = recipe.data.max_seq_length
    tokens = recipe.batching.micro_batch_size * seq * recipe.batching.grad_accum_steps
    per_token = 6 * cfg.num_parameters() + 6 * cfg.num_hidden_layers * cfg.hidden_size * seq
    if layout.frozen:   # LoRA: a frozen weight's matmul runs forward and backward (its input's gradient), no dW
        per_token -= 2 * layout.frozen * tp
    flops = per_token * tokens * (4 / 3 if recipe.memory.recompute else 1.0) / tp
    p_local = layout.parameters
    states = (4 + 4 + 4) / (dp if recipe.parallel.optimizer_sharding else 1)   # master, m, v read + written
    opt_bytes = p_local * (2 * states + 2 + 4)
    cols = sharding.collectives(recipe, cfg, layout=layout)
    wire = sharding.bytes_summary(cols)
    link = links(recipe)
    tp_s, dp_s = wire.tp_wire_bytes / link.tp_bytes_per_s, wire.dp_wire_bytes / link.dp_bytes_per_s
    peak, hbm, _ = device_figures(recipe)
    out = {"compute_s": flops / peak, "memory_s": opt_bytes / hbm, "comm_s": tp_s + dp_s}
    out["step_s"] = sum(out.values())
    out["comm_tp_s"], out["comm_dp_s"] = tp_s, dp_s
    out["tokens_per_s"] = recipe.global_batch_size * seq / out["step_s"]
    figures = tuple(comm_price.peak_figure(c, link.bytes_per_s(c.group), link.inter_node if c.group == "dp" and
                                           link.dp_spans_nodes else link.intra_node) for c in cols)
    return RooflineStep(**{k: round(v, 4) for k, v in out.items()}, comm_figures=figures)


def tp_options(recipe: Recipe, cfg: LlamaConfig) -> list[int]:
    """Tensor-parallel sizes that divide the node's devices and the model's heads."""
    n = recipe.cluster.devices_per_node
    return [t for t in range(1, n + 1) if n % t == 0 and cfg.num_attention_heads % t == 0
            and cfg.num_key_value_heads % t == 0 and cfg.vocab_size % t == 0]


def proposals(recipe: Recipe, cfg: LlamaConfig, step_fn: StepFn | None = None) -> tuple[Proposal, ...]:
    """Settings (TP, DP, sharding, recompute) that fit the usable HBM at the recipe's global batch
    (micro-batch 1, accumulation to make up the rest), fastest first by :func:`step_time`, or by
    ``step_fn(recipe, cfg, layout)`` (the calibrated estimate, porting/train/plan/calibrated.py)."""
    usable, world, gbs = usable_hbm_gib(recipe), recipe.world_size, recipe.global_batch_size
    out = []
    for tp in tp_options(recipe, cfg):
        dp = world // tp
        if gbs % dp:
            continue
        for shard in (True, False) if dp > 1 else (False,):
            for rc in (False, True):
                sets = {"parallel.tensor_parallel": tp, "parallel.data_parallel": None,
                        "parallel.optimizer_sharding": shard, "memory.recompute": rc,
                        "batching.micro_batch_size": 1, "batching.grad_accum_steps": gbs // dp}
                alt = recipe.with_overrides(sets)
                layout = sharding.layout_for(alt, cfg)   # once per candidate, for its memory and its step time
                total = estimate_memory(cfg, alt, layout=layout).total
                if total > usable:
                    continue
                t = (step_fn or step_time)(alt, cfg, layout)
                mine = (tp == recipe.parallel.tensor_parallel and shard == recipe.parallel.optimizer_sharding
                        and rc == recipe.memory.recompute and recipe.batching.micro_batch_size == 1)
                out.append(Proposal(
                    tensor_parallel=tp, data_parallel=dp, optimizer_sharding=shard, recompute=rc, micro_batch_size=1,
                    grad_accum_steps=gbs // dp, memory_gib=total, margin_gib=round(usable - total, 2),
                    with_margin=usable - total >= MARGIN_GIB, this_recipe=mine, estimated_step_s=t.step_s, estimate=t,
                    set=tuple(f"{k}={_yaml(v)}" for k, v in sets.items() if v is not None)))
    out.sort(key=lambda p: (p.estimated_step_s, -p.margin_gib))
    return tuple(out[:TOP])


def _yaml(v: int | bool | None) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def proposal_line(p: Proposal) -> str:
    e = p.estimate
    mark = "(this recipe) " if p.this_recipe else ""
    comm = (f"[TP {e.comm_tp_s:.2f}, DP {e.comm_dp_s:.2f}], roofline at peak" if isinstance(e, RooflineStep)
            else "calibrated from measured pieces")
    return (f"{mark}TP {p.tensor_parallel} x DP {p.data_parallel}, sharding {p.optimizer_sharding}, recompute "
            f"{p.recompute}, micro 1 x accum {p.grad_accum_steps}: {p.memory_gib:.1f} GiB (margin "
            f"{p.margin_gib:.1f}); estimated step {e.step_s:.2f} s (compute {e.compute_s:.2f} + optimizer "
            f"{e.memory_s:.2f} + comm {e.comm_s:.2f} {comm}) -> --set " + " --set ".join(p.set))


def peak_flops(recipe: Recipe) -> tuple[float | None, str]:
    """The peak FLOP/s of the device the recipe names, the MFU of a plan is taken against (the roofline's own figure
    for that server, :data:`DEVICE`), and its source; None on a CPU."""
    if recipe.cluster.device != "ascend":
        return None, "a CPU has no peak figure here"
    return device_figures(recipe)[0], PEAK_SOURCE.get(recipe.cluster.server, PEAK_SOURCE[None])
