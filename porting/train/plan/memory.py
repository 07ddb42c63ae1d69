"""Per-device memory of a training step by phase, against the device's usable HBM.

Memory model (bytes per device; P = parameters on one tensor-parallel rank, T = micro_batch x seq
tokens, L = layers, tp = tensor parallel, dp = data parallel = world / tp):
- tensor parallel (Megatron's split, comm.parameter_numels): q/k/v, o, gate/up/down, embedding and LM
  head divided by tp, norms replicated. No sequence parallel is assumed (the tensor-parallel cells
  decide; see docs/parallel.md).
- weights: P x param bytes. LoRA (porting/train/plan/lora.py): P is what trains (the adapters, modules_to_save,
  biases) and every term below that scales with P follows; the frozen base adds to the weights (and their
  compute-dtype copies) only: no gradient, no master, no AdamW state, no all-reduce. Activations are the full
  run's (the frozen layers' inputs are kept for the adapters' gradients) plus each adapted layer's
  ``x A^T``, tokens x r.
- gradients: P x param bytes; accumulation_buffers when grad_accum_steps > 1: P x 4 (float32), or
  P x param bytes with ``precision.grad_reduce_dtype: param_dtype``; divided by dp with ZeRO-2.
- optimizer_states: AdamW m and v in float32, 2 x P x 4, divided by dp when optimizer sharding is on
  (each rank keeps the states of its flat shard).
- activations (kept for backward, no recompute): per layer T x (4 h + (8 h + 4 i) / tp) x compute
  bytes (norm inputs/outputs replicated; q/k/v before and after RoPE, attention output, SwiGLU
  gate/up/product split over tp; Qwen3 adds its per-head q/k norm outputs, (q_size + kv_size) / tp);
  the reference attention (CPU) also keeps B x heads / tp x S^2 scores
  and probabilities in float32, the fused flash attention (Ascend) does not; plus fp32 vocab-parallel
  logits, log-softmax and their gradient, 3 x T x vocab / tp x 4; plus compute-dtype copies of the
  weights when they differ from the storage dtype.
- activations_recompute: layer inputs only (L x T x h x compute bytes) plus one layer's full
  activations (recomputed in backward), logits as above.
- comm_buffers: two fused all-reduce buffers (comm_fusion size, 64 MB for auto) when dp > 1 and the
  optimizer is not sharded.
- workspace: runtime and collective workspace, 2 GiB on Ascend, 0.25 GiB on CPU (assumed).
Mixed precision, as Megatron / MindSpeed-LLM keep it (porting/train/run/step/cells.py):
- master_weights: float32 copies of bf16/fp16 parameters, P x 4, sharded like the AdamW states.
- gradients_fp32: gradients are all-reduced, clipped and applied in float32 by default: a float32
  copy P x 4 of bf16/fp16 gradients (the accumulation buffers already are float32 when
  grad_accum_steps > 1), as Megatron-LM forces for bf16; none with the opt-in ``grad_reduce_dtype:
  param_dtype`` (Megatron's --grad-reduce-in-bf16), where AdamW casts each gradient to float32 as it applies it.
- adamw_temporaries: the element-wise update's float32 m', v', p' and gradient of one parameter (of
  one bucket's shard when sharded) at a time (graph memory reuse frees them after each assign), 4 x 4.
  Counted on the fused path too (float32 parameters without ZeRO, ``ops.AdamWeightDecay``): measured on
  the CPU, its update phase grows with the width as the 4 x 4 term says (benchmarks/plan_memory_cpu.py,
  planned / measured 0.67 without the term), so "in place" is not taken as "no working memory".
- the step's copies and buffers, each with its formula and source in
  :mod:`porting.train.plan.memory_terms`: ``swiglu_concat`` (the fused SwiGLU's [w1; w3]),
  ``hccl_buffers`` (2 x HCCL_BUFFSIZE per communicator), ``apply_copy`` (ApplyStep's identity copy of
  the accumulation buffers), ``clip_gradients`` (the unscaled gradients held for the global norm),
  ``zero_bucket_concat`` / ``zero_allgather`` (the sharded optimizer's flat
  buckets).
- backward_working_set: one layer's activation gradients while it runs backward, as large as one
  layer's kept activations.
Phases: the forward/backward peak holds the resident terms (weights, accumulation buffers, states,
masters, HCCL and fusion buffers, workspace), the activations, the gradients, the working set and the
SwiGLU copies; the update's peak holds the resident terms, the fp32 gradients, the apply copy, the ZeRO
buffers and the AdamW temporaries (and the gradients, when the update shares the graph with one
micro-batch). The plan's ``total`` is the larger peak.
Budget: Ascend plans fit ``usable_hbm_gib``, the HBM less what the runtime keeps: MindFormers' 910
recipes cap a 64 GB device at ``max_device_memory: 58GB``, so 6 GiB are kept back; training calls
``mindspore.runtime.set_memory(max_size=...)`` with that number (:func:`apply_memory_budget`).
Checked against real H200 measurements (../shared baselines, tests/train/test_plan.py): HF Llama-7B,
bf16 params and states, seq 4096, micro 1 peaks at 62.1 GiB without checkpointing.
"""

