"""Per-device memory of a training step by phase, against the device's usable HBM.

Memory model (bytes per device; P = parameters on one tensor-parallel rank, T = micro_batch x seq
tokens, L = layers, tp = tensor parallel, dp = data parallel = world / tp):
- tensor parallel (Megatron's split, comm.parameter_numels): q/k/v, o, gate/up/down, embedding and LM
  head divided by tp, norms replicated. No sequence parallel is assumed (the tensor-parallel cells
  decide; see docs/parallel.md).
- weights: P x param bytes.
- gradients: P x param bytes, plus an accumulation buffer when grad_accum_steps > 1: P x 4 (float32),
  or P x param bytes with ``precision.grad_reduce_dtype: param_dtype``; divided by dp with ZeRO-2.
- optimizer_states: AdamW m and v in float32, 2 x P x 4, divided by dp when optimizer sharding is on
  (each rank keeps the states of its flat shard).
- activations (kept for backward, no recompute): per layer T x (4 h + (8 h + 4 i) / tp) x compute
  bytes (norm inputs/outputs replicated; q/k/v before and after RoPE, attention output, SwiGLU
  gate/up/product split over tp); the reference attention (CPU) also keeps B x heads / tp x S^2 scores
  and probabilities in float32, the fused flash attention (Ascend) does not; plus fp32 vocab-parallel
  logits, log-softmax and their gradient, 3 x T x vocab / tp x 4; plus compute-dtype copies of the
  weights when they differ from the storage dtype.
- activations_recompute: layer inputs only (L x T x h x compute bytes) plus one layer's full
  activations (recomputed in backward), logits as above.
- comm_buffers: two fused all-reduce buffers (comm_fusion size, 64 MB for auto) when dp > 1 and the
  optimizer is not sharded.
- workspace: runtime and collective workspace, 2 GiB on Ascend, 0.25 GiB on CPU (assumed).
Mixed precision, as Megatron / MindSpeed-LLM keep it (porting/train/step.py):
- master_weights: float32 copies of bf16/fp16 parameters, P x 4, sharded like the AdamW states.
- gradients_fp32: gradients are all-reduced, clipped and applied in float32 by default: a float32
  copy P x 4 of bf16/fp16 gradients (the accumulation buffers already are float32 when
  grad_accum_steps > 1); none with ``grad_reduce_dtype: param_dtype`` (Megatron's default, without
  --accumulate-allreduce-grads-in-fp32), where AdamW casts each gradient to float32 as it applies it.
- adamw_temporaries: the element-wise update's float32 m', v', p' and gradient of one parameter (of
  one bucket's shard when sharded) at a time (graph memory reuse frees them after each assign), 4 x 4.
- sharding_buffers: with optimizer sharding (porting/train/zero.py), the largest flat bucket's
  gradients (reduction dtype), its gathered weights (param dtype) and its float32 shard.
- hccl_buffers: HCCL's in/out buffers per communicator, 2 x HCCL_BUFFSIZE (200 MB by default; HCCL
  environment-variable docs, not re-checked here) on Ascend when world > 1.
- backward_working_set: one layer's activation gradients while it runs backward, as large as one
  layer's kept activations.
Budget: Ascend plans fit ``usable_hbm_gib``, the HBM less what the runtime keeps: MindFormers' 910
recipes cap a 64 GB device at ``max_device_memory: 58GB``, so 6 GiB are kept back; training calls
``mindspore.runtime.set_memory(max_size=...)`` with that number (:func:`apply_memory_budget`).
Checked against real H200 measurements (../shared baselines, tests/train/test_plan.py): HF Llama-7B,
bf16 params and states, seq 4096, micro 1 peaks at 62.1 GiB without checkpointing.
"""

from __future__ import annotations

from model_zoo.config import LlamaConfig

GIB = float(1 << 30)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
WORKSPACE_GIB = {"ascend": 2.0, "cpu": 0.25}
AUTO_FUSION_MB = 64
RUNTIME_RESERVED_GIB = {"ascend": 6.0, "cpu": 0.0}   # 64 GB die -> 58 GB max_device_memory (MindFormers)
HCCL_BUFFSIZE_MB = 200


def usable_hbm_gib(recipe) -> float:
    """The HBM a plan may use: the device's, less what the runtime keeps back."""
    return max(recipe.cluster.device_hbm_gib - RUNTIME_RESERVED_GIB[recipe.cluster.device], 0.0)


