"""The training recipe: a strict, typed schema for `port train` YAML files.

Sections are kept apart (model, data, batching, optimizer, schedule, precision, memory, parallel,
cluster, checkpointing, logging, nonfinite, seed) and every model is ``extra="forbid"``: a typo such as
``batching.micro_batch_sise`` is refused with its key path. :func:`load_recipe` collects every
problem of a file (unknown keys, wrong types, missing files) into one :class:`RecipeError`.
The model architecture is never in a recipe: it comes from the checkpoint's ``config.json``.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional

from pydantic import Field, ValidationError, field_validator, model_validator

from model_zoo.errors import RecipeError
from model_zoo.files import read_text
from porting.train.recipe.checks import Section, template_problem
from porting.train.recipe.hardware import MasterAddr, ascend_shapes, ascend_shapes_problem, derive_cluster
from porting.train.recipe.lora import LoraSection
from porting.train.recipe.nonfinite import NonfiniteSection
from porting.train.recipe.yaml_bounded import load_yaml, parse_value

Dtype = Literal["float32", "bfloat16", "float16"]

# Every number in a recipe has a finite, documented range (docs/promises.md lists them): a value out of
# range is refused with its key before a step runs, because an infinite lr or a beta of 1 trains "fine"
# and exports NaN weights. Bounds are generous (far past any real run) but finite.
BIG = 10 ** 9          # steps, epochs, intervals: more than any run will take
MAX_BATCH = 1 << 16    # micro batch, accumulation
MAX_SEQ = 1 << 20      # tokens per sequence (1M)
MAX_TEXT = 1 << 16     # characters in a template or separator
MAX_RECIPE_BYTES = 1 << 20
TEMPLATE_FIELDS = {"prompt_template": {"instruction"}, "prompt_template_with_input": {"instruction", "input"}}


_Section = Section   # recipe/checks.py: the base of every section


class ModelSection(_Section):
    source: str = Field(description="HF model directory or zoo name (stories260k, llama-7b, ...)")


class SharegptSection(_Section):
    messages_key: str = "conversations"
    role_key: str = "from"
    content_key: str = "value"
    system_key: Optional[str] = "system"
    roles: dict[str, Literal["system", "user", "assistant", "tool"]] = {}   # added to human/gpt/observation/...


class DataSection(_Section):
    path: str = Field(description="JSON/JSONL (text, Alpaca, chat-messages or ShareGPT rows), a .txt or "
                                  ".parquet file, or a HF datasets directory (save_to_disk); see docs/data.md")
    format: Literal["auto", "text", "alpaca", "chat", "sharegpt"] = "auto"
    chat_template: str = Field("auto", min_length=1, max_length=4096)  # auto | model[:NAME] | builtin | a Jinja file (docs/data.md)
    enable_thinking: Optional[bool] = None   # the template's switch, as apply_chat_template passes it (docs/data.md)
    sharegpt: SharegptSection = SharegptSection()
    split: str = Field("train", min_length=1, max_length=256)  # the split of a datasets directory holding several
    eval_split: float = Field(0.0, ge=0, lt=1)   # fraction of examples held out, scored by `port train`
    eval_every_steps: int = Field(0, ge=0, le=BIG)  # 0: only after the last step
    text_field: str = Field("text", min_length=1, max_length=256)
    separator: str = Field("<|endoftext|>", max_length=MAX_TEXT)      # splits a .txt file into documents
    max_seq_length: int = Field(256, ge=8, le=MAX_SEQ)
    long_text: Literal["truncate", "split"] = "truncate"   # split: plain text only, windows of max_seq_length
    add_bos: bool = True
    add_eos: bool = True
    on_bad_row: Literal["skip", "fail"] = "skip"
    # str.format templates: only {instruction} (and {input} in the second) may appear; {{ }} for braces
    prompt_template: str = Field("### Instruction:\n{instruction}\n\n### Response:\n", max_length=MAX_TEXT)
    prompt_template_with_input: str = Field(
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n", max_length=MAX_TEXT)
    shuffle: bool = True

    @field_validator("prompt_template", "prompt_template_with_input")
    @classmethod
    def _template_fields(cls, v: str, info) -> str:
        problem = template_problem(v, TEMPLATE_FIELDS[info.field_name])
        if problem:
            raise ValueError(problem)
        return v


class BucketingSection(_Section):
    enabled: bool = True
    boundaries: Optional[list[Annotated[int, Field(ge=1, le=MAX_SEQ)]]] = Field(None, max_length=256)
    # padded lengths; None = chosen from the data. max_shapes: 16, or ASCEND_MAX_SHAPES on Ascend (hardware.py)
    max_shapes: int = Field(16, ge=1, le=256)
    pad_to_multiple_of: int = Field(8, ge=1, le=4096)


class BatchingSection(_Section):
    micro_batch_size: int = Field(1, ge=1, le=MAX_BATCH)
    grad_accum_steps: int = Field(1, ge=1, le=MAX_BATCH)
    bucketing: BucketingSection = BucketingSection()
    # Pack examples into rows of data.max_seq_length (per-example positions and attention; data.py)
    # instead of padding them to bucket lengths.
    packing: bool = False

    @model_validator(mode="after")
    def _packing_or_boundaries(self) -> "BatchingSection":
        if self.packing and self.bucketing.boundaries:
            raise ValueError("batching.packing: true makes every row data.max_seq_length long, so "
                             "batching.bucketing.boundaries has no use; remove one of the two")
        return self


class OptimizerSection(_Section):
    name: Literal["adamw"] = "adamw"
    # finite, (0, 1e30]: useful values are <= 1e-2; a larger one diverges and the non-finite-loss guard
    # stops the run (exit 3), which is how the tests provoke a divergence (lr=1e30)
    lr: float = Field(3e-4, gt=0, le=1e30)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=10.0)  # decoupled: each step shrinks weights by lr*wd
    grad_clip: Optional[float] = Field(1.0, gt=0, le=1e6)   # global-norm clip; null disables


class ScheduleSection(_Section):
    max_steps: Optional[int] = Field(None, ge=1, le=BIG)   # None: epochs x steps per epoch
    epochs: int = Field(1, ge=1, le=1_000_000)
    warmup_steps: int = Field(0, ge=0, le=BIG)
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)


class LossScaleSection(_Section):
    # auto: dynamic for float16 compute, none for bfloat16 and float32, as Megatron-LM builds its grad scaler
    # (megatron/core/optimizer/__init__.py: a DynamicGradScaler only for fp16 without --loss-scale; bf16
    # "with no loss-scale so leave it as None") and MindFormers' bf16 Llama-2-13B fine-tune runs
    # (configs/llama2/finetune_llama2_13b_bf16.yaml: scale_sense 1, enable_check_overflow False).
    kind: Literal["auto", "none", "static", "dynamic"] = "auto"
    init: float = Field(65536.0, gt=0, le=2.0 ** 32)
    factor: float = Field(2.0, gt=1, le=1024.0)
    window: int = Field(1000, ge=1, le=BIG)


class PrecisionSection(_Section):
    param_dtype: Dtype = "float32"
    compute_dtype: Dtype = "float32"
    optimizer_dtype: Literal["float32"] = "float32"
    # Gradients accumulated, all-reduced and clipped in float32: Megatron-LM forces this for bf16
    # (megatron/training/arguments.py: "bfloat16 requires gradient accumulation and all-reduce to be done
    # in fp32") unless --grad-reduce-in-bf16 is asked for. `param_dtype` is that opt-in (half the gradient
    # memory and traffic, at the cost of bf16 rounding in the sums); the plan names it when chosen.
    grad_reduce_dtype: Literal["float32", "param_dtype"] = "float32"
    loss_scale: LossScaleSection = LossScaleSection()

    @model_validator(mode="after")
    def _resolve_loss_scale(self) -> "PrecisionSection":
        if self.loss_scale.kind == "auto":   # resolved once, so the manifest and the plan show what runs
            kind = "dynamic" if self.compute_dtype == "float16" else "none"
            self.loss_scale = self.loss_scale.model_copy(update={"kind": kind})
        return self


class MemorySection(_Section):
    recompute: bool = False


class CommFusionSection(_Section):
    enabled: bool = True
    allreduce_mode: Literal["auto", "size", "index"] = "auto"
    allreduce_config: Optional[Any] = None   # MB for size, list of indices for index, None for auto


class ParallelSection(_Section):
    data_parallel: Optional[int] = Field(None, ge=1, le=1 << 18)   # None: world size / tensor_parallel
    tensor_parallel: int = Field(1, ge=1, le=64)   # Megatron-style, within a node; devices = data x tensor
    optimizer_sharding: bool = False   # ZeRO: flat per-rank shards of fp32 masters and AdamW states (docs/parallel.md)
    # with grad_accum_steps > 1: 1 accumulates full gradients then reduce-scatters once, 2 reduce-scatters every
    # micro-step into sharded accumulators (ZeRO-2); auto: what the plan shows (porting/train/plan/sharding.py)
    zero_stage: Literal["auto", 1, 2] = "auto"
    comm_fusion: CommFusionSection = CommFusionSection()


class ClusterSection(_Section):
    device: Literal["cpu", "ascend"] = "cpu"
    nodes: int = Field(1, ge=1, le=4096)
    # hardware shape (porting/train/recipe/hardware.py): a server preset, or chips x dies; devices_per_node derived
    server: Optional[Literal["atlas-800t-a3", "atlas-800t-a2"]] = None
    chips_per_node: Optional[int] = Field(None, ge=1, le=64)
    dies_per_chip: Optional[int] = Field(None, ge=1, le=4)    # 910C: 2 dies, each one device (rank)
    devices_per_node: int = Field(1, ge=1, le=64)             # devices = dies, as software sees them
    device_hbm_gib: float = Field(64.0, gt=0, le=4096.0)   # 910C: 64 GB HBM per die; each die is one device
    master_addr: MasterAddr = "127.0.0.1"   # an IP address or host name (hardware.address_problem)
    master_port: int = Field(8118, ge=1024, le=65535)
    rank_table_file: Optional[str] = None
    cluster_time_out: int = Field(600, ge=1, le=86_400)   # seconds; a day at most
    # links per die for the step-time estimate (porting/train/plan/roofline.py): servers of one SuperPoD are joined
    # by HCCS, others by RoCE; a measured figure (GB/s per die) replaces the documented one
    superpod: bool = False
    intra_node_gb_s: Optional[float] = Field(None, gt=0, le=10_000)
    inter_node_gb_s: Optional[float] = Field(None, gt=0, le=10_000)
    host_memory_gib: Optional[float] = Field(None, gt=0, le=65536.0)   # host RAM per node; the dry run refuses more (host_memory.py)
    compile_cache: Optional[bool] = None   # None (auto): on for the CPU, off on Ascend (run/step/precompile.py)


class CheckpointingSection(_Section):
    every_steps: int = Field(0, ge=0, le=BIG)   # 0: only at the end
    keep_last: int = Field(2, ge=1, le=1_000_000)
    export_hf: bool = True
    fs_gib_per_s: float = Field(0.3, gt=0, le=1000.0)   # aggregate, all ranks share it (plan/comm.py save_seconds)


class LoggingSection(_Section):
    every_steps: int = Field(1, ge=1, le=BIG)
    tensorboard: bool = False             # event files under <run>/tensorboard (porting/train/run/watch.py)
    wandb: bool = False                   # needs the wandb package
    wandb_project: str = Field("port", min_length=1, max_length=128)
    wandb_mode: Literal["offline", "online"] = "offline"
    progress: Literal["auto", "bar", "lines"] = "auto"   # auto: a bar with ETA when stderr is a terminal
    comm_sample_every: int = Field(10, ge=0, le=BIG)  # communication wait measured every N steps (0: never); porting/train/run/step/commwait.py
    # where each rank's step time goes (compute / exposed communication / host / idle), every N-th step, at most 8
    # steps a run; a device sync around each cell and a profiler analysis (~1 s on a CPU) a step (step/breakdown.py)
    breakdown_every: int = Field(0, ge=0, le=BIG)
    breakdown_source: Literal["profiler", "timestamps"] = "profiler"   # timestamps: no profiler, no comm split
    fingerprint_every: int = Field(0, ge=0, le=BIG)   # port diverge's records every N steps, 0: never (docs/diverge.md)


class Recipe(_Section):
    model: ModelSection
    data: DataSection
    batching: BatchingSection = BatchingSection()
    optimizer: OptimizerSection = OptimizerSection()
    schedule: ScheduleSection = ScheduleSection()
    precision: PrecisionSection = PrecisionSection()
    memory: MemorySection = MemorySection()
    parallel: ParallelSection = ParallelSection()
    cluster: ClusterSection = ClusterSection()
    checkpointing: CheckpointingSection = CheckpointingSection()
    logging: LoggingSection = LoggingSection()
    nonfinite: NonfiniteSection = NonfiniteSection()   # non-finite steps: skip caps (recipe/nonfinite.py)
    lora: Optional[LoraSection] = None   # LoRA adapters on a frozen base (recipe/lora.py); absent: full fine-tuning
    seed: int = Field(0, ge=0, le=2 ** 32 - 1)   # numpy and MindSpore seeds are 32-bit
    output_dir: str = "runs/train"
    execution: Literal["graph", "pynative"] = "graph"   # MindSpore mode of the step (porting/train/run/step/execution.py)
    determinism: Literal["default", "bitwise"] = "default"   # bitwise: the same bits every launch (train/recipe/determinism.py)

    @model_validator(mode="before")
    @classmethod
    def _hardware(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            raw = {**raw, "cluster": derive_cluster(raw.get("cluster", {}))}
            raw = ascend_shapes(raw)
        return raw

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        problems = [msg for check, msg in _cross_checks(self) if check]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ----------------------------------------------------------------- derived values
    def with_overrides(self, values: Mapping[str, Any]) -> "Recipe":
        """A variant of this recipe, validated again: ``{"section.key": value}`` set on its dump. The one
        way the planner's remedies and proposals and the dry run's padding make a variant."""
        raw = self.model_dump(mode="json")
        for key, value in values.items():
            node = raw
            *sections, last = key.split(".")
            for part in sections:
                node = node[part]
            node[last] = value
        return type(self).model_validate(raw)

    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.devices_per_node

    @property
    def data_parallel_size(self) -> int:
        """Ranks holding different micro-batches: the world size over the tensor-parallel size."""
        return self.world_size // self.parallel.tensor_parallel

    @property
    def global_batch_size(self) -> int:
        return self.batching.micro_batch_size * self.batching.grad_accum_steps * self.data_parallel_size


def _cross_checks(r: Recipe) -> list[tuple[bool, str]]:
    """(is it a problem, message) for rules that span sections; all are reported together."""
    world = r.cluster.nodes * r.cluster.devices_per_node
    return [
        (world % r.parallel.tensor_parallel != 0,
         f"parallel.tensor_parallel: {r.parallel.tensor_parallel} does not divide the {world} devices "
         "(cluster.nodes x cluster.devices_per_node); pick a divisor"),
        (r.parallel.tensor_parallel > r.cluster.devices_per_node,
         f"parallel.tensor_parallel: {r.parallel.tensor_parallel} is more than cluster.devices_per_node="
         f"{r.cluster.devices_per_node}; tensor parallel stays inside a node (its all-reduces need the intra-node links)"),
        (r.parallel.data_parallel is not None and r.parallel.data_parallel * r.parallel.tensor_parallel != world,
         f"parallel.data_parallel: {r.parallel.data_parallel} x parallel.tensor_parallel: {r.parallel.tensor_parallel} "
         f"must equal cluster.nodes x cluster.devices_per_node = {world} (or leave data_parallel out)"),
        (r.cluster.device == "cpu" and (r.precision.param_dtype != "float32" or r.precision.compute_dtype != "float32"),
         "precision: the CPU trains in float32 only; set precision.param_dtype and precision.compute_dtype to "
         "float32, or cluster.device to ascend"),
        (r.data.long_text == "split" and r.data.format in ("alpaca", "chat", "sharegpt"),
         "data.long_text: split applies to plain text only; use truncate for instruction data"),
        (r.parallel.comm_fusion.allreduce_mode == "size" and not _in_range(r.parallel.comm_fusion.allreduce_config, 0, 1e6),
         "parallel.comm_fusion.allreduce_config: allreduce_mode=size needs a size in MB in (0, 1e6], e.g. 64"),
        (r.parallel.comm_fusion.allreduce_mode == "index" and not (
            isinstance(r.parallel.comm_fusion.allreduce_config, list)
            and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < BIG
                    for i in r.parallel.comm_fusion.allreduce_config)),
         "parallel.comm_fusion.allreduce_config: allreduce_mode=index needs a list of parameter indices (integers >= 0)"),
        (bool(ascend_shapes_problem(r)), ascend_shapes_problem(r)),
        (r.schedule.max_steps is not None and r.schedule.warmup_steps > r.schedule.max_steps,
         f"schedule.warmup_steps: {r.schedule.warmup_steps} is more than schedule.max_steps={r.schedule.max_steps}; "
         "the learning rate would never reach optimizer.lr"),
    ]


def _in_range(v: Any, lo: float, hi: float) -> bool:
    """A finite number (not a bool) in (lo, hi]."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo < v <= hi


