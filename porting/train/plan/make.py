"""The dry-run plan: world size, global batch, per-device memory by phase against the device's HBM
(:mod:`porting.train.plan.memory`), and the exact `msrun` command of every node. :func:`make_plan` returns a
typed :class:`TrainPlan`; ``plan.json`` is its :meth:`TrainPlan.to_dict`. A plan that does not fit is
refused with what to change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from model_zoo.config import LlamaConfig, divisibility_problems
from model_zoo import presets, typed
from model_zoo.errors import ConfigError, RecipeError, UnknownModelError
from model_zoo.typed import spec
from porting.model_paths import resolve_hf
from porting.train.data.padding import PaddingChoices
from porting.train.plan import calibrated, comm, execution, roofline, sharding
from porting.train.plan import lora as lora_plan
from porting.train.plan.allowances import Allowances, allowances, plan_shapes
from porting.train.plan.checkpoint_io import DiskPlan, SaveOverhead, disk_plan, save_overhead
from porting.train.plan.estimates import StepEstimate
from porting.train.plan.host_memory import HostMemory, check_host_memory, host_memory
from porting.train.plan.launch import msrun_commands
from porting.train.plan.memory import MemoryByPhase, estimate_memory, usable_hbm_gib
from porting.train.plan.layout import ShardingChoice, ShardingPlan
from porting.train.plan.sharding import Collective, CollectiveBytes
from porting.train.recipe import hardware
from porting.train.recipe.schema import CommFusionSection, PrecisionSection, Recipe


# --------------------------------------------------------------------------- what to change
@dataclass(frozen=True)
class Remedy:
    change: str                        # the --set overrides, as the user types them
    applies: Callable[[Recipe], bool]
    overrides: Callable[[Recipe], dict[str, Any]]   # {"section.key": value}, for Recipe.with_overrides


REMEDIES: list[Remedy] = [
    Remedy("memory.recompute=true", lambda r: not r.memory.recompute, lambda r: {"memory.recompute": True}),
    Remedy("parallel.optimizer_sharding=true", lambda r: r.world_size > 1 and not r.parallel.optimizer_sharding,
           lambda r: {"parallel.optimizer_sharding": True}),
    Remedy("batching.micro_batch_size=1 with grad_accum_steps x micro (same global batch)",
           lambda r: r.batching.micro_batch_size > 1,
           lambda r: {"batching.micro_batch_size": 1,
                      "batching.grad_accum_steps": r.batching.grad_accum_steps * r.batching.micro_batch_size}),
    Remedy("precision.param_dtype=bfloat16 (fp32 AdamW states kept)",
           lambda r: r.cluster.device == "ascend" and r.precision.param_dtype == "float32",
           lambda r: {"precision.param_dtype": "bfloat16", "precision.compute_dtype": "bfloat16"}),
    Remedy("data.max_seq_length halved", lambda r: r.data.max_seq_length >= 1024,
           lambda r: {"data.max_seq_length": r.data.max_seq_length // 2}),
]


def _estimate(cfg: LlamaConfig, recipe: Recipe) -> MemoryByPhase:
    """The memory of a candidate recipe, its layout computed once."""
    return estimate_memory(cfg, recipe, layout=sharding.layout_for(recipe, cfg))


def suggestions(cfg: LlamaConfig, recipe: Recipe, hbm: float) -> list[str]:
    """Each remedy alone, then all of them together, with the total it gives."""
    out = []
    combined = recipe
    for rem in REMEDIES:
        if not rem.applies(recipe):
            continue
        total = _estimate(cfg, recipe.with_overrides(rem.overrides(recipe))).total
        out.append(f"{rem.change} -> {total:.1f} GiB" + (" (fits)" if total <= hbm else ""))
        combined = combined.with_overrides(rem.overrides(combined)) if rem.applies(combined) else combined
    mem = _estimate(cfg, combined) if len(out) > 1 or not any("(fits)" in o for o in out) else None
    if mem is not None and len(out) > 1:
        total = mem.total
        out.append(f"all of the above -> {total:.1f} GiB" + (" (fits)" if total <= hbm else ""))
    if mem is not None and not any("(fits)" in o for o in out):
        floor = sum(mem.term(k) for k in ("weights", "gradients", "optimizer_states", "master_weights", "gradients_fp32"))
        out.append(f"none of these alone fits: the parameters, their gradients, fp32 masters and AdamW states take "
                   f"{floor:.1f} GiB per device at tensor parallel {recipe.parallel.tensor_parallel}; see the proposed "
                   "(TP, DP, sharding, recompute) settings")
    return out


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


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    """What `port train --dry-run` prints and ``plan.json`` holds (:meth:`to_dict`; :meth:`from_dict` reads it back).
    Every part is a record made where it is computed; the field order is plan.json's key order. A new term is a
    field here (or in its record) and nothing else: :mod:`model_zoo.typed` writes and reads it."""
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
    precision: PrecisionSection                 # the recipe's, as resolved (loss_scale auto made concrete)
    mixed_precision: str
    recompute: bool
    optimizer_sharding: bool
    comm_fusion: CommFusionSection              # the recipe's parallel.comm_fusion
    gradient_allreduce: comm.GradientAllreduce
    launch: comm.LaunchPlan | None = spec(None, empty_none=True)   # None on one device
    memory_gib_by_phase: MemoryByPhase
    device_hbm_gib: float
    usable_hbm_gib: float
    margin_gib: float
    fits: bool
    hardware: str = ""
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    sharding: ShardingPlan
    collectives: tuple[Collective, ...] = ()
    collective_bytes: CollectiveBytes
    collective_convention: str = ""
    suggestions: tuple[str, ...] = ()
    proposals: tuple[roofline.Proposal, ...] = ()
    # roofline (Ascend) or calibrated (--calibration); None on a CPU without a calibration
    estimated_step: StepEstimate | None = spec(None, empty_none=True)
    throughput: calibrated.Throughput | None = spec(None, empty_none=True)   # of that estimate
    links: roofline.Links | None = spec(None, empty_none=True)               # Ascend only
    msrun_commands: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    padding: PaddingChoices | None = None   # --dry-run: padding of bucketing vs packing (data/padding.py)
    execution: str = ""                     # graph or pynative, and why (plan/execution.py)
    host_memory: HostMemory                 # peak host RAM per worker and node (host_memory.py)
    allowances: Allowances                  # the supervisor's, per phase (allowances.py)
    disk: DiskPlan | None = spec(None, empty_none=True)                  # the run directory's need (checkpoint_io.py)
    save_overhead: SaveOverhead | None = spec(None, empty_none=True)     # the saves' share of wall time
    training: str = ""                      # full fine-tuning or LoRA, and what trains (plan/lora.py describe)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``plan.json``, ``--dry-run --json``)."""
        return typed.write(self)

    @classmethod
    def from_dict(cls, doc: Any, source: str = "plan") -> "TrainPlan":
        """The plan :meth:`to_dict` wrote, its records rebuilt (:mod:`model_zoo.typed`, strict: port writes and reads
        it itself); one ConfigError line naming ``source`` and every missing, unknown or mistyped key otherwise."""
        if not isinstance(doc, dict):
            raise ConfigError(f"{source}: top level is {type(doc).__name__}, expected an object (a plan port wrote)")
        out: list[str] = []
        typed.problems(cls, doc, "", out, strict=True)
        if out:
            raise ConfigError(f"{source}: not a plan this port writes: {'; '.join(out[:6])}"
                              + (f" (and {len(out) - 6} more)" if len(out) > 6 else "")
                              + "; plan it again with `port train RECIPE --dry-run`")
        return typed.build(cls, doc, strict=True)


