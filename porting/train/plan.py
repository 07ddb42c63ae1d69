"""The dry-run plan: world size, global batch, per-device memory by phase against the device's HBM
(:mod:`porting.train.memory`), and the exact `msrun` command of every node. :func:`make_plan` returns a
typed :class:`TrainPlan`; ``plan.json`` is its :meth:`TrainPlan.to_dict`. A plan that does not fit is
refused with what to change.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from model_zoo.config import LlamaConfig
from model_zoo.errors import RecipeError
from porting.train import comm, hardware, roofline, sharding
from porting.train.sharding import Collective
from porting.train.host_memory import check_host_memory, host_memory
from porting.train.memory import (DTYPE_BYTES, GIB, apply_memory_budget, estimate_memory,  # noqa: F401 (re-exported)
                                  usable_hbm_gib)


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
        out.append(f"none of these alone fits: the parameters, their gradients, fp32 masters and AdamW states take "
                   f"{floor:.1f} GiB per device at tensor parallel {recipe.parallel.tensor_parallel}; see the proposed "
                   "(TP, DP, sharding, recompute) settings")
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
COLLECTIVE_CONVENTION = ("per optimizer step per rank; payload = bytes of the buffer a collective is called on, "
                         "wire = ring bytes one rank sends (AllReduce 2(n-1)/n, ReduceScatter/AllGather (n-1)/n of "
                         "the payload); tensor parallel as Megatron without sequence parallel (estimate)")


@dataclass(frozen=True)
class ModelShape:
    parameters: int
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int


@dataclass
class TrainPlan:
    """What `port train --dry-run` prints and ``plan.json`` holds (its :meth:`to_dict`)."""

    model: ModelShape
    device: str
    nodes: int
    devices_per_node: int
    world_size: int
    data_parallel: int
    micro_batch_size: int
    grad_accum_steps: int
    global_batch: int
    global_batch_formula: str
    max_tokens_per_step: int
    max_seq_length: int
    precision: dict[str, Any]
    mixed_precision: str
    recompute: bool
    optimizer_sharding: bool
    comm_fusion: dict[str, Any]
    gradient_allreduce: dict[str, Any]
    launch: dict[str, Any]
    memory_gib_by_phase: dict[str, float]
    device_hbm_gib: float
    usable_hbm_gib: float
    margin_gib: float
    fits: bool
    hardware: str = ""
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    sharding: dict[str, Any] = field(default_factory=dict)
    collectives: list[Collective] = field(default_factory=list)
    collective_bytes: dict[str, int] = field(default_factory=dict)
    collective_convention: str = ""
    suggestions: list[str] = field(default_factory=list)
    proposals: list[dict[str, Any]] = field(default_factory=list)
    estimated_step: dict[str, float] = field(default_factory=dict)
    msrun_commands: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    padding: dict[str, Any] | None = None   # --dry-run: padding of bucketing vs packing (packing.py)
    host_memory: dict[str, Any] = field(default_factory=dict)   # peak host RAM per worker and node (host_memory.py)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``plan.json``, ``--dry-run --json``)."""
        return dataclasses.asdict(self)


def make_plan(recipe, cfg: LlamaConfig, recipe_path: str, run_dir: str, overrides: list[str] | None = None,
              resume: bool = False) -> TrainPlan:
    choice = sharding.choose(recipe, cfg)
    mem = estimate_memory(cfg, recipe, zero_stage=choice.stage or None)
    usable = usable_hbm_gib(recipe)
    fits = mem["total"] <= usable
    b, multi = recipe.batching, recipe.world_size > 1
    tp, dp = recipe.parallel.tensor_parallel, recipe.data_parallel_size
    cols = sharding.collectives(recipe, cfg, choice)
    return TrainPlan(
        model=ModelShape(cfg.num_parameters(), cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size),
        device=recipe.cluster.device, nodes=recipe.cluster.nodes, devices_per_node=recipe.cluster.devices_per_node,
        world_size=recipe.world_size, data_parallel=dp, hardware=hardware.shape_line(recipe.cluster), tensor_parallel=tp,
        micro_batch_size=b.micro_batch_size, grad_accum_steps=b.grad_accum_steps, global_batch=recipe.global_batch_size,
        global_batch_formula=f"{b.micro_batch_size} micro x {b.grad_accum_steps} accum x {dp} DP",
        sharding={**dataclasses.asdict(choice), "how": choice.describe()}, collectives=cols,
        collective_bytes=sharding.bytes_summary(cols), collective_convention=COLLECTIVE_CONVENTION,
        max_tokens_per_step=recipe.global_batch_size * recipe.data.max_seq_length,
        max_seq_length=recipe.data.max_seq_length, precision=recipe.precision.model_dump(mode="json"),
        mixed_precision=mixed_precision(recipe), recompute=recipe.memory.recompute,
        optimizer_sharding=recipe.parallel.optimizer_sharding,
        comm_fusion=recipe.parallel.comm_fusion.model_dump(mode="json"),
        gradient_allreduce=comm.fusion_plan(recipe, cfg), launch=comm.launch_plan(recipe, cfg) if multi else {},
        memory_gib_by_phase=mem, device_hbm_gib=recipe.cluster.device_hbm_gib, usable_hbm_gib=usable,
        margin_gib=round(usable - mem["total"], 3), fits=fits,
        suggestions=[] if fits else suggestions(cfg, recipe, usable),
        proposals=[] if fits else roofline.proposals(recipe, cfg, _with),
        estimated_step=roofline.step_time(recipe, cfg) if recipe.cluster.device == "ascend" else {},
        msrun_commands=msrun_commands(recipe, recipe_path, run_dir, overrides, resume) if multi else [],
        warnings=plan_warnings(recipe, cfg), host_memory=host_memory(recipe, cfg, mem["total"]))