def apply_memory_budget(recipe) -> str | None:
    """On Ascend, cap MindSpore's device memory pool at the usable HBM; returns the size set."""
    if recipe.cluster.device != "ascend":
        return None
    from porting.train.execution import cap_device_memory

    size = f"{usable_hbm_gib(recipe):g}GB"
    cap_device_memory(size)   # mindspore.runtime.set_memory, or the older set_context(max_device_memory)
    return size


def layer_activation_bytes(cfg: LlamaConfig, micro: int, seq: int, compute_bytes: int, fused_attention: bool,
                           tp: int = 1) -> float:
    """One decoder layer's kept activations on one tensor-parallel rank (no sequence parallel: the norm
    inputs and outputs, 4 h a token, are replicated; q/k/v, RoPE outputs, attention output and the
    SwiGLU intermediates, 8 h + 4 i, are split over the heads and columns)."""
    tokens = micro * seq
    per_token = 4 * cfg.hidden_size + (8 * cfg.hidden_size + 4 * cfg.intermediate_size) / tp
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


def fusion_buffer_bytes(recipe) -> float:
    cf = recipe.parallel.comm_fusion
    if cf.enabled and cf.allreduce_mode == "size" and isinstance(cf.allreduce_config, (int, float)):
        return float(cf.allreduce_config) * (1 << 20)
    return AUTO_FUSION_MB * (1 << 20)


def estimate_memory(cfg: LlamaConfig, recipe, zero_stage: int | None = None) -> dict[str, float]:
    """Per-device memory in GiB by phase, and the total the run needs (see the module docstring).
    ``zero_stage`` overrides the plan's choice (porting.train.sharding.choose)."""
    from porting.train import comm as comm_mod
    from porting.train.sharding import choose, flat_buckets

    tp, dp = recipe.parallel.tensor_parallel, recipe.data_parallel_size
    numels = comm_mod.parameter_numels(cfg, tp)
    p = float(sum(numels))
    prec, accum = recipe.precision, recipe.batching.grad_accum_steps
    pb, cb = DTYPE_BYTES[prec.param_dtype], DTYPE_BYTES[prec.compute_dtype]
    micro, seq = recipe.batching.micro_batch_size, recipe.data.max_seq_length
    fused = recipe.cluster.device == "ascend"
    sharded = recipe.parallel.optimizer_sharding and dp > 1
    if sharded and zero_stage is None:
        zero_stage = choose(recipe, cfg).stage
    grad_fp32 = prec.grad_reduce_dtype == "float32"
    ab = 4 if grad_fp32 else pb            # accumulation / reduction dtype
    accum_buf = (p * ab / (dp if sharded and zero_stage == 2 else 1)) if accum > 1 else 0.0
    weights, grads = p * pb, p * pb + accum_buf
    states = 2 * p * 4 / (dp if sharded else 1)
    casts = p * cb if pb != cb else 0.0
    act = activation_bytes(cfg, micro, seq, cb, fused, False, tp) + casts
    act_rc = activation_bytes(cfg, micro, seq, cb, fused, True, tp) + casts
    comm = 2 * fusion_buffer_bytes(recipe) if dp > 1 and not sharded else 0.0
    work = WORKSPACE_GIB[recipe.cluster.device] * GIB
    used_act = act_rc if recipe.memory.recompute else act
    low = pb != 4
    largest = float(max(numels))
    shard_buf = 0.0
    if sharded:
        # the flat gradient bucket, its reduced shard, the gathered weights (largest bucket)
        big = max(b.padded for b in flat_buckets(numels, ab, recipe.parallel.comm_fusion, dp))
        shard_buf = big * (ab + pb) + big / dp * 4
        largest = big / dp
    extra = {
        "master_weights": p * 4 / (dp if sharded else 1) if low else 0.0,
        "gradients_fp32": p * 4 if low and grad_fp32 and accum == 1 else 0.0,
        "adamw_temporaries": 4 * largest * 4,
        "sharding_buffers": shard_buf,
        "hccl_buffers": 2 * HCCL_BUFFSIZE_MB * (1 << 20) if recipe.world_size > 1 and fused else 0.0,
        "backward_working_set": layer_activation_bytes(cfg, micro, seq, cb, True, tp),
    }
    out = {"weights": weights, "gradients": grads, "optimizer_states": states, "activations": act,
           "activations_recompute": act_rc, "comm_buffers": comm, "workspace": work, **extra,
           "total": weights + grads + states + used_act + comm + work + sum(extra.values())}
    return {k: round(v / GIB, 3) for k, v in out.items()}