def make_plan(recipe: Recipe, cfg: LlamaConfig, run_dir: str, resume: bool = False,
              calibration: calibrated.Calibration | None = None) -> TrainPlan:
    """The plan of a recipe: its :class:`~porting.train.plan.layout.Layout` is computed once and every part
    of the plan is derived from it. ``calibration``: a rehearsal's measured pieces, for the step estimate and
    the ranking of layouts (porting/train/plan/calibrated.py); without it the roofline (Ascend only)."""
    layout = sharding.layout_for(recipe, cfg)
    est = calibrated.estimate(recipe, cfg, layout, calibration)
    step_fn = (lambda r, c, lay: calibrated.predict(r, c, lay, calibration)) if calibration is not None else None
    choice = layout.choice
    mem = estimate_memory(cfg, recipe, zero_stage=choice.stage or None, layout=layout)
    usable = usable_hbm_gib(recipe)
    fits = mem.total <= usable
    b, multi, ascend = recipe.batching, recipe.world_size > 1, recipe.cluster.device == "ascend"
    tp, dp = recipe.parallel.tensor_parallel, recipe.data_parallel_size
    cols = tuple(sharding.collectives(recipe, cfg, choice, layout=layout))
    return TrainPlan(
        model=ModelShape(cfg.num_parameters(), cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size),
        device=recipe.cluster.device, nodes=recipe.cluster.nodes, devices_per_node=recipe.cluster.devices_per_node,
        world_size=recipe.world_size, data_parallel=dp, hardware=hardware.shape_line(recipe.cluster), tensor_parallel=tp,
        micro_batch_size=b.micro_batch_size, grad_accum_steps=b.grad_accum_steps, global_batch=recipe.global_batch_size,
        global_batch_formula=f"{b.micro_batch_size} micro x {b.grad_accum_steps} accum x {dp} DP",
        sharding=ShardingPlan.of(choice), collectives=cols,
        collective_bytes=sharding.bytes_summary(list(cols)), collective_convention=COLLECTIVE_CONVENTION,
        max_tokens_per_step=recipe.global_batch_size * recipe.data.max_seq_length,
        max_seq_length=recipe.data.max_seq_length, precision=recipe.precision.model_copy(deep=True),
        mixed_precision=mixed_precision(recipe), recompute=recipe.memory.recompute,
        optimizer_sharding=recipe.parallel.optimizer_sharding,
        comm_fusion=recipe.parallel.comm_fusion.model_copy(deep=True),
        gradient_allreduce=comm.fusion_plan(recipe, cfg, layout), launch=comm.launch_plan(recipe, layout) if multi else None,
        memory_gib_by_phase=mem, device_hbm_gib=recipe.cluster.device_hbm_gib, usable_hbm_gib=usable,
        margin_gib=round(usable - mem.total, 3), fits=fits,
        suggestions=() if fits else tuple(suggestions(cfg, recipe, usable)),
        proposals=roofline.proposals(recipe, cfg, step_fn) if not fits or ascend or step_fn else (),
        estimated_step=est, throughput=calibrated.throughput(recipe, cfg, est),
        links=roofline.links(recipe) if ascend else None,
        msrun_commands=tuple(msrun_commands(recipe, run_dir, resume)) if multi else (),
        warnings=tuple(plan_warnings(recipe, cfg, choice)), execution=execution.describe(recipe),
        host_memory=host_memory(recipe, cfg, mem.total),
        allowances=allowances(recipe, cfg, layout, plan_shapes(recipe), step_s=est.step_s if est else None),
        disk=disk_plan(recipe, cfg, layout), save_overhead=save_overhead(recipe, layout, est.step_s if est else None),
        training=lora_plan.describe(recipe, layout))