def mixed_precision(recipe) -> str:
    """How the step treats the dtypes, in one line (step.AdamW / step._Update)."""
    p = recipe.precision
    if p.param_dtype == "float32":
        return (f"float32 parameters, {p.compute_dtype} compute; gradients all-reduced, clipped and applied in "
                "float32; AdamW states float32")
    shard = " (sharded with optimizer sharding)" if recipe.parallel.optimizer_sharding and recipe.world_size > 1 else ""
    scale = f"; loss scale {p.loss_scale.kind}" if p.compute_dtype == "float16" or p.loss_scale.kind != "none" else ""
    reduce = "float32" if p.grad_reduce_dtype == "float32" else f"{p.param_dtype} (grad_reduce_dtype: param_dtype)"
    how = "reduce-scattered" if shard else "all-reduced"
    return (f"{p.param_dtype} parameters for compute, float32 master weights and AdamW states{shard}; gradients "
            f"accumulated and {how} in {reduce}, clipped in float32 and applied to the float32 masters{scale}")


def plan_warnings(recipe, cfg: LlamaConfig) -> list[str]:
    w = []
    choice = sharding.choose(recipe, cfg)
    if choice.enabled:
        w.append("parallel.optimizer_sharding: each data-parallel rank keeps the AdamW states (and fp32 masters of "
                 "bf16/fp16 parameters) of its flat shard; checkpoints need a filesystem shared by all nodes")
    if choice.reduce_scatter == sharding.EMULATED:
        w.append("parallel.optimizer_sharding on the CPU: MindSpore's CPU collectives have no working ReduceScatter (a "
                 "stub in MCCL, no CPU kernel), so the gradients are all-reduced and sliced (emulation: twice the wire "
                 "bytes of the Ascend path)")
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
    from porting.model_paths import resolve_hf

    notes = []
    if not Path(recipe.data.path).exists():   # a file, or a datasets directory
        notes.append(f"data.path {recipe.data.path} is not on this machine (needed to run, not to plan)")
    try:
        return LlamaConfig.from_hf(resolve_hf(recipe.model.source)), notes
    except UnknownModelError:
        if not presets.known(recipe.model.source):
            raise
        notes.append(f"model.source {recipe.model.source}: checkpoint not in the local HF cache; planned with the "
                     "zoo's copy of its config.json")
        return presets.config(recipe.model.source), notes


def check_fits(plan: TrainPlan, where: str) -> None:
    check_host_memory(plan.host_memory, where)
    if plan.fits:
        return
    raise RecipeError(f"{where}: needs {plan.memory_gib_by_phase['total']:.1f} GiB per device, more than the "
                      f"{plan.device_hbm_gib:.0f} GiB of HBM allows ({plan.usable_hbm_gib:g} GiB usable, the rest "
                      "kept by the runtime); change: " + "; ".join(plan.suggestions)
                      + ("; fastest working setting (estimate): " + roofline.proposal_line(plan.proposals[0])
                         if plan.proposals else "; no (TP, DP, sharding, recompute) setting fits these devices"))


