"""Each term of the per-device memory plan: its formula and where the number comes from, and the four
terms a training step holds beyond weights, gradients, states and activations:

- ``swiglu_concat``: the fused SwiGLU (Ascend, ``model_zoo/llama.py`` ``FeedForward.construct``) builds
  ``ops.cat((w1, w3))`` in the compute dtype every forward, a (2 i / tp) x h weight, and its MatMul keeps
  it for backward (the gradient of the input is dout @ [w1; w3]: MindSpore's MatMul bprop expander takes
  both inputs, mindspore-ai/mindspore mindspore/ccsrc/pipeline/pynative/grad/bprop_expander/grad_ops/
  grad_math_ops.cc). Every layer's copy lives until its backward; with recompute only the recomputed
  layer's does.
- ``hccl_buffers``: HCCL gives every communicator 2 x HCCL_BUFFSIZE (200 MB by default) for sending and
  receiving, memory no other use may share (CANN HCCL user guide, HCCL_BUFFSIZE:
  https://www.hiascend.com/document/detail/en/canncommercial/850/commlib/hcclug/hcclug_000076.html).
  The communicators a run creates (:func:`communicators`): the world group (``init()``; the barrier and,
  without tensor parallel, the gradient reduction use it), and with tensor parallel the TP group and,
  when dp > 1, the DP group (``porting/train/run/step/grid.py`` ``make_grid``). ZeRO runs on the DP group (or
  the world group), so it adds none.
- ``apply_copy``: ``ApplyStep`` (``porting/train/run/step/cells.py``) reads the accumulation buffers through
  ``hyper_map(ops.identity, buffers)``: a full copy of every buffer (float32, or the ZeRO-2 shards).
- ``zero_bucket_concat`` / ``zero_allgather``: the sharded optimizer (``porting/train/run/step/zero.py``)
  concatenates a bucket's gradients into one padded flat buffer before its reduce-scatter, and gathers
  a bucket's updated weights into one padded flat buffer before copying them back. Buckets run one after
  another (zero.py orders bucket k + 1 after bucket k with ``ops.depend``), so one bucket's concat and
  gather are live at a time; every bucket's reduced shard (padded / dp) stays until the update. The CPU's
  emulations (AllReduce + slice, AllReduce of a zero-padded buffer) hold a full bucket more each.
"""

from __future__ import annotations

from porting.train.plan.layout import Layout

HCCL_BUFFSIZE_MB = 200
HCCL_DOC = "https://www.hiascend.com/document/detail/en/canncommercial/850/commlib/hcclug/hcclug_000076.html"

