"""A roofline estimate of one optimizer step on Ascend 910C, and working settings ranked by it.

The figures (public third-party numbers, not a Huawei datasheet): about 780 TFLOPS BF16
and 3.2 TB/s HBM per package of 2 dies, about 400 GB/s chip-to-chip. Per die (one rank) that is
390 TFLOPS, 1.6 TB/s, and 200 GB/s of link when both dies of a chip communicate at once; the same
link figure is assumed between servers (unverified).

    compute_s = FLOPs of the rank / 390 TFLOPS     (6 P per token for the matmuls, + 6 L h s per token
                                                   for causal attention, x 4/3 with recompute; / TP)
    memory_s  = optimizer bytes read and written / 1.6 TB/s (weights, gradients, masters, m, v)
    comm_s    = wire bytes of the collectives (porting.train.plan.sharding) / 200 GB/s
    step_s    = compute_s + memory_s + comm_s     (port's step does not overlap communication)

It is an estimate at the hardware's peak: real steps run at a fraction of it (a seed quotes about
30% MFU on 910C), so use it to rank settings, not to promise a step time.
"""

from __future__ import annotations

from typing import Any

from model_zoo.config import LlamaConfig
from porting.train.plan import sharding
from porting.train.plan.layout import Layout
from porting.train.plan.memory import estimate_memory, usable_hbm_gib
from porting.train.recipe.schema import Recipe

TFLOPS_PER_DIE = 390e12
HBM_BYTES_PER_S = 1.6e12
LINK_BYTES_PER_S = 200e9
TOP = 5


def step_time(recipe: Recipe, cfg: LlamaConfig, layout: Layout | None = None) -> dict[str, float]:
    """Estimated seconds of one optimizer step on one rank, by part (see the module docstring)."""
    layout = layout or sharding.layout_for(recipe, cfg)
    tp, dp = recipe.parallel.tensor_parallel, recipe.data_parallel_size
    seq = recipe.data.max_seq_length
    tokens = recipe.batching.micro_batch_size * seq * recipe.batching.grad_accum_steps
    per_token = 6 * cfg.num_parameters() + 6 * cfg.num_hidden_layers * cfg.hidden_size * seq
    flops = per_token * tokens * (4 / 3 if recipe.memory.recompute else 1.0) / tp
    p_local = layout.parameters
    states = (4 + 4 + 4) / (dp if recipe.parallel.optimizer_sharding else 1)   # master, m, v read + written
    opt_bytes = p_local * (2 * states + 2 + 4)
    wire = sharding.bytes_summary(sharding.collectives(recipe, cfg, layout=layout))["wire_bytes"]
    out = {"compute_s": flops / TFLOPS_PER_DIE, "memory_s": opt_bytes / HBM_BYTES_PER_S,
           "comm_s": wire / LINK_BYTES_PER_S}
    out["step_s"] = sum(out.values())
    out["tokens_per_s"] = recipe.global_batch_size * seq / out["step_s"]
    return {k: round(v, 4) for k, v in out.items()}


def _tp_options(recipe: Recipe, cfg: LlamaConfig) -> list[int]:
    """Tensor-parallel sizes that divide the node's devices and the model's heads."""
    n = recipe.cluster.devices_per_node
    return [t for t in range(1, n + 1) if n % t == 0 and cfg.num_attention_heads % t == 0
            and cfg.num_key_value_heads % t == 0 and cfg.vocab_size % t == 0]


def proposals(recipe: Recipe, cfg: LlamaConfig) -> list[dict[str, Any]]:
    """Settings (TP, DP, sharding, recompute) that fit the usable HBM at the recipe's global batch
    (micro-batch 1, accumulation to make up the rest), fastest first by :func:`step_time`."""
    usable, world, gbs = usable_hbm_gib(recipe), recipe.world_size, recipe.global_batch_size
    out = []
    for tp in _tp_options(recipe, cfg):
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
                total = estimate_memory(cfg, alt, layout=layout)["total"]
                if total > usable:
                    continue
                t = step_time(alt, cfg, layout)
                out.append({"tensor_parallel": tp, "data_parallel": dp, "optimizer_sharding": shard, "recompute": rc,
                            "micro_batch_size": 1, "grad_accum_steps": gbs // dp, "memory_gib": total,
                            "margin_gib": round(usable - total, 2), "estimated_step_s": t["step_s"],
                            "estimate": t, "set": [f"{k}={_yaml(v)}" for k, v in sets.items()
                                                   if v is not None]})
    out.sort(key=lambda p: (p["estimated_step_s"], -p["margin_gib"]))
    return out[:TOP]


def _yaml(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def proposal_line(p: dict[str, Any]) -> str:
    e = p["estimate"]
    return (f"TP {p['tensor_parallel']} x DP {p['data_parallel']}, sharding {p['optimizer_sharding']}, recompute "
            f"{p['recompute']}, micro 1 x accum {p['grad_accum_steps']}: {p['memory_gib']:.1f} GiB (margin "
            f"{p['margin_gib']:.1f}); estimated step {e['step_s']:.2f} s (compute {e['compute_s']:.2f} + optimizer "
            f"{e['memory_s']:.2f} + comm {e['comm_s']:.2f}, roofline at peak) -> --set " + " --set ".join(p["set"]))