def format_plan(plan: TrainPlan) -> str:
    mem = plan.memory_gib_by_phase
    prec = plan.precision
    lines = [
        f"model: {plan.model.parameters / 1e9:.3f} B parameters, {plan.model.num_hidden_layers} layers",
        f"world size: {plan.hardware} = {plan.tensor_parallel} tensor parallel x {plan.data_parallel} data parallel"
        + (" (no sequence parallel)" if plan.tensor_parallel > 1 and not plan.sequence_parallel else ""),
        f"global batch: {plan.global_batch} = {plan.global_batch_formula}; up to "
        f"{plan.max_tokens_per_step} tokens per step at seq {plan.max_seq_length}",
        f"precision: params {prec['param_dtype']}, compute {prec['compute_dtype']}, "
        f"loss scale {prec['loss_scale']['kind']}; recompute {plan.recompute}; "
        f"optimizer sharding {plan.sharding.get('how', plan.optimizer_sharding)}",
        f"mixed precision: {plan.mixed_precision}",
        "memory per device (GiB):",
    ]
    for k in ("weights", "gradients", "optimizer_states", "master_weights", "gradients_fp32", "adamw_temporaries",
              "activations", "activations_recompute", "backward_working_set", "comm_buffers", "sharding_buffers",
              "hccl_buffers", "workspace"):
        used = ""
        if k == "activations" and plan.recompute or k == "activations_recompute" and not plan.recompute:
            used = "  (not used)"
        lines.append(f"  {k:<22} {mem[k]:>9.2f}{used}")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines.append(f"  {'total':<22} {mem['total']:>9.2f} of {plan.usable_hbm_gib:g} GiB usable "
                 f"({plan.device_hbm_gib:g} GiB HBM) per device: {verdict}, margin {plan.margin_gib:.2f} GiB")
    lines += [f"  change: {s}" for s in plan.suggestions]
    hm = plan.host_memory
    if hm:
        limit = f" of cluster.host_memory_gib {hm['limit_gib']:g}" if hm["limit_gib"] is not None else ""
        lines.append(f"host RAM (predicted peak): {hm['worker_gib']:.2f} GiB per worker, {hm['node_gib']:.2f} GiB "
                     f"per node{limit} ({hm['formula']})")
    if plan.proposals:
        lines.append("working settings at the same global batch, fastest first (roofline estimate, porting/train/roofline.py):")
        lines += [f"  {i + 1}. {roofline.proposal_line(p)}" for i, p in enumerate(plan.proposals)]
    if plan.estimated_step:
        e = plan.estimated_step
        lines.append(f"estimated step (roofline at the 910C peak, an estimate): {e['step_s']:.2f} s = compute "
                     f"{e['compute_s']:.2f} + optimizer {e['memory_s']:.2f} + communication {e['comm_s']:.2f}")
    lines += [f"warning: {w}" for w in plan.warnings]
    lines += _collective_lines(plan)
    ga = plan.gradient_allreduce
    if ga.get("allreduce_ops") and not plan.sharding.get("enabled"):
        lines.append(f"gradient all-reduce: {ga['gradients']} gradients in {ga['allreduce_ops']} AllReduce op(s), "
                     f"largest bucket {max(ga['bucket_mib'])} MiB ({ga['how']})")
    if plan.launch:
        lines.append("env on every node: " + " ".join(f"{k}={v}" for k, v in plan.launch["env"].items())
                     + f" (predicted checkpoint save {plan.launch['predicted_save_s']} s; {plan.launch['formula']})")
        lines.append("must match on every node: " + ", ".join(plan.launch["same_on_every_node"]))
    lines += [f"node {i}: {cmd}" for i, cmd in enumerate(plan.msrun_commands)]
    return "\n".join(lines)


def _collective_lines(plan: TrainPlan) -> list[str]:
    if not plan.collectives:
        return []
    mib = lambda b: f"{b / (1 << 20):,.1f} MiB"  # noqa: E731
    cb = plan.collective_bytes
    out = [f"collectives per step per rank: payload {mib(cb['payload_bytes'])}, wire {mib(cb['wire_bytes'])} "
           f"(data parallel {mib(cb['dp_wire_bytes'])}, tensor parallel {mib(cb['tp_wire_bytes'])}); "
           + plan.collective_convention]
    for c in plan.collectives:
        out.append(f"  {c.op:<13} x{c.count:<5} {c.group} of {c.ranks:<3} payload {mib(c.payload_bytes):>14}  wire "
                   f"{mib(c.wire_bytes):>14}  {c.purpose}")
    return out