from __future__ import annotations

from dataclasses import dataclass

from model_zoo.config import LlamaConfig
from porting.train.plan import memory_terms as terms
from porting.train.plan.comm import layout_shapes
from porting.train.plan.layout import DTYPE_BYTES, Layout
from porting.train.recipe.schema import Recipe

GIB = float(1 << 30)
MARGIN_GIB = 4.0     # ZeRO stage 1 (fewer bytes) only when it leaves this much of the usable HBM
WORKSPACE_GIB = {"ascend": 2.0, "cpu": 0.25}
AUTO_FUSION_MB = 64
RUNTIME_RESERVED_GIB = {"ascend": 6.0, "cpu": 0.0}   # 64 GB die -> 58 GB max_device_memory (MindFormers)


@dataclass(frozen=True)
class MemoryByPhase:
    """Per-device GiB of each term (:data:`memory_terms.TERMS` names them), the peak of each phase
    and the ``total`` the run needs (plan.json ``memory_gib_by_phase``)."""

    weights: float
    gradients: float
    accumulation_buffers: float
    optimizer_states: float
    master_weights: float
    gradients_fp32: float
    adamw_temporaries: float
    activations: float
    activations_recompute: float
    backward_working_set: float
    swiglu_concat: float
    apply_copy: float
    clip_gradients: float
    comm_buffers: float
    zero_bucket_concat: float
    zero_allgather: float
    hccl_buffers: float
    workspace: float
    peak_forward_backward: float
    peak_apply: float
    total: float

    def term(self, name: str) -> float:
        """One term by its name in :data:`memory_terms.TERMS`."""
        return getattr(self, name)


def usable_hbm_gib(recipe: Recipe) -> float:
    """The HBM a plan may use: the device's, less what the runtime keeps back."""
    return max(recipe.cluster.device_hbm_gib - RUNTIME_RESERVED_GIB[recipe.cluster.device], 0.0)


def layer_activation_bytes(cfg: LlamaConfig, micro: int, seq: int, compute_bytes: int, fused_attention: bool,
                           tp: int = 1) -> float:
    """One decoder layer's kept activations on one tensor-parallel rank (no sequence parallel: the norm
    inputs and outputs, 4 h a token, are replicated; q/k/v, RoPE outputs, attention output and the
    SwiGLU intermediates, 8 h + 4 i, are split over the heads and columns)."""
    tokens = micro * seq
    per_token = 4 * cfg.hidden_size + (8 * cfg.hidden_size + 4 * cfg.intermediate_size) / tp
    if cfg.qk_norm:   # Qwen3: the per-head q/k RMSNorm outputs (RoPE's inputs), split over the heads
        per_token += (cfg.q_size + cfg.kv_size) / tp
    out = tokens * per_token * compute_bytes
    if not fused_attention:
        out += micro * cfg.num_attention_heads * seq * seq * 8 / tp
    return out


def activation_bytes(cfg: LlamaConfig, micro: int, seq: int, compute_bytes: int, fused_attention: bool,
                     recompute: bool, tp: int = 1) -> float:
    tokens = micro * seq
    per_layer = layer_activation_bytes(cfg, micro, seq, compute_bytes, fused_attention, tp)
    logits = 3 * tokens * cfg.vocab_size * 4 / tp          # vocab-parallel logits
    if recompute:
        return cfg.num_hidden_layers * tokens * cfg.hidden_size * compute_bytes + per_layer + logits
    return cfg.num_hidden_layers * per_layer + logits


def fusion_buffer_bytes(recipe: Recipe) -> float:
    cf = recipe.parallel.comm_fusion
    if cf.enabled and cf.allreduce_mode == "size" and isinstance(cf.allreduce_config, (int, float)):
        return float(cf.allreduce_config) * (1 << 20)
    return AUTO_FUSION_MB * (1 << 20)


def choose_zero_stage(cfg: LlamaConfig, recipe: Recipe, layout: Layout) -> tuple[int, str]:
    """The ZeRO stage of a sharded run and why: stage 1 without accumulation or when ``zero_stage: auto``
    fits the usable HBM with :data:`MARGIN_GIB` to spare at stage 1, else stage 2 (or the recipe's stage)."""
    accum, want = recipe.batching.grad_accum_steps, recipe.parallel.zero_stage
    if accum == 1:
        return 1, "one micro-batch per step: one reduce-scatter per step"
    if want != "auto":
        return int(want), f"parallel.zero_stage: {want}"
    one = estimate_memory(cfg, recipe, zero_stage=1, layout=layout).total
    usable = usable_hbm_gib(recipe)
    if one <= usable - MARGIN_GIB:
        return 1, (f"accumulate then one reduce-scatter: {one:.1f} GiB fits {usable:g} GiB with {MARGIN_GIB:g} GiB "
                   f"to spare, and moves 1/{accum} of ZeRO-2's bytes")
    return 2, (f"ZeRO-2: full accumulators would need {one:.1f} GiB of {usable:g} GiB; sharded ones cost {accum} "
               "reduce-scatters per step")