def mixed_precision(recipe: Recipe) -> str:
    """How the step treats the dtypes, in one line (step.AdamW / step._Update)."""
    p = recipe.precision
    if p.param_dtype == "float32":
        return (f"float32 parameters, {p.compute_dtype} compute; gradients all-reduced, clipped and applied in "
                "float32; AdamW states float32")
    shard = " (sharded with optimizer sharding)" if recipe.parallel.optimizer_sharding and recipe.world_size > 1 else ""
    scale = f"; loss scale {p.loss_scale.kind}" if p.compute_dtype == "float16" or p.loss_scale.kind != "none" else ""
    reduce = ("float32" if p.grad_reduce_dtype == "float32" else
              f"{p.param_dtype} (opt-in grad_reduce_dtype: param_dtype, like Megatron's --grad-reduce-in-bf16)")
    how = "reduce-scattered" if shard else "all-reduced"
    return (f"{p.param_dtype} parameters for compute, float32 master weights and AdamW states{shard}; gradients "
            f"accumulated and {how} in {reduce}, clipped in float32 and applied to the float32 masters{scale}")


def plan_warnings(recipe: Recipe, cfg: LlamaConfig, choice: ShardingChoice) -> list[str]:
    w = []
    if choice.enabled:
        w.append("parallel.optimizer_sharding: each data-parallel rank keeps the AdamW states (and fp32 masters of "
                 "bf16/fp16 parameters) of its flat shard; checkpoints need a filesystem shared by all nodes")
    if choice.reduce_scatter == sharding.EMULATED:
        w.append("parallel.optimizer_sharding on the CPU: MindSpore's CPU collectives have no working ReduceScatter (a "
                 "stub in MCCL, no CPU kernel), so the gradients are all-reduced and sliced (emulation: twice the wire "
                 "bytes of the Ascend path)")
    if recipe.data.max_seq_length > cfg.longest_sequence:   # dynamic NTK: max_position_embeddings x factor
        w.append(f"data.max_seq_length={recipe.data.max_seq_length} exceeds the model's longest sequence "
                 f"{cfg.longest_sequence} (max_position_embeddings={cfg.max_position_embeddings})")
    if recipe.cluster.device == "ascend" and recipe.precision.compute_dtype == "float16" \
            and recipe.precision.loss_scale.kind == "none":
        w.append("precision: float16 compute without loss scaling underflows gradients; set "
                 "precision.loss_scale.kind=dynamic (or auto)")
    if recipe.precision.compute_dtype == "bfloat16" and recipe.precision.loss_scale.kind == "dynamic":
        w.append("precision: a dynamic loss scale on bfloat16 skips real non-finite steps while it halves the "
                 "scale (16 times from 65536) before the run stops; Megatron-LM and MindFormers run bf16 "
                 "unscaled: set precision.loss_scale.kind=none (or auto)")
    return w


