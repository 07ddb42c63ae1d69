"""The dry-run plan: world size, global batch, per-device memory by phase against the device's HBM,
and the exact `msrun` command of every node. A plan that does not fit is refused with what to change.

Memory model (bytes per device; P = parameters, T = micro_batch x seq tokens, L = layers):
- weights: P x param bytes.
- gradients: P x param bytes, plus an accumulation buffer when grad_accum_steps > 1: P x 4 (float32),
  or P x param bytes with ``precision.grad_reduce_dtype: param_dtype``.
- optimizer_states: AdamW m and v in float32, 2 x P x 4, divided by the data-parallel size when
  optimizer sharding is on (ZeRO-1: each rank keeps the states of the parameters it owns).
- activations (kept for backward, no recompute): per layer T x (12 h + 4 i) x compute bytes
  (norm inputs/outputs, q/k/v before and after RoPE, attention output, SwiGLU gate/up/product);
  the reference attention (CPU) also keeps B x heads x S^2 scores and probabilities in float32, the
  fused flash attention (Ascend) does not; plus fp32 logits, log-softmax and their gradient,
  3 x T x vocab x 4; plus compute-dtype copies of the weights when they differ from the storage dtype.
- activations_recompute: layer inputs only (L x T x h x compute bytes) plus one layer's full
  activations (recomputed in backward), logits as above.
- comm_buffers: two fused all-reduce buffers (comm_fusion size, 64 MB for auto) when world > 1,
  twice with optimizer sharding (all-gather of updated weights).
- workspace: runtime and collective workspace, 2 GiB on Ascend, 0.25 GiB on CPU (assumed).
Mixed precision, as Megatron / MindSpeed-LLM keep it (porting/train/step.py):
- master_weights: float32 copies of bf16/fp16 parameters, P x 4, sharded like the AdamW states.
- gradients_fp32: gradients are all-reduced, clipped and applied in float32 by default: a float32
  copy P x 4 of bf16/fp16 gradients (the accumulation buffers already are float32 when
  grad_accum_steps > 1); none with ``grad_reduce_dtype: param_dtype`` (Megatron's default, without
  --accumulate-allreduce-grads-in-fp32), where AdamW casts each gradient to float32 as it applies it.
- adamw_temporaries: the element-wise update's float32 m', v', p' and gradient of one parameter at a
  time (graph memory reuse frees them after each assign), 4 x the largest parameter x 4.
- sharding_buffers: with optimizer sharding every parameter is taken from its owner by an float32
  all-reduce of ``param x mask``: input and output of the largest parameter, 2 x 4 bytes.
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

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from porting.train import comm

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
    import mindspore as ms

    size = f"{usable_hbm_gib(recipe):g}GB"
    ms.runtime.set_memory(max_size=size)
    return size


def activation_bytes(cfg: LlamaConfig, micro: int, seq: int, compute_bytes: int, fused_attention: bool,
                     recompute: bool) -> float:
    tokens = micro * seq
    per_layer = tokens * (12 * cfg.hidden_size + 4 * cfg.intermediate_size) * compute_bytes
    if not fused_attention:
        per_layer += micro * cfg.num_attention_heads * seq * seq * 8
    logits = 3 * tokens * cfg.vocab_size * 4
    if recompute:
        return cfg.num_hidden_layers * tokens * cfg.hidden_size * compute_bytes + per_layer + logits
    return cfg.num_hidden_layers * per_layer + logits


def fusion_buffer_bytes(recipe) -> float:
    cf = recipe.parallel.comm_fusion
    if cf.enabled and cf.allreduce_mode == "size" and isinstance(cf.allreduce_config, (int, float)):
        return float(cf.allreduce_config) * (1 << 20)
    return AUTO_FUSION_MB * (1 << 20)


def estimate_memory(cfg: LlamaConfig, recipe) -> dict[str, float]:
    """Per-device memory in GiB by phase, and the total the run needs (see the module docstring)."""
    p = float(cfg.num_parameters())
    prec, dp = recipe.precision, recipe.world_size
    pb, cb = DTYPE_BYTES[prec.param_dtype], DTYPE_BYTES[prec.compute_dtype]
    micro, seq = recipe.batching.micro_batch_size, recipe.data.max_seq_length
    fused = recipe.cluster.device == "ascend"
    weights = p * pb
    grad_fp32 = prec.grad_reduce_dtype == "float32"
    grads = p * pb + (p * (4 if grad_fp32 else pb) if recipe.batching.grad_accum_steps > 1 else 0.0)
    states = 2 * p * 4 / (dp if recipe.parallel.optimizer_sharding else 1)
    casts = p * cb if pb != cb else 0.0
    act = activation_bytes(cfg, micro, seq, cb, fused, False) + casts
    act_rc = activation_bytes(cfg, micro, seq, cb, fused, True) + casts
    comm = 0.0
    sharded = recipe.parallel.optimizer_sharding and dp > 1
    if dp > 1:
        comm = 2 * fusion_buffer_bytes(recipe) * (2 if sharded else 1)
    work = WORKSPACE_GIB[recipe.cluster.device] * GIB
    used_act = act_rc if recipe.memory.recompute else act
    low = pb != 4
    largest = float(max(cfg.vocab_size * cfg.hidden_size, cfg.hidden_size * cfg.intermediate_size))
    extra = {
        "master_weights": p * 4 / (dp if sharded else 1) if low else 0.0,
        "gradients_fp32": p * 4 if low and grad_fp32 and recipe.batching.grad_accum_steps == 1 else 0.0,
        "adamw_temporaries": 4 * largest * 4,
        "sharding_buffers": 2 * largest * 4 if sharded else 0.0,
        "hccl_buffers": 2 * HCCL_BUFFSIZE_MB * (1 << 20) if dp > 1 and recipe.cluster.device == "ascend" else 0.0,
        "backward_working_set": micro * seq * (12 * cfg.hidden_size + 4 * cfg.intermediate_size) * cb,
    }
    out = {"weights": weights, "gradients": grads, "optimizer_states": states, "activations": act,
           "activations_recompute": act_rc, "comm_buffers": comm, "workspace": work, **extra,
           "total": weights + grads + states + used_act + comm + work + sum(extra.values())}
    return {k: round(v / GIB, 3) for k, v in out.items()}


# --------------------------------------------------------------------------- what to change
@dataclass(frozen=True)
class Remedy:
    change: str                        # the --set overrides, as the user types them
    applies: Callable[[object], bool]
    overrides: Callable[[object], dict]


def _with(recipe, **paths) -> object:
    raw = recipe.model_dump(mode="json")
    for key, value in paths.items():
        node = raw
        parts = key.split("__")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return type(recipe).model_validate(raw)


REMEDIES: list[Remedy] = [
    Remedy("memory.recompute=true", lambda r: not r.memory.recompute, lambda r: {"memory__recompute": True}),
    Remedy("parallel.optimizer_sharding=true", lambda r: r.world_size > 1 and not r.parallel.optimizer_sharding,
           lambda r: {"parallel__optimizer_sharding": True}),
    Remedy("batching.micro_batch_size=1 with grad_accum_steps x micro (same global batch)",
           lambda r: r.batching.micro_batch_size > 1,
           lambda r: {"batching__micro_batch_size": 1,
                      "batching__grad_accum_steps": r.batching.grad_accum_steps * r.batching.micro_batch_size}),
    Remedy("precision.param_dtype=bfloat16 (fp32 AdamW states kept)",
           lambda r: r.cluster.device == "ascend" and r.precision.param_dtype == "float32",
           lambda r: {"precision__param_dtype": "bfloat16", "precision__compute_dtype": "bfloat16"}),
    Remedy("data.max_seq_length halved", lambda r: r.data.max_seq_length >= 1024,
           lambda r: {"data__max_seq_length": r.data.max_seq_length // 2}),
]


def suggestions(cfg: LlamaConfig, recipe, hbm: float) -> list[str]:
    """Each remedy alone, then all of them together, with the total it gives."""
    out = []
    combined = recipe
    for rem in REMEDIES:
        if not rem.applies(recipe):
            continue
        alt = _with(recipe, **rem.overrides(recipe))
        total = estimate_memory(cfg, alt)["total"]
        out.append(f"{rem.change} -> {total:.1f} GiB" + (" (fits)" if total <= hbm else ""))
        combined = _with(combined, **rem.overrides(combined)) if rem.applies(combined) else combined
    if len(out) > 1:
        total = estimate_memory(cfg, combined)["total"]
        out.append(f"all of the above -> {total:.1f} GiB" + (" (fits)" if total <= hbm else ""))
    if not any("(fits)" in o for o in out):
        mem = estimate_memory(cfg, combined)
        floor = sum(mem[k] for k in ("weights", "gradients", "optimizer_states", "master_weights", "gradients_fp32"))
        out.append(f"no setting fits: the parameters, their gradients, fp32 masters and AdamW states alone take "
                   f"{floor:.1f} GiB per device in data parallel; this model needs gradient sharding (ZeRO-2) or "
                   "tensor/pipeline parallelism, which port does not have, or devices with more HBM")
    return out


# --------------------------------------------------------------------------- msrun
def worker_script() -> Path:
    return Path(__file__).with_name("worker.py")


def msrun_commands(recipe, recipe_path: str, run_dir: str, overrides: list[str] | None = None,
                   resume: bool = False, python_path_hint: bool = False) -> list[str]:
    """The exact command of every node (node_rank 0 hosts the scheduler at master_addr)."""
    c = recipe.cluster
    base = ["msrun", f"--worker_num={recipe.world_size}", f"--local_worker_num={c.devices_per_node}",
            f"--master_addr={c.master_addr}", f"--master_port={c.master_port}"]
    tail = [f"--log_dir={Path(run_dir) / 'logs' / 'msrun'}", "--join=True", f"--cluster_time_out={c.cluster_time_out}"]
    if c.rank_table_file:
        tail.append(f"--rank_table_file={c.rank_table_file}")
    script = [str(worker_script()), "--recipe", str(recipe_path), "--run-dir", str(run_dir)]
    for o in overrides or []:
        script += ["--set", o]
    if resume:
        script.append("--resume")
    cmds = []
    for node in range(c.nodes):
        argv = base + [f"--node_rank={node}"] + tail + script
        cmds.append(" ".join(shlex.quote(a) for a in argv))
    return cmds


# --------------------------------------------------------------------------- the plan
def make_plan(recipe, cfg: LlamaConfig, recipe_path: str, run_dir: str, overrides: list[str] | None = None,
              resume: bool = False) -> dict:
    mem = estimate_memory(cfg, recipe)
    hbm = recipe.cluster.device_hbm_gib
    usable = usable_hbm_gib(recipe)
    fits = mem["total"] <= usable
    b = recipe.batching
    return {
        "model": {"parameters": cfg.num_parameters(), "hidden_size": cfg.hidden_size,
                  "num_hidden_layers": cfg.num_hidden_layers, "vocab_size": cfg.vocab_size},
        "device": recipe.cluster.device,
        "nodes": recipe.cluster.nodes,
        "devices_per_node": recipe.cluster.devices_per_node,
        "world_size": recipe.world_size,
        "data_parallel": recipe.world_size,
        "micro_batch_size": b.micro_batch_size,
        "grad_accum_steps": b.grad_accum_steps,
        "global_batch": recipe.global_batch_size,
        "global_batch_formula": f"{b.micro_batch_size} micro x {b.grad_accum_steps} accum x {recipe.world_size} DP",
        "max_tokens_per_step": recipe.global_batch_size * recipe.data.max_seq_length,
        "max_seq_length": recipe.data.max_seq_length,
        "precision": recipe.precision.model_dump(mode="json"),
        "mixed_precision": mixed_precision(recipe),
        "recompute": recipe.memory.recompute,
        "optimizer_sharding": recipe.parallel.optimizer_sharding,
        "comm_fusion": recipe.parallel.comm_fusion.model_dump(mode="json"),
        "gradient_allreduce": comm.fusion_plan(recipe, cfg),
        "launch": comm.launch_plan(recipe, cfg) if recipe.world_size > 1 else {},
        "memory_gib_by_phase": mem,
        "device_hbm_gib": hbm,
        "usable_hbm_gib": usable,
        "margin_gib": round(usable - mem["total"], 3),
        "fits": fits,
        "suggestions": [] if fits else suggestions(cfg, recipe, usable),
        "msrun_commands": msrun_commands(recipe, recipe_path, run_dir, overrides, resume) if recipe.world_size > 1 else [],
        "warnings": plan_warnings(recipe, cfg),
    }


def mixed_precision(recipe) -> str:
    """How the step treats the dtypes, in one line (step.AdamW / step._Update)."""
    p = recipe.precision
    if p.param_dtype == "float32":
        return (f"float32 parameters, {p.compute_dtype} compute; gradients all-reduced, clipped and applied in "
                "float32; AdamW states float32")
    shard = " (sharded with optimizer sharding)" if recipe.parallel.optimizer_sharding and recipe.world_size > 1 else ""
    scale = f"; loss scale {p.loss_scale.kind}" if p.compute_dtype == "float16" or p.loss_scale.kind != "none" else ""
    reduce = "float32" if p.grad_reduce_dtype == "float32" else f"{p.param_dtype} (grad_reduce_dtype: param_dtype)"
    return (f"{p.param_dtype} parameters for compute, float32 master weights and AdamW states{shard}; gradients "
            f"accumulated and all-reduced in {reduce}, clipped in float32 and applied to the float32 masters{scale}")


def plan_warnings(recipe, cfg: LlamaConfig) -> list[str]:
    w = []
    if recipe.parallel.optimizer_sharding and recipe.world_size > 1:
        w.append("parallel.optimizer_sharding: each rank keeps AdamW states for its own parameters and the updated "
                 "weights are shared with an all-reduce (no ReduceScatter, which is a stub on the CPU): twice the "
                 "all-reduce traffic of plain data parallel; checkpoints need a filesystem shared by all nodes")
    if recipe.data.max_seq_length > cfg.max_position_embeddings:
        w.append(f"data.max_seq_length={recipe.data.max_seq_length} exceeds the model's max_position_embeddings="
                 f"{cfg.max_position_embeddings}")
    if recipe.cluster.device == "ascend" and recipe.precision.compute_dtype == "float16" \
            and recipe.precision.loss_scale.kind == "none":
        w.append("precision: float16 compute without loss scaling underflows gradients; set "
                 "precision.loss_scale.kind=dynamic")
    return w


def plan_config(recipe) -> tuple[LlamaConfig, list[str]]:
    """The architecture for a dry run: the checkpoint's config.json when it is here, else the zoo
    preset's copy of that config.json (a plan for a cluster whose checkpoint is not on this machine)."""
    from model_zoo import presets
    from model_zoo.errors import UnknownModelError
    from porting.sources import resolve_hf

    notes = []
    if not Path(recipe.data.path).exists():   # a file, or a datasets directory
        notes.append(f"data.path {recipe.data.path} is not on this machine (needed to run, not to plan)")
    try:
        return LlamaConfig.from_hf(resolve_hf(recipe.model.source)), notes
    except UnknownModelError:
        if recipe.model.source not in presets.names():
            raise
        notes.append(f"model.source {recipe.model.source}: checkpoint not in the local HF cache; planned with the "
                     "zoo's copy of its config.json")
        return presets.config(recipe.model.source), notes