# --------------------------------------------------------------------- loading and overrides
def _loc(err: dict) -> str:
    return ".".join(str(p) for p in err["loc"]) or "<recipe>"


def _format_errors(where: str, exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        msg = e["msg"]
        if e["type"] == "value_error" and not e["loc"]:
            parts.append(msg.removeprefix("Value error, "))
            continue
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see docs/training.md for the schema)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        loc = _loc(e)
        parts.append(f"{loc}: {msg}" + (f" (got {e['input']!r})" if e["type"] not in ("missing", "extra_forbidden")
                                        and not isinstance(e.get("input"), dict) else ""))
    return f"{where}: {len(parts)} problem(s): " + "; ".join(parts)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """``key.path=value`` overrides applied to a raw recipe dict (a new dict is returned)."""
    out = copy.deepcopy(raw)
    bad = []
    for item in overrides:
        if "=" not in item:
            bad.append(f"--set {item!r}: expected key.path=value, e.g. --set batching.micro_batch_size=2")
            continue
        key, value = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        if not all(p.strip() and p.strip() == p for p in parts):
            bad.append(f"--set {item!r}: the key path {key.strip()!r} has an empty part; expected "
                       "section.key=value, e.g. --set optimizer.lr=1e-4")
            continue
        for p in parts[:-1]:
            if not isinstance(node.get(p, {}), dict):
                bad.append(f"--set {key}: {p} is not a section")
                break
            node = node.setdefault(p, {})
        else:
            node[parts[-1]] = parse_value(value, f"--set {key.strip()}")
    if bad:
        raise RecipeError("; ".join(bad))
    return out


