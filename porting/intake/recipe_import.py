"""`port recipe import CONFIG...`: a CUDA job's configs (HF TrainingArguments as JSON/YAML or
``training_args.bin``, DeepSpeed JSON, accelerate YAML, LLaMA-Factory YAML) as one port recipe.

Every key of every file is either mapped (the row names the recipe key it became) or refused with the
reason (porting/intake/config_keys.py). The job's global batch (micro x accumulation x GPUs) is kept and
re-derived for the target cluster: micro-batch 1 (MindSpeed-LLM's and port's default on Ascend) x
accumulation x data parallel, with tensor parallel absorbing devices the batch cannot use; then the
recipe is planned exactly as ``port train --dry-run`` plans it, with optimizer sharding and recompute
turned on only when the plan does not fit otherwise. A recipe that would not plan is not written.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from model_zoo import files
from model_zoo.errors import PortingError, one_line
from porting.intake import IntakeError, config_keys as K, lora_keys
from porting.intake.typed import name as shown_name, shown, typed
from porting.train import check_tensor_parallel, make_plan, plan_config, validate_recipe
from porting.train.recipe.hardware import SERVERS
from porting.train.recipe.yaml_bounded import load_yaml
from porting.intake.pickle_reader import read_training_args_bin

MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 16
DEFAULT_DATA = "data/train.jsonl"


@dataclass
class Target:
    cluster: str = "atlas-800t-a3"
    nodes: int = 1
    model: str | None = None         # overrides model_name_or_path
    data: str | None = None          # the data file (LLaMA-Factory's dataset names are registry entries)
    source_gpus: int | None = None   # the CUDA job's GPUs when no config says


@dataclass
class Job:
    """What the CUDA job did (job fields), where each came from, and the per-key rows."""

    fields: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def row(self, file: str, key: str, value: Any, status: str, **extra: Any) -> None:
        self.rows.append({"file": file, "key": key, "value": _short(value), "status": status, **extra})

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


def _short(v: Any) -> Any:
    """A config value as the mapping file records it: plain JSON (a finite number, a short string), else
    its escaped text (a NaN, a 5,000-digit integer, a date or a nested section never breaks the JSON)."""
    if v is None or isinstance(v, bool) or (isinstance(v, float) and math.isfinite(v)) or (
            isinstance(v, int) and v.bit_length() <= 128 or isinstance(v, str) and len(v) < 120):
        return v
    return shown(v, 120)


def comment(text: str) -> str:
    """``text`` folded into one comment line of the YAML port writes: a newline (or any character that
    breaks a line in YAML: \\r, \\x85, \\u2028) from a config value is shown escaped, so it cannot end the
    comment and inject recipe keys."""
    return "# " + one_line(text) + "\n"


# ----------------------------------------------------------------------------------------- reading
def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _check_names(doc: dict, where: str) -> None:
    """Every key of every section is a setting name (a string): a YAML date, number or null as a key is one
    line, never a crash in the key table."""
    stack = [(doc, "")]
    while stack:
        d, prefix = stack.pop()
        for k, v in d.items():
            if not isinstance(k, str):
                raise IntakeError(f"{where}: {prefix}key {shown(k)}: expected a setting name (a string); fix the key "
                                  "in the file")
            if isinstance(v, dict):
                stack.append((v, f"{prefix}{shown_name(k)}."))


def read_config(path: str | Path) -> tuple[str, dict[str, Any]]:
    """(kind, keys) of one config file; nested DeepSpeed/accelerate sections become dotted keys."""
    p = Path(path)
    if p.suffix == ".bin":
        return "hf-training-args", read_training_args_bin(p)
    text = files.read_text(p, what="config", max_bytes=MAX_CONFIG_BYTES, error=IntakeError)
    if p.suffix == ".json":
        doc = files.parse_json(text, where=shown_name(p), what="config", max_depth=MAX_CONFIG_DEPTH, error=IntakeError)
    elif p.suffix in (".yaml", ".yml"):
        doc = load_yaml(text, shown_name(p), what="config", error=IntakeError,
                        hint="a training config is a small mapping; write it out without deep nesting or aliases")
    else:
        raise IntakeError(f"{p}: unknown config type; expected training_args.bin, a .json (TrainingArguments or DeepSpeed) "
                          "or a .yaml (LLaMA-Factory, accelerate or TrainingArguments)")
    if not isinstance(doc, dict):
        raise IntakeError(f"{p}: top level is {type(doc).__name__}, expected a mapping of settings")
    _check_names(doc, shown_name(p))
    if any(k in doc for k in ("zero_optimization", "train_micro_batch_size_per_gpu", "zero_allow_untested_optimizer")):
        return "deepspeed", _flatten(doc)
    if any(k in doc for k in ("compute_environment", "distributed_type", "num_processes")):
        return "accelerate", _flatten(doc)
    kind = ("peft-adapter" if p.name == "adapter_config.json" or "peft_type" in doc else   # lora_keys.py
            "ms-swift" if any(k in doc for k in ("train_type", "tuner_type", "sft_type")) else
            "llamafactory" if any(k in doc for k in ("finetuning_type", "stage", "cutoff_len", "template")) else None)
    if kind is not None:
        return kind, doc
    if any(k in doc for k in ("per_device_train_batch_size", "learning_rate", "output_dir")):
        return "hf-training-args", doc
    raise IntakeError(f"{p}: not a training config port knows (no per_device_train_batch_size, zero_optimization, "
                      "distributed_type or finetuning_type key)")


# ----------------------------------------------------------------------------------------- one key
def take(job: Job, file: str, key: str, value: Any) -> None:
    """Map or refuse one key of one file."""
    acc = {"deepspeed_config.zero_stage": "zero_optimization.stage",
           "deepspeed_config.gradient_accumulation_steps": "gradient_accumulation_steps",
           "deepspeed_config.gradient_clipping": "gradient_clipping",
           "deepspeed_config.offload_optimizer_device": "zero_optimization.offload_optimizer.device",
           "deepspeed_config.offload_param_device": "zero_optimization.offload_param.device"}
    key_n = acc.get(key, key)
    special = K.special_refusal(key_n, value)
    if special is not None:
        reason, blocking = special
        job.row(file, key, value, "refused", reason=reason, blocking=blocking)
        return
    name = K.FIELDS.get(key_n)
    if name is None:
        reason = K.no_effect_reason(key_n) or "not a setting port's importer knows; check docs/intake.md and set it by hand if it matters"
        job.row(file, key, value, "refused", reason=reason, blocking=False)
        return
    if value == "auto":
        job.row(file, key, value, "mapped", recipe_key=K.FIELD_TARGET[name], note="auto: taken from the other configs")
        return
    value = typed(value, K.TYPES[name], shown_name(file), key)
    if name in job.fields and job.fields[name] != value and value is not None:
        job.row(file, key, value, "refused", blocking=False,
                reason=f"conflicts with {job.origin[name]} = {job.fields[name]!r}, which is kept")
        return
    if value is not None:
        job.fields.setdefault(name, value)
        job.origin.setdefault(name, f"{file}:{key}")
    job.row(file, key, value, "mapped", recipe_key=K.FIELD_TARGET[name])


def _refine(job: Job) -> None:
    """Refusals that depend on a value: optimizer, scheduler, stage, finetuning type, ZeRO-3, epochs."""
    checks = {
        "optim": lambda v: str(v).lower() not in K.ADAMW and f"optimizer {v}: port has AdamW only (torch semantics)",
        "scheduler": lambda v: str(v) not in K.SCHEDULERS and f"learning-rate schedule {v}: port has cosine, linear and constant",
        "stage": lambda v: str(v) not in ("sft", "pt") and f"stage {v}: port fine-tunes causal LMs on text/instructions (sft, pt)",
        "finetuning_type": lambda v: str(v) != "full" and not lora_keys.is_lora(v) and (
            f"finetuning_type {v}: port trains every weight (full) or LoRA adapters (lora)"),
        "epochs": lambda v: float(v) != int(float(v)) and f"num_train_epochs {v}: port runs whole epochs; set schedule.max_steps",
        "zero_stage": lambda v: str(v) == "3" and ("ZeRO-3 parameter partitioning: port shards optimizer states and fp32 masters "
                                                   "(ZeRO-1/2) and splits layers with tensor parallel; the recipe uses "
                                                   "optimizer sharding and the plan says what fits"),
    }
    for name, check in checks.items():
        if name in job.fields and (why := check(job.fields[name])):
            origin = job.origin[name]
            for r in job.rows:
                if f"{r['file']}:{r['key']}" == origin:
                    r.update(status="refused", reason=why, blocking=name != "zero_stage")
                    r.pop("recipe_key", None)


# ----------------------------------------------------------------------------------------- the recipe
def _global_batch(job: Job, target: Target) -> tuple[int, str]:
    micro, accum = int(job.get("micro_batch") or 1), int(job.get("grad_accum") or 1)
    explicit = job.get("source_global_batch")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        return explicit, f"train_batch_size {explicit}"
    gpus = target.source_gpus or job.get("source_gpus")
    if gpus is None:
        gpus = int(job.get("gpus_per_process") or 1)
        job.notes.append(f"the CUDA job's GPU count is in none of the configs; assumed {gpus} (pass --source-gpus N)")
    return micro * accum * int(gpus), f"{micro} micro x {accum} accumulation x {gpus} GPUs"


def _model(job: Job, target: Target) -> str:
    from model_zoo import families, presets

    src = target.model or job.get("model")
    if not src:
        raise IntakeError("no model in the configs (model_name_or_path); pass --model DIR|ZOO_NAME")
    for name in presets.names():
        repo = presets.get(name).get("hf_repo")
        if repo and str(src).lower() == repo.lower():
            job.notes.append(f"model {src}: the zoo's {name}")
            return name
    if not Path(str(src)).expanduser().exists():
        families.check_repo_id(str(src))   # a well-known MoE / hybrid / other-attention model: one line
    return str(src)


def _schedule(job: Job) -> dict[str, Any]:
    decay, floor = K.SCHEDULERS.get(str(job.get("scheduler", "linear")), ("linear", 0.0))
    out: dict[str, Any] = {"decay": decay, "min_lr_ratio": floor}
    max_steps = job.get("max_steps")
    if isinstance(max_steps, int) and max_steps > 0:
        out["max_steps"] = max_steps
    out["epochs"] = max(1, int(float(job.get("epochs", 1))))
    warm, ratio = job.get("warmup_steps") or 0, job.get("warmup_ratio") or 0
    if warm:
        out["warmup_steps"] = int(warm)
    elif ratio:
        if "max_steps" in out:   # transformers: math.ceil(num_training_steps * warmup_ratio)
            out["warmup_steps"] = math.ceil(out["max_steps"] * float(ratio))
        else:
            job.notes.append(f"warmup_ratio {ratio}: the total steps depend on the data; after `port train --dry-run` "
                             f"set schedule.warmup_steps = ceil({ratio} x steps)")
    return out


def _precision(job: Job) -> dict[str, Any]:
    mp = {"bfloat16": "bf16", "float16": "fp16"}.get(str(job.get("mixed_precision", "")).lower(),
                                                       str(job.get("mixed_precision", "")).lower())
    if job.get("bf16") is True or mp == "bf16":
        return {"param_dtype": "bfloat16", "compute_dtype": "bfloat16"}
    if job.get("fp16") is True or mp == "fp16":
        ls = job.get("loss_scale", 0)
        scale: dict[str, Any] = {"kind": "dynamic" if not ls else "static"}
        if ls:
            scale["init"] = float(ls)
        elif job.get("initial_scale_power") is not None:
            scale["init"] = float(2 ** int(job.get("initial_scale_power")))
        if job.get("loss_scale_window"):
            scale["window"] = int(job.get("loss_scale_window"))
        return {"param_dtype": "float16", "compute_dtype": "float16", "loss_scale": scale}
    return {"param_dtype": "float32", "compute_dtype": "float32"}


def base_recipe(job: Job, target: Target) -> dict[str, Any]:
    """The recipe without the batch layout (that is :func:`fit`'s)."""
    b1, b2 = job.get("beta1", 0.9), job.get("beta2", 0.999)
    if job.get("betas"):
        b1, b2 = job.get("betas")
    clip = job.get("grad_clip", 1.0)
    report = str(job.get("report_to", ""))
    out_name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(job.get("output_dir") or "imported")).name).strip("-.") or "imported"
    rec: dict[str, Any] = {
        "model": {"source": _model(job, target)},
        "data": {"path": target.data or DEFAULT_DATA, "format": "auto",
                 "max_seq_length": int(job.get("max_len") or 2048)},
        "optimizer": {"lr": float(job.get("lr", 5e-5)), "betas": [float(b1), float(b2)],
                      "eps": float(job.get("eps", 1e-8)), "weight_decay": float(job.get("weight_decay", 0.0)),
                      "grad_clip": float(clip) if clip else None},
        "schedule": _schedule(job), "precision": _precision(job),
        "memory": {"recompute": bool(job.get("recompute", False))},
        "parallel": {"optimizer_sharding": str(job.get("zero_stage", 0)) in ("1", "2", "3")},
        "cluster": {"server": target.cluster, "nodes": target.nodes},
        "logging": {"every_steps": _steps(job, "logging_steps", 1), "tensorboard": "tensorboard" in report,
                    "wandb": "wandb" in report},
        "checkpointing": {"every_steps": _steps(job, "save_steps", 0), "keep_last": int(job.get("keep_last") or 2)},
        "seed": int(job.get("seed", 42)), "output_dir": f"runs/{out_name}",
    }
    if not job.get("max_len"):
        job.notes.append("no max sequence length in the configs (cutoff_len / max_seq_length); used 2048")
    if job.get("template"):
        rec["data"]["chat_template"] = "model"
    split = job.get("eval_split")
    if split and split >= 1:   # LLaMA-Factory's val_size: a fraction, or a number of examples
        job.notes.append(f"val_size {split}: a number of held-out examples; the recipe holds out a fraction "
                         "(set data.eval_split by hand)")
    elif split:
        rec["data"]["eval_split"] = float(split)
        rec["data"]["eval_every_steps"] = _steps(job, "eval_steps", 0)
    if job.get("packing"):
        rec["batching"] = {"packing": True}
    if str(job.get("zero_stage", 0)) in ("1", "2"):
        rec["parallel"]["zero_stage"] = int(job.get("zero_stage"))
    rb = job.get("reduce_bucket_size")
    if isinstance(rb, (int, float)) and not isinstance(rb, bool) and 0 < rb <= 1e12:
        rec["parallel"]["comm_fusion"] = {"enabled": True, "allreduce_mode": "size",
                                          "allreduce_config": round(rb / 2 ** 20, 3)}
    t = job.get("timeout")
    if isinstance(t, int) and 1 <= t <= 86_400:
        rec["cluster"]["cluster_time_out"] = t
    elif t is not None:
        job.notes.append(f"ddp_timeout {t} s is beyond port's 1-day bound; cluster.cluster_time_out keeps its default")
    return rec