def plan_config(recipe: Recipe) -> tuple[LlamaConfig, list[str]]:
    """The architecture for a dry run: the checkpoint's config.json when it is here, else the zoo
    preset's copy of that config.json (a plan for a cluster whose checkpoint is not on this machine)."""

    notes = []
    if not Path(recipe.data.path).exists():   # a file, or a datasets directory
        notes.append(f"data.path {recipe.data.path} is not on this machine (needed to run, not to plan)")
    try:
        return LlamaConfig.from_hf(resolve_hf(recipe.model.source)), notes
    except UnknownModelError:
        name = presets.by_hf_repo(recipe.model.source) or recipe.model.source   # a repo id of a built-in size
        variant = presets.variant_of(recipe.model.source) if not presets.known(name) else None
        if not presets.known(name) and variant is None:
            raise
        notes.append(f"model.source {recipe.model.source}: checkpoint not in the local HF cache; planned with the "
                     + (f"zoo's copy of its config.json ({name})" if variant is None else
                        f"config.json of {variant} ({presets.get(variant)['hf_repo']}), the base it is a variant of; "
                        "its own config.json may differ (vocabulary, RoPE): plan again where the checkpoint is"))
        return presets.config(variant or name), notes


def plan_run(recipe: Recipe, run_dir: str, resume: bool, dry_run: bool,
             calibration: calibrated.Calibration | None = None) -> tuple[TrainPlan, LlamaConfig]:
    """The plan `port train` prints or runs, and the model config it was made from. A dry run plans for a
    cluster whose checkpoint may not be here (:func:`plan_config`: its notes become the plan's first warnings);
    a real run plans from the checkpoint's own config.json. A model tensor parallel cannot split is one line
    here, before any worker starts. ``calibration``: a rehearsal's measured pieces (:func:`make_plan`)."""
    if dry_run:
        cfg, notes = plan_config(recipe)
    else:
        cfg, notes = LlamaConfig.from_hf(resolve_hf(recipe.model.source)), []
    check_tensor_parallel(recipe, cfg, recipe.model.source)
    if cfg.dropout:   # the zoo's cell has no dropout: training would differ from the HF model it claims to be
        what = ", ".join(f"{k}={v:g}" for k, v in cfg.dropout)
        line = (f"model {recipe.model.source}: config.json asks for training dropout ({what}), which port's cell does "
                "not apply; set it to 0.0 in config.json (the released Llama, Mistral, Qwen and Phi-3 configs use 0.0) "
                "or train the model elsewhere")
        if not dry_run:
            raise RecipeError(line)
        notes.append(line)
    plan = make_plan(recipe, cfg, run_dir, resume, calibration=calibration)
    return dataclasses.replace(plan, warnings=tuple(notes) + plan.warnings), cfg


def check_tensor_parallel(recipe: Recipe, cfg: LlamaConfig, model_dir: Path | str) -> None:
    """One RecipeError naming ``parallel.tensor_parallel`` when the model or the recipe cannot be split."""
    tp = recipe.parallel.tensor_parallel
    if tp == 1:
        return
    bad = divisibility_problems(cfg, tp)
    if bad:
        raise RecipeError(f"parallel.tensor_parallel: {tp} does not divide the model's {', '.join(bad)} "
                          f"(model {model_dir}); pick a tensor_parallel that divides all of them")
    if recipe.cluster.devices_per_node % tp:
        raise RecipeError(f"parallel.tensor_parallel: {tp} does not divide cluster.devices_per_node="
                          f"{recipe.cluster.devices_per_node}; a tensor-parallel group must sit inside one node")
    if recipe.data.eval_split > 0:
        raise RecipeError(f"data.eval_split: {recipe.data.eval_split} with parallel.tensor_parallel: {tp}; "
                          "held-out scoring runs on rank 0 alone and needs the whole model: set data.eval_split: 0 "
                          "(score the HF export with `port eval`)")


def check_fits(plan: TrainPlan, where: str) -> None:
    check_host_memory(plan.host_memory, where)
    if plan.fits:
        return
    raise RecipeError(f"{where}: needs {plan.memory_gib_by_phase.total:.1f} GiB per device, more than the "
                      f"{plan.device_hbm_gib:.0f} GiB of HBM allows ({plan.usable_hbm_gib:g} GiB usable, the rest "
                      "kept by the runtime); change: " + "; ".join(plan.suggestions)
                      + ("; fastest working setting (estimate): " + roofline.proposal_line(plan.proposals[0])
                         if plan.proposals else "; no (TP, DP, sharding, recompute) setting fits these devices"))