def estimate_memory(cfg: LlamaConfig, recipe: Recipe, zero_stage: int | None = None,
                    layout: Layout | None = None) -> MemoryByPhase:
    """Per-device memory in GiB by term (:data:`memory_terms.TERMS`), the peak of each phase of a step
    (``peak_forward_backward``, ``peak_apply``) and the ``total`` the run needs, the larger peak.
    ``zero_stage`` overrides the plan's choice; ``layout`` is the plan's (computed here when not given)."""
    layout = layout or layout_shapes(recipe, cfg)
    tp, dp = layout.tp, layout.dp
    p = float(sum(layout.numels))
    prec, accum = recipe.precision, recipe.batching.grad_accum_steps
    pb, cb = DTYPE_BYTES[prec.param_dtype], DTYPE_BYTES[prec.compute_dtype]
    micro, seq = recipe.batching.micro_batch_size, recipe.data.max_seq_length
    fused = recipe.cluster.device == "ascend"
    sharded = layout.sharded
    if sharded and zero_stage is None:
        zero_stage = layout.choice.stage if layout.choice.enabled else choose_zero_stage(cfg, recipe, layout)[0]
    grad_fp32 = prec.grad_reduce_dtype == "float32"
    ab = 4 if grad_fp32 else pb            # accumulation / reduction dtype
    accum_buf = (p * ab / (dp if sharded and zero_stage == 2 else 1)) if accum > 1 else 0.0
    base = p + layout.frozen   # every weight (a LoRA run trains only p of them: plan/lora.py)
    casts = base * cb if pb != cb else 0.0
    r, adapted = layout.lora   # LoRA: each adapted layer keeps h = x A^T (tokens x r) for lora_B's gradient
    lora_act = micro * seq * r * adapted * cb
    act = activation_bytes(cfg, micro, seq, cb, fused, False, tp) + casts + cfg.num_hidden_layers * lora_act
    act_rc = activation_bytes(cfg, micro, seq, cb, fused, True, tp) + casts + lora_act
    low = pb != 4
    largest = float(max(layout.numels)) if not sharded else max(b.padded for b in layout.buckets) / dp
    emulated = recipe.cluster.device == "cpu"
    concat, gather = terms.zero_bytes(layout, ab, pb, emulated, emulated and tp > 1)
    out = {
        "weights": base * pb, "gradients": p * pb, "accumulation_buffers": accum_buf,
        "optimizer_states": 2 * p * 4 / (dp if sharded else 1),
        "master_weights": p * 4 / (dp if sharded else 1) if low else 0.0,
        "gradients_fp32": p * 4 if low and grad_fp32 and accum == 1 else 0.0,
        "adamw_temporaries": 4 * largest * 4,
        "activations": act, "activations_recompute": act_rc,
        "backward_working_set": layer_activation_bytes(cfg, micro, seq, cb, True, tp),
        "swiglu_concat": terms.swiglu_concat_bytes(cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size,
                                                   tp, cb, fused, recipe.memory.recompute),
        "apply_copy": accum_buf,
        "clip_gradients": p * 4 / (dp if sharded else 1),
        "comm_buffers": 2 * fusion_buffer_bytes(recipe) if dp > 1 and not sharded else 0.0,
        "zero_bucket_concat": concat, "zero_allgather": gather,
        "hccl_buffers": terms.hccl_bytes(recipe.world_size, tp, fused),
        "workspace": WORKSPACE_GIB[recipe.cluster.device] * GIB,
    }
    used_act = act_rc if recipe.memory.recompute else act
    # ZeRO-2 reduce-scatters every micro-batch inside the accumulation graph, not in the update
    scatter_each = sharded and zero_stage == 2 and accum > 1
    out["peak_forward_backward"] = (sum(out[k] for k in terms.FORWARD_BACKWARD) + used_act
                                    + (concat if scatter_each else 0.0))
    # one micro-batch per step: the update runs in the same graph, on the backward's gradients
    out["peak_apply"] = (sum(out[k] for k in terms.APPLY) + (out["gradients"] if accum == 1 else 0.0)
                         - (concat if scatter_each else 0.0))
    out["total"] = max(out["peak_forward_backward"], out["peak_apply"])
    return MemoryByPhase(**{k: round(v / GIB, 3) for k, v in out.items()})