def check_fits(plan: dict, where: str) -> None:
    if plan["fits"]:
        return
    mem = plan["memory_gib_by_phase"]
    raise RecipeError(f"{where}: needs {mem['total']:.1f} GiB per device, more than the {plan['device_hbm_gib']:.0f} "
                      f"GiB of HBM allows ({plan['usable_hbm_gib']:g} GiB usable, the rest kept by the runtime); "
                      "change: " + "; ".join(plan["suggestions"]))


def format_plan(plan: dict) -> str:
    mem = plan["memory_gib_by_phase"]
    lines = [
        f"model: {plan['model']['parameters'] / 1e9:.3f} B parameters, {plan['model']['num_hidden_layers']} layers",
        f"world size: {plan['world_size']} ({plan['nodes']} node(s) x {plan['devices_per_node']} device(s), data parallel)",
        f"global batch: {plan['global_batch']} = {plan['global_batch_formula']}; up to "
        f"{plan['max_tokens_per_step']} tokens per step at seq {plan['max_seq_length']}",
        f"precision: params {plan['precision']['param_dtype']}, compute {plan['precision']['compute_dtype']}, "
        f"loss scale {plan['precision']['loss_scale']['kind']}; recompute {plan['recompute']}; "
        f"optimizer sharding {plan['optimizer_sharding']}",
        f"mixed precision: {plan['mixed_precision']}",
        "memory per device (GiB):",
    ]
    for k in ("weights", "gradients", "optimizer_states", "master_weights", "gradients_fp32", "adamw_temporaries",
              "activations", "activations_recompute", "backward_working_set", "comm_buffers", "sharding_buffers",
              "hccl_buffers", "workspace"):
        used = ""
        if k == "activations" and plan["recompute"] or k == "activations_recompute" and not plan["recompute"]:
            used = "  (not used)"
        lines.append(f"  {k:<22} {mem[k]:>9.2f}{used}")
    verdict = "fits" if plan["fits"] else "DOES NOT FIT"
    lines.append(f"  {'total':<22} {mem['total']:>9.2f} of {plan['usable_hbm_gib']:g} GiB usable "
                 f"({plan['device_hbm_gib']:g} GiB HBM) per device: {verdict}, margin {plan['margin_gib']:.2f} GiB")
    for s in plan["suggestions"]:
        lines.append(f"  change: {s}")
    for w in plan["warnings"]:
        lines.append(f"warning: {w}")
    ga = plan.get("gradient_allreduce") or {}
    if ga.get("allreduce_ops"):
        lines.append(f"gradient all-reduce: {ga['gradients']} gradients in {ga['allreduce_ops']} AllReduce op(s), "
                     f"largest bucket {max(ga['bucket_mib'])} MiB ({ga['how']})")
    launch = plan.get("launch") or {}
    if launch:
        lines.append(f"env on every node: " + " ".join(f"{k}={v}" for k, v in launch["env"].items())
                     + f" (predicted checkpoint save {launch['predicted_save_s']} s; {launch['formula']})")
        lines.append("must match on every node: " + ", ".join(launch["same_on_every_node"]))
    for i, cmd in enumerate(plan["msrun_commands"]):
        lines.append(f"node {i}: {cmd}")
    return "\n".join(lines)
