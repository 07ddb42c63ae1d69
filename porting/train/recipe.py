"""The training recipe: a strict, typed schema for `port train` YAML files.

Sections are kept apart (model, data, batching, optimizer, schedule, precision, memory, parallel,
cluster, checkpointing, logging, seed) and every model is ``extra="forbid"``: a typo such as
``batching.micro_batch_sise`` is refused with its key path. :func:`load_recipe` collects every
problem of a file (unknown keys, wrong types, missing files) into one :class:`RecipeError`.
The model architecture is never in a recipe: it comes from the checkpoint's ``config.json``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from model_zoo.errors import RecipeError

Dtype = Literal["float32", "bfloat16", "float16"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(_Section):
    source: str = Field(description="HF model directory or zoo name (stories260k, llama-7b, ...)")


class DataSection(_Section):
    path: str = Field(description="JSON/JSONL (text, Alpaca or chat-messages rows) or a .txt file")
    format: Literal["auto", "text", "alpaca", "chat"] = "auto"
    text_field: str = "text"
    separator: str = "<|endoftext|>"      # splits a .txt file into documents
    max_seq_length: int = Field(256, ge=8)
    long_text: Literal["truncate", "split"] = "truncate"   # split: plain text only, windows of max_seq_length
    add_bos: bool = True
    add_eos: bool = True
    on_bad_row: Literal["skip", "fail"] = "skip"
    prompt_template: str = "### Instruction:\n{instruction}\n\n### Response:\n"
    prompt_template_with_input: str = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
    shuffle: bool = True


class BucketingSection(_Section):
    enabled: bool = True
    boundaries: Optional[list[int]] = None   # padded lengths; None = chosen from the data
    max_shapes: int = Field(16, ge=1, le=256)
    pad_to_multiple_of: int = Field(8, ge=1)


class BatchingSection(_Section):
    micro_batch_size: int = Field(1, ge=1)
    grad_accum_steps: int = Field(1, ge=1)
    bucketing: BucketingSection = BucketingSection()


class OptimizerSection(_Section):
    name: Literal["adamw"] = "adamw"
    lr: float = Field(3e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: Optional[float] = Field(1.0, gt=0)   # global-norm clip; null disables


class ScheduleSection(_Section):
    max_steps: Optional[int] = Field(None, ge=1)   # None: epochs x steps per epoch
    epochs: int = Field(1, ge=1)
    warmup_steps: int = Field(0, ge=0)
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)


class LossScaleSection(_Section):
    kind: Literal["none", "static", "dynamic"] = "none"
    init: float = Field(65536.0, gt=0)
    factor: float = Field(2.0, gt=1)
    window: int = Field(1000, ge=1)


class PrecisionSection(_Section):
    param_dtype: Dtype = "float32"
    compute_dtype: Dtype = "float32"
    optimizer_dtype: Literal["float32"] = "float32"
    # Gradients all-reduced (and accumulated) in float32, or in the parameter dtype as Megatron does
    # without --accumulate-allreduce-grads-in-fp32 (half the gradient memory and traffic); see plan.py.
    grad_reduce_dtype: Literal["float32", "param_dtype"] = "float32"
    loss_scale: LossScaleSection = LossScaleSection()


class MemorySection(_Section):
    recompute: bool = False


class CommFusionSection(_Section):
    enabled: bool = True
    allreduce_mode: Literal["auto", "size", "index"] = "auto"
    allreduce_config: Optional[Any] = None   # MB for size, list of indices for index, None for auto


class ParallelSection(_Section):
    data_parallel: Optional[int] = Field(None, ge=1)   # None: nodes x devices_per_node
    optimizer_sharding: bool = False
    comm_fusion: CommFusionSection = CommFusionSection()


class ClusterSection(_Section):
    device: Literal["cpu", "ascend"] = "cpu"
    nodes: int = Field(1, ge=1)
    devices_per_node: int = Field(1, ge=1)
    device_hbm_gib: float = Field(64.0, gt=0)   # 910C: 64 GB HBM per die; each die is one device
    master_addr: str = "127.0.0.1"
    master_port: int = Field(8118, ge=1024, le=65535)
    rank_table_file: Optional[str] = None
    cluster_time_out: int = Field(600, ge=1)


class CheckpointingSection(_Section):
    every_steps: int = Field(0, ge=0)   # 0: only at the end
    keep_last: int = Field(2, ge=1)
    export_hf: bool = True


class LoggingSection(_Section):
    every_steps: int = Field(1, ge=1)


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
    seed: int = 0
    output_dir: str = "runs/train"

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        problems = [msg for check, msg in _cross_checks(self) if check]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ----------------------------------------------------------------- derived values
    @property
    def world_size(self) -> int:
        return self.cluster.nodes * self.cluster.devices_per_node

    @property
    def global_batch_size(self) -> int:
        return self.batching.micro_batch_size * self.batching.grad_accum_steps * self.world_size


def _cross_checks(r: Recipe) -> list[tuple[bool, str]]:
    """(is it a problem, message) for rules that span sections; all are reported together."""
    world = r.cluster.nodes * r.cluster.devices_per_node
    return [
        (r.parallel.data_parallel is not None and r.parallel.data_parallel != world,
         f"parallel.data_parallel: {r.parallel.data_parallel} but cluster.nodes x cluster.devices_per_node = "
         f"{world}; only data parallel is supported, so they must be equal (or leave data_parallel out)"),
        (r.cluster.device == "cpu" and (r.precision.param_dtype != "float32" or r.precision.compute_dtype != "float32"),
         "precision: the CPU trains in float32 only; set precision.param_dtype and precision.compute_dtype to "
         "float32, or cluster.device to ascend"),
        (r.data.long_text == "split" and r.data.format in ("alpaca", "chat"),
         "data.long_text: split applies to plain text only; use truncate for instruction data"),
        (r.parallel.comm_fusion.allreduce_mode == "size" and not isinstance(r.parallel.comm_fusion.allreduce_config, (int, float)),
         "parallel.comm_fusion.allreduce_config: allreduce_mode=size needs a size in MB, e.g. 64"),
        (r.parallel.comm_fusion.allreduce_mode == "index" and not isinstance(r.parallel.comm_fusion.allreduce_config, list),
         "parallel.comm_fusion.allreduce_config: allreduce_mode=index needs a list of parameter indices"),
    ]


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


def parse_value(text: str) -> Any:
    """A --set value: YAML scalar/list syntax (3e-4, true, [1, 2], null), else the string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


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
        for p in parts[:-1]:
            if not isinstance(node.get(p, {}), dict):
                bad.append(f"--set {key}: {p} is not a section")
                break
            node = node.setdefault(p, {})
        else:
            node[parts[-1]] = parse_value(value)
    if bad:
        raise RecipeError("; ".join(bad))
    return out


def _file_problems(recipe: Recipe, base: Path) -> list[str]:
    """Files a recipe names that do not exist (zoo names are resolved later, by porting.sources)."""
    problems = []
    data = resolve_path(recipe.data.path, base)
    if not data.is_file():
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
            if isinstance(dp, str) and not resolve_path(dp, base or Path(".")).is_file():
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
    if not p.is_file():
        raise RecipeError(f"{p}: recipe file not found; see recipes/ for examples (recipes/tiny-cpu.yaml)")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{p}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    raw = apply_overrides(raw or {}, overrides or [])
    recipe = validate_recipe(raw, str(p), p.parent.resolve(), check_files)
    # Make data/model paths absolute so workers started elsewhere (msrun) read the same files.
    data_path = resolve_path(recipe.data.path, p.parent.resolve())
    recipe.data.path = str(data_path.resolve()) if data_path.exists() else recipe.data.path
    src = resolve_path(recipe.model.source, p.parent.resolve())
    if src.exists():
        recipe.model.source = str(src.resolve())
    return recipe


def recipe_dict(recipe: Recipe) -> dict:
    return recipe.model_dump(mode="json")