def _file_problems(recipe: Recipe, base: Path) -> list[str]:
    """Files a recipe names that do not exist (zoo names are resolved later, by porting.model_paths)."""
    problems = []
    data = resolve_path(recipe.data.path, base)
    if not (data.is_file() or data.is_dir()):
        problems.append(f"data.path: file not found: {data}")
    src = recipe.model.source
    if ("/" in src or src.startswith(".")) and not resolve_path(src, base).is_dir():
        problems.append(f"model.source: directory not found: {resolve_path(src, base)}")
    if recipe.cluster.rank_table_file and not resolve_path(recipe.cluster.rank_table_file, base).is_file():
        problems.append(f"cluster.rank_table_file: file not found: {recipe.cluster.rank_table_file}")
    return problems


def resolve_path(p: str, base: Path) -> Path:
    """Relative recipe paths are tried from the current directory, then from the recipe's folder."""
    path = Path(p).expanduser()
    if path.is_absolute() or path.exists():
        return path
    alt = base / path
    return alt if alt.exists() else path


def validate_recipe(raw: Any, where: str = "<recipe>", base: Path | None = None,
                    check_files: bool = True) -> Recipe:
    """A validated :class:`Recipe` from a raw dict; every problem (schema and files) in one error."""
    if not isinstance(raw, dict):
        raise RecipeError(f"{where}: expected a YAML mapping with sections model, data, ...; got {type(raw).__name__}")
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        msg = _format_errors(where, exc)
        # Missing files are reported with the schema errors, when the path itself parsed.
        extra = []
        if check_files:
            dp = (raw.get("data") or {}).get("path") if isinstance(raw.get("data"), dict) else None
            if isinstance(dp, str) and not resolve_path(dp, base or Path(".")).exists():
                extra.append(f"data.path: file not found: {dp}")
        raise RecipeError(msg + ("; " + "; ".join(extra) if extra else "")) from None
    if check_files:
        problems = _file_problems(recipe, base or Path("."))
        if problems:
            raise RecipeError(f"{where}: {len(problems)} problem(s): " + "; ".join(problems))
    return recipe