def _steps(job: Job, field: str, default: int) -> int:
    """An HF ``*_steps`` value as whole steps; below 1 HF reads it as a ratio of the total steps
    (transformers TrainingArguments ``logging_steps``), which depends on the data: the default, with a note."""
    v = job.get(field)
    if v and v < 1:
        job.notes.append(f"{field} {v}: a ratio of the total steps, which depend on the data; used {default} "
                         "(set it by hand after `port train --dry-run`)")
    return int(v) if v and v >= 1 else default


# ----------------------------------------------------------------------------------------- layout
def _layouts(target: Target):
    """(cluster section, note) candidates: the whole target, then fewer chips of one node."""
    srv = SERVERS[target.cluster]
    yield {"server": target.cluster, "nodes": target.nodes}, None
    if target.nodes == 1:
        chips = srv.chips // 2
        while chips >= 1:
            yield ({"device": "ascend", "chips_per_node": chips, "dies_per_chip": srv.dies_per_chip,
                    "device_hbm_gib": srv.hbm_gib_per_die, "nodes": 1},
                   f"the global batch does not lay out on all {srv.chips * srv.dies_per_chip} devices of {target.cluster}; "
                   f"planned on {chips} chips ({chips * srv.dies_per_chip} devices) of it")
            chips //= 2