# name -> (formula, source). P = parameters of one tensor-parallel rank, pb / cb / ab = bytes of the
# parameter, compute and gradient-reduction dtypes, T = micro x seq tokens, L layers, h hidden, i
# intermediate, B = the largest flat ZeRO bucket (padded elements).
TERMS: dict[str, tuple[str, str]] = {
    "weights": ("(P + the frozen base, LoRA) x pb", "model_zoo/llama.py parameters; porting/train/plan/lora.py"),
    "gradients": ("P x pb (the backward's outputs)", "porting/train/run/step/cells.py LossNet grads"),
    "accumulation_buffers": ("P x ab when grad_accum_steps > 1 (/ dp with ZeRO-2)",
                             "porting/train/run/step/cells.py accumulation_buffers, zero.py shard_buffers"),
    "optimizer_states": ("2 x P x 4 (AdamW m, v in float32; / dp sharded)", "porting/train/run/step/cells.py AdamW"),
    "master_weights": ("P x 4 for bf16/fp16 parameters (/ dp sharded)", "Megatron-LM / MindSpeed-LLM mixed precision"),
    "gradients_fp32": ("P x 4 for bf16/fp16 gradients reduced in float32, one micro-batch per step",
                       "porting/train/run/step/cells.py _Update (Megatron-LM arguments.py: bf16 reduces in fp32)"),
    "adamw_temporaries": ("4 x 4 x the largest parameter (or bucket shard)", "porting/train/run/step/cells.py _adamw"),
    "activations": ("L x T x (4 h + (8 h + 4 i) / tp) x cb + logits 3 T V / tp x 4 (+ S^2 scores, reference "
                    "attention)", "porting/train/plan/memory.py module docstring"),
    "activations_recompute": ("L x T x h x cb + one layer's activations + logits", "memory.recompute"),
    "backward_working_set": ("one layer's activations (its gradients while it runs backward)",
                             "porting/train/plan/memory.py module docstring"),
    "swiglu_concat": ("L x (2 i / tp) x h x cb, fused SwiGLU only (1 layer with recompute)",
                      "model_zoo/llama.py FeedForward.construct ops.cat((w1, w3)); MatMul keeps it for backward"),
    "clip_gradients": ("P x 4 (/ dp sharded): every unscaled float32 gradient, held until the global norm is known",
                       "porting/train/run/step/cells.py _Update.update (zero.py apply): clip needs the norm of all"),
    "apply_copy": ("the accumulation buffers again (ops.identity), grad_accum_steps > 1",
                   "porting/train/run/step/cells.py ApplyStep.construct"),
    "comm_buffers": ("2 x fusion buffer (64 MB auto) when dp > 1 and not sharded",
                     "porting/train/plan/comm.py (MindSpore AllReduceFusion)"),
    "zero_bucket_concat": ("B x ab (+ B x ab emulated) + P / dp x ab reduced shards (ZeRO-2: in the accumulation graph)",
                           "porting/train/run/step/zero.py ShardedAdamW.reduce"),
    "zero_allgather": ("B x pb (+ B x pb emulated) + B / dp x 4 updated shard",
                       "porting/train/run/step/zero.py ShardedAdamW._update"),
    "hccl_buffers": (f"communicators x 2 x HCCL_BUFFSIZE ({HCCL_BUFFSIZE_MB} MB), Ascend, world > 1", HCCL_DOC),
    "workspace": ("2 GiB Ascend, 0.25 GiB CPU (assumed)", "porting/train/plan/memory.py WORKSPACE_GIB"),
}

# Which terms are live in each phase of a step (memory.py sums them; the plan's total is the larger).
RESIDENT = ("weights", "accumulation_buffers", "optimizer_states", "master_weights", "hccl_buffers", "comm_buffers",
            "workspace")
FORWARD_BACKWARD = RESIDENT + ("gradients", "backward_working_set", "swiglu_concat")   # + the activations used
APPLY = RESIDENT + ("gradients_fp32", "clip_gradients", "adamw_temporaries", "apply_copy", "zero_bucket_concat", "zero_allgather")


def communicators(world: int, tp: int) -> list[str]:
    """The HCCL communicators a run of ``world`` ranks with tensor parallel ``tp`` creates."""
    if world <= 1:
        return []
    out = ["world"]
    if tp > 1:
        out.append("tensor parallel")
        if world // tp > 1:
            out.append("data parallel")
    return out


def hccl_bytes(world: int, tp: int, ascend: bool) -> float:
    return len(communicators(world, tp)) * 2 * HCCL_BUFFSIZE_MB * (1 << 20) if ascend else 0.0


def swiglu_concat_bytes(layers: int, hidden: int, inter: int, tp: int, compute_bytes: int, fused: bool,
                        recompute: bool) -> float:
    """The [w1; w3] copies the fused SwiGLU keeps for backward (see the module docstring)."""
    if not fused:
        return 0.0
    return (1 if recompute else layers) * 2 * inter / tp * hidden * compute_bytes


def zero_bytes(layout: Layout, ab: int, pb: int, emulated_scatter: bool, emulated_gather: bool) -> tuple[float, float]:
    """(concat, all-gather) bytes of the sharded optimizer: one bucket at a time, every reduced shard kept."""
    if not layout.sharded:
        return 0.0, 0.0
    big = float(max(b.padded for b in layout.buckets))
    shards = sum(b.shard(layout.dp) for b in layout.buckets) * ab
    concat = big * ab * (2 if emulated_scatter else 1) + shards
    gather = big * pb * (2 if emulated_gather else 1) + big / layout.dp * 4
    return concat, gather