def load_recipe(path: str | Path, overrides: list[str] | None = None, check_files: bool = True) -> Recipe:
    """Read, override (``--set``) and validate a recipe YAML file."""
    p = Path(path)
    if not p.exists():
        raise RecipeError(f"{p}: recipe file not found; see recipes/ for examples (recipes/tiny-cpu.yaml)")
    raw = load_yaml(read_text(p, what="recipe", max_bytes=MAX_RECIPE_BYTES, error=RecipeError), str(p))
    if raw is not None and not isinstance(raw, dict):
        raise RecipeError(f"{p}: expected a YAML mapping with sections model, data, ...; got {type(raw).__name__}")
    raw = apply_overrides(raw or {}, overrides or [])
    recipe = validate_recipe(raw, str(p), p.parent.resolve(), check_files)
    # Make data/model paths absolute so workers started elsewhere (msrun) read the same files.
    named = recipe.data.chat_template.partition(":")[0] in ("auto", "model", "builtin")   # else a Jinja file
    fields = [(recipe.data, "path"), (recipe.model, "source")] + ([] if named else [(recipe.data, "chat_template")]) + (
        [(recipe.lora, "init_from")] if recipe.lora is not None and recipe.lora.init_from else [])   # a PEFT folder
    for section, key in fields:
        found = resolve_path(getattr(section, key), p.parent.resolve())
        setattr(section, key, str(found.resolve()) if found.exists() else getattr(section, key))
    return recipe


def recipe_dict(recipe: Recipe) -> dict:
    return recipe.model_dump(mode="json")