def fit(raw: dict[str, Any], gbs: int, job: Job, target: Target):
    """The recipe with micro 1 x accumulation x data parallel = ``gbs`` (tensor parallel taking the other
    devices) that plans and fits, trying optimizer sharding, then recompute; (raw recipe, plan)."""
    cfg = None
    tried = []
    for cluster, note in _layouts(target):
        for tp in (1, 2, 4, 8, 16):
            cand = copy.deepcopy(raw)
            cand["cluster"] = {**cand["cluster"], **cluster}
            if tp > 1 and "eval_split" in cand["data"]:   # held-out scoring runs on rank 0 with the whole model
                for k in ("eval_split", "eval_every_steps"):
                    cand["data"].pop(k)
            if "server" not in cluster:
                cand["cluster"].pop("server", None)
            for shard, recompute in ((cand["parallel"]["optimizer_sharding"], cand["memory"]["recompute"]),
                                     (True, cand["memory"]["recompute"]), (True, True)):
                cand["parallel"].update(tensor_parallel=tp, optimizer_sharding=shard)
                cand["memory"]["recompute"] = recompute
                try:
                    rec = validate_recipe(cand, "<imported recipe>", check_files=False)
                except PortingError:
                    break
                dp = rec.data_parallel_size
                if gbs % dp or rec.cluster.devices_per_node % tp:
                    break
                cand.setdefault("batching", {}).update(micro_batch_size=1, grad_accum_steps=gbs // dp)
                rec = validate_recipe(cand, "<imported recipe>", check_files=False)
                if cfg is None:
                    try:
                        cfg, notes = plan_config(rec)
                    except PortingError as e:
                        raise IntakeError(f"model.source {rec.model.source}: {e}; pass --model DIR|ZOO_NAME (the "
                                          "checkpoint directory, or the zoo name of the same architecture)") from None
                    job.notes += notes
                try:
                    check_tensor_parallel(rec, cfg, rec.model.source)
                except PortingError:
                    break
                plan = make_plan(rec, cfg, rec.output_dir)
                tried.append(f"TP {tp} x DP {dp} (sharding {shard}, recompute {recompute}): "
                             f"{plan.memory_gib_by_phase.total:.1f} GiB")
                if plan.fits:
                    if note:
                        job.notes.append(note)
                    if "eval_split" in raw["data"] and "eval_split" not in cand["data"]:
                        job.notes.append(f"data.eval_split {raw['data']['eval_split']} left out: with tensor parallel "
                                         "the held-out data is scored after training with `port eval`")
                    return cand, plan
    raise IntakeError(f"global batch {gbs}: no layout on {target.nodes} x {target.cluster} fits or divides it "
                      f"(tried {'; '.join(tried[-4:]) or 'none: the batch does not divide any data-parallel size'}); "
                      "change --nodes/--cluster, or the job's batch")


# ----------------------------------------------------------------------------------------- whole import
def import_configs(paths: list[str], out: str | Path, target: Target) -> dict[str, Any]:
    """Read every config, map every key, fit the target, write the recipe and its mapping; the report."""
    from converters.atomic import check_out, json_of_format

    dst = Path(out)
    # the recipe is never written over a file; its mapping (a side file) only over an earlier mapping
    check_out(dst, kind="file", inputs=paths, what="a file port may replace (a recipe is written new)",
              error=IntakeError)
    check_out(dst.with_suffix(".mapping.json"), kind="file", inputs=paths, ours=json_of_format("port-recipe-import"),
              what="a mapping `port recipe import` wrote", error=IntakeError)
    if not dst.parent.is_dir():
        raise IntakeError(f"{shown_name(dst)}: folder {shown_name(dst.parent)} does not exist; create it or pick "
                          "another --out")
    if not paths:
        raise IntakeError("no CONFIG given; pass training_args.bin/.json/.yaml, a DeepSpeed JSON, an accelerate "
                          "config or a LLaMA-Factory YAML")
    job, kinds = Job(), {}
    for p in paths:
        kind, keys = read_config(p)
        kinds[str(p)] = kind
        for key, value in keys.items():   # a PEFT adapter config's keys by converters/peft_adapter.py's rules
            if kind != "peft-adapter" or not lora_keys.adapter_row(job, str(p), key, value):
                take(job, str(p), key, value)
    _refine(job)
    gbs, how = _global_batch(job, target)
    raw, plan = fit({**base_recipe(job, target), **lora_keys.recipe_part(job, kinds)}, gbs, job, target)
    for r in job.rows:
        if r["status"] == "mapped" and r["recipe_key"].startswith("model.source") and target.model:
            r["note"] = f"overridden by --model {target.model}"
    rep = {"format": "port-recipe-import", "format_version": 1, "recipe": str(dst), "configs": kinds,
           "model": raw["model"]["source"],
           "global_batch": {"value": gbs, "source": how, "target": plan.global_batch_formula},
           "plan": {"world_size": plan.world_size, "tensor_parallel": plan.tensor_parallel,
                    "data_parallel": plan.data_parallel, "memory_gib_per_device": plan.memory_gib_by_phase.total,
                    "fits": plan.fits},
           "keys": job.rows, "blocking": [r for r in job.rows if r.get("blocking")], "notes": job.notes}
    header = [f"Imported by `port recipe import` from {', '.join(paths)}.",
              f"Global batch {gbs} ({how}) -> {plan.global_batch_formula} on {plan.hardware}.",
              "Every source key and what it became: " + dst.with_suffix(".mapping.json").name]
    header += [f"REFUSED (port cannot reproduce it): {r['key']} = {r['value']}: {r['reason']}" for r in rep["blocking"]]
    header += [f"note: {n}" for n in job.notes]
    text = "".join(comment(h) for h in header) + yaml.safe_dump(raw, sort_keys=False)
    files.write_atomic(dst.with_suffix(".mapping.json"), json.dumps(rep, indent=1) + "\n", error=IntakeError)
    files.write_atomic(dst, text, error=IntakeError)
    return rep


def render(rep: dict[str, Any]) -> str:
    lines = [f"{'file:key':<60} {'status':<8} became / why"]
    for r in rep["keys"]:
        what = r.get("recipe_key") or r.get("reason", "")
        mark = "REFUSED" if r.get("blocking") else r["status"]
        lines.append(f"{shown_name(Path(r['file']).name + ':' + r['key']):<60} {mark:<8} {shown_name(what[:110])}")
    g, p = rep["global_batch"], rep["plan"]
    lines += ["", f"global batch {g['value']} ({g['source']}) -> {g['target']}; {p['world_size']} devices, "
                  f"TP {p['tensor_parallel']} x DP {p['data_parallel']}, {p['memory_gib_per_device']:.1f} GiB per device"]
    lines += [f"note: {shown_name(n)}" for n in rep["notes"]]
    n_map = sum(r["status"] == "mapped" for r in rep["keys"])
    lines.append(f"wrote {rep['recipe']}: {n_map} key(s) mapped, {len(rep['keys']) - n_map} refused "
                 f"({len(rep['blocking'])} that port cannot reproduce)")
    return "\n".join(lines)
