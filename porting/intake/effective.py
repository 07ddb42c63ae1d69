"""The CUDA side of the settings table: each curve-moving setting as the CUDA job really ran it, from its files.

Read (bounded, nothing run): the configs `port recipe import` reads (``read_config``: training_args.bin, a
TrainingArguments JSON/YAML, LLaMA-Factory YAML, DeepSpeed JSON, accelerate YAML), the log's own header facts
(trainer_state.json ``max_steps``/``train_batch_size``, trainer_log.jsonl ``total_steps``), and the tokenizer's and the
model's ``config.json`` where the job folder holds them. A value the files do not state is the library's default when
the library's default is fixed (transformers' TrainingArguments: ``max_grad_norm`` 1.0, ``weight_decay`` 0, betas
(0.9, 0.999), ``seed`` 42, ...), and unknown, with the reason and the candidates, when it depends on what the files do
not say (the transformers version, the launcher, the script).

What the libraries do with the values (each cited where it is used):

- loss normalisation: transformers >= 4.46 normalises by the step's target tokens (``num_items_in_batch``), across
  devices when ``average_tokens_across_devices`` (True by default in transformers 5); before 4.46 each micro-batch's
  mean was divided by the accumulation steps (transformers#34242). A training_args.bin is a full TrainingArguments
  dump, so the absence of that field dates it;
- weight decay: the HF Trainer leaves biases and norm weights undecayed (``Trainer.get_decay_parameter_names``);
  a DeepSpeed config with its own ``optimizer`` section gets every trainable parameter in one group
  (transformers/integrations/deepspeed.py ``deepspeed_optim_sched``: ``DummyOptim(params=model_parameters)``);
- warm-up: the Trainer (and DeepSpeed's scheduler) steps once per optimizer step; ``warmup_ratio`` is
  ``ceil(ratio x total optimizer steps)`` (transformers ``TrainingArguments.get_warmup_steps``);
- padding: LLaMA-Factory loads every tokenizer with ``padding_side="right"`` (src/llamafactory/model/loader.py
  ``load_tokenizer``); otherwise the tokenizer's ``padding_side``;
- truncation: LLaMA-Factory cuts prompt and response in proportion to fit ``cutoff_len`` (``infer_seqlen``);
- NEFTune: ``neftune_noise_alpha`` (transformers >= 4.35).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from model_zoo import files
from porting.baseline.effective import Fact, unknown
from porting.baseline.port_side import LOSS_WORDS
from porting.intake import IntakeError, config_keys as K
from porting.intake.typed import Flag, Num, Pair, Text, name as shown_name, typed

MAX_SMALL_JSON = 4 << 20      # tokenizer_config.json (a chat template inside), config.json
HF_DEFAULTS: dict[str, Any] = {   # transformers TrainingArguments defaults (training_args.py), stable since 4.x
    "weight_decay": 0.0, "learning_rate": 5e-5, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
    "max_grad_norm": 1.0, "lr_scheduler_type": "linear", "warmup_steps": 0, "warmup_ratio": 0.0, "seed": 42,
    "label_smoothing_factor": 0.0, "gradient_accumulation_steps": 1, "full_determinism": False,
    "group_by_length": False,
}
SPECS = {"average_tokens_across_devices": Flag(), "neftune_noise_alpha": Num(0, 1e6), "label_smoothing_factor": Num(0, 1),
         "full_determinism": Flag(), "data_seed": Num(0, 2 ** 32 - 1, whole=True), "neat_packing": Flag(),
         "adam_beta1": Num(0, 1, high_open=True), "adam_beta2": Num(0, 1, high_open=True),
         "optimizer.params.betas": Pair(Num(0, 1, high_open=True)), "gradient_clipping": Num(0, 1e6),
         "padding_side": Text(), "truncation_side": Text(), "attention_dropout": Num(0, 1),
         "scheduler.params.warmup_num_steps": Num(0, 1e9, whole=True), "optimizer.type": Text()}


class Keys:
    """Every key of every config, the first file's value kept (as `port recipe import` keeps it), typed."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.origin: dict[str, str] = {}
        self.kinds: set[str] = set()
        self.full_dump = False        # a training_args.bin: every TrainingArguments field of its version

    def add(self, file: str, doc: dict[str, Any]) -> None:
        for key, value in doc.items():
            if key in self.values or value == "auto":
                continue
            spec = SPECS.get(key) or (K.TYPES.get(K.FIELDS[key]) if key in K.FIELDS else None)
            if spec is not None:
                value = typed(value, spec, shown_name(file), key)
            self.values[key] = value
            self.origin[key] = f"{Path(file).name}:{key}"

    def has(self, key: str) -> bool:
        return self.values.get(key) is not None

    def fact(self, key: str, shown: Any = None, default: Any = None, why: str = "") -> Fact:
        """The file's value, else the HF default (where the job is an HF Trainer one), else unknown."""
        if self.has(key):
            v = self.values[key]
            return Fact(v, shown(v) if callable(shown) else f"{v:g}" if isinstance(v, float) else str(v), self.origin[key])
        d = HF_DEFAULTS.get(key, default)
        if d is not None and self.hf:
            return Fact(d, (shown(d) if callable(shown) else f"{d:g}" if isinstance(d, float) else str(d))
                        + " (the default; not in the files)", f"transformers TrainingArguments default {key}")
        return unknown(why or f"not in the job's files ({key})")

    @property
    def hf(self) -> bool:
        return bool(self.kinds & {"hf-training-args", "llamafactory"})


def _small_json(path: Path | None, what: str) -> dict[str, Any]:
    if path is None:
        return {}
    doc = files.read_json(path, what=what, max_bytes=MAX_SMALL_JSON, error=IntakeError)
    return doc if isinstance(doc, dict) else {}


def _log_facts(log: Path | None) -> dict[str, Any]:
    """The header facts of the log: trainer_state.json max_steps / train_batch_size, trainer_log.jsonl total_steps."""
    from porting.intake.logs import read_log

    if log is None or "tfevents" in log.name:
        return {}
    steps = read_log(log).recovered.get("max_steps")   # the log reader's typed header facts
    return {"max_steps": int(steps)} if steps else {}


def read_files(configs: list[Path], log: Path | None = None, tokenizer_config: Path | None = None,
               model_config: Path | None = None) -> dict[str, Fact]:
    """The CUDA side from the job's files (each may be absent)."""
    from porting.intake.recipe_import import read_config

    keys = Keys()
    for p in configs:
        kind, doc = read_config(p)
        keys.kinds.add(kind)
        keys.full_dump |= p.suffix == ".bin"
        keys.add(str(p), doc)
    tok, model, header = _small_json(tokenizer_config, "tokenizer_config.json"), \
        _small_json(model_config, "config.json"), _log_facts(log)
    return _facts(keys, tok, model, header, tokenizer_config, model_config, log)


def _facts(k: Keys, tok: dict, model: dict, header: dict, tok_path: Path | None, model_path: Path | None,
           log: Path | None) -> dict[str, Fact]:
    lf = "llamafactory" in k.kinds
    ds_opt = k.has("optimizer.type")
    out = {"loss_normalisation": _loss(k), "weight_decay": _first(k, ("weight_decay", "optimizer.params.weight_decay")),
           "decay_norms_biases": _decay(k, ds_opt), "warmup_unit": _warmup_unit(k),
           "grad_accum": k.fact("gradient_accumulation_steps")}
    out["warmup_steps"] = _warmup_steps(k, header, log)
    out["lr"] = _first(k, ("learning_rate", "optimizer.params.lr"))
    out["lr_schedule"] = _schedule(k)
    out["max_grad_norm"] = _clip(k)
    out["betas"] = _betas(k)
    out["eps"] = _first(k, ("adam_epsilon", "optimizer.params.eps"))
    out["global_batch"] = _global_batch(k)
    out["seq_length"] = _first(k, ("cutoff_len", "max_seq_length"), why="no cutoff_len / max_seq_length in the "
                               "configs: the script or the collator decides")
    out["padding_side"] = _padding(k, tok, tok_path, lf)
    out["truncation"] = _truncation(k, tok, out["seq_length"], lf)
    out["neftune"] = _neftune(k)
    out["attention_dropout"] = _dropout(model, model_path)
    out["label_smoothing"] = k.fact("label_smoothing_factor")
    out["chat_template"] = _template(k, tok, tok_path, lf)
    out["packing"] = _packing(k, lf)
    out["precision"] = _precision(k)
    out["seed"] = k.fact("seed")
    out["data_order"] = _order(k)
    fd = k.fact("full_determinism")
    words = "on (transformers enable_full_determinism)" if fd.value else "default (no deterministic algorithms)"
    out["determinism"] = fd if fd.value is None else Fact(
        "bitwise" if fd.value else "default", words + ("" if k.has("full_determinism") else " (the default)"), fd.source)
    return out


def _first(k: Keys, names: tuple[str, ...], why: str = "") -> Fact:
    for n in names:
        if k.has(n):
            return k.fact(n)
    return k.fact(names[0], why=why)


def _loss(k: Keys) -> Fact:
    key = "average_tokens_across_devices"
    if k.has(key):
        mode = "global-token-mean" if k.values[key] else "device-token-mean"
        return Fact(mode, LOSS_WORDS[mode], k.origin[key] + " (transformers >= 4.46)")
    if k.full_dump:
        return Fact("micro-batch-mean", LOSS_WORDS["micro-batch-mean"] + " (transformers before 4.46)",
                    "training_args.bin has no average_tokens_across_devices: a TrainingArguments of transformers < 4.46")
    if k.hf:
        return unknown("depends on the transformers version, not in the files: per token over the global batch "
                       "with >= 4.46 and average_tokens_across_devices (the default in 5.x); a mean of micro-batch "
                       "means before 4.46", "transformers#34242")
    return unknown("the training script decides (no HF Trainer config)")


def _decay(k: Keys, ds_opt: bool) -> Fact:
    if ds_opt:
        return Fact(True, "decayed: DeepSpeed's optimizer gets every trainable parameter in one group",
                    f"{k.origin['optimizer.type']}; transformers integrations/deepspeed.py deepspeed_optim_sched")
    if k.hf:
        return Fact(False, "not decayed: biases and norm weights excluded",
                    "transformers Trainer.get_decay_parameter_names")
    return unknown("the training script builds the optimizer's parameter groups")


def _warmup_unit(k: Keys) -> Fact:
    if k.has("scheduler.params.warmup_num_steps"):
        return Fact("optimizer steps", "optimizer steps (DeepSpeed steps its scheduler at each optimizer step)",
                    k.origin["scheduler.params.warmup_num_steps"])
    if k.hf:
        return Fact("optimizer steps", "optimizer steps (the Trainer steps its scheduler once per optimizer step)",
                    "transformers Trainer (lr_scheduler.step() after optimizer.step())")
    return unknown("the training script steps the scheduler")


def _warmup_steps(k: Keys, header: dict, log: Path | None) -> Fact:
    if k.has("warmup_steps") and k.values["warmup_steps"] > 0:
        return k.fact("warmup_steps")
    if k.has("scheduler.params.warmup_num_steps"):
        return k.fact("scheduler.params.warmup_num_steps")
    ratio = k.values.get("warmup_ratio") or 0
    if not ratio:
        return k.fact("warmup_steps")
    total = k.values.get("max_steps") if isinstance(k.values.get("max_steps"), int) and k.values["max_steps"] > 0 \
        else header.get("max_steps")
    if not total:
        return unknown(f"warmup_ratio {ratio:g} of the total optimizer steps, which the files do not state",
                       k.origin["warmup_ratio"])
    src = k.origin["warmup_ratio"] + (f" x {log.name} max_steps" if "max_steps" not in k.values and log else "")
    return Fact(math.ceil(total * float(ratio)), f"{math.ceil(total * float(ratio))} (ceil({ratio:g} x {total}))", src)


def _schedule(k: Keys) -> Fact:
    f = k.fact("lr_scheduler_type")
    if f.value is None:
        return f
    decay, floor = K.SCHEDULERS.get(str(f.value), (str(f.value), None))
    shown = f"{decay} to {floor:g} x lr" if floor is not None else f"{f.value} (no port equivalent)"
    return Fact((decay, floor) if floor is not None else str(f.value), shown + f" ({f.shown})", f.source)


def _clip(k: Keys) -> Fact:
    f = _first(k, ("max_grad_norm", "gradient_clipping"))
    if f.value is None:
        return f
    return Fact("none", "none (0: no clipping)", f.source) if not f.value else f


def _betas(k: Keys) -> Fact:
    if k.has("optimizer.params.betas"):
        b = k.values["optimizer.params.betas"]
        return Fact(tuple(b), f"({b[0]:g}, {b[1]:g})", k.origin["optimizer.params.betas"])
    b1, b2 = k.fact("adam_beta1"), k.fact("adam_beta2")
    if b1.value is None or b2.value is None:
        return unknown("the script's optimizer decides")
    return Fact((b1.value, b2.value), f"({b1.value:g}, {b2.value:g})", f"{b1.source}, {b2.source}")


def _global_batch(k: Keys) -> Fact:
    explicit = k.values.get("train_batch_size")
    if isinstance(explicit, int) and not isinstance(explicit, bool):
        return Fact(explicit, str(explicit), k.origin["train_batch_size"])
    micro, accum = k.values.get("per_device_train_batch_size"), k.values.get("gradient_accumulation_steps", 1)
    gpus = k.values.get("num_processes")
    if micro and gpus:
        return Fact(micro * accum * gpus, f"{micro * accum * gpus} ({micro} micro x {accum} accumulation x {gpus} GPUs)",
                    f"{k.origin['per_device_train_batch_size']}, {k.origin['num_processes']}")
    return unknown(f"{micro or '?'} micro x {accum} accumulation x the GPU count, which the files do not state "
                   "(pass it to `port recipe import --source-gpus`)")


def _padding(k: Keys, tok: dict, tok_path: Path | None, lf: bool) -> Fact:
    if lf:
        return Fact("right", "right (LLaMA-Factory loads every tokenizer with padding_side='right')",
                    "LLaMA-Factory src/llamafactory/model/loader.py load_tokenizer")
    side = tok.get("padding_side")
    if side in ("left", "right"):
        return Fact(side, side, f"{tok_path.name if tok_path else 'tokenizer_config.json'}:padding_side")
    return unknown("the tokenizer's padding_side (tokenizer_config.json, or the script) is not in the job's files; "
                   "HF's Llama tokenizers default to left, training scripts often set right")


def _truncation(k: Keys, tok: dict, length: Fact, lf: bool) -> Fact:
    if length.value is None:
        return unknown("no maximum length in the configs: the script or the collator cuts")
    if lf:
        return Fact(("proportional", length.value), f"prompt and response cut in proportion to fit {length.value} "
                    "tokens", "LLaMA-Factory data processor infer_seqlen; " + length.source)
    side = tok.get("truncation_side", "right")
    return Fact((side, length.value), f"{side}: {length.value} tokens" + ("" if "truncation_side" in tok else
                " (the tokenizer's default side)"), length.source)


def _neftune(k: Keys) -> Fact:
    if k.has("neftune_noise_alpha"):
        return Fact(float(k.values["neftune_noise_alpha"]), f"alpha {k.values['neftune_noise_alpha']:g}",
                    k.origin["neftune_noise_alpha"])
    if k.full_dump:
        return Fact(0.0, "none", "training_args.bin: neftune_noise_alpha unset (or transformers < 4.35, which had none)")
    if k.hf:
        return Fact(0.0, "none (the default; not in the files)", "transformers TrainingArguments neftune_noise_alpha")
    return unknown("the training script decides")


def _dropout(model: dict, path: Path | None) -> Fact:
    v = model.get("attention_dropout")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = typed(v, SPECS["attention_dropout"], shown_name(path), "attention_dropout")
        return Fact(float(v), f"{float(v):g}", f"{path.name if path else 'config.json'}:attention_dropout")
    return unknown("the model's config.json attention_dropout (not in the job's files; 0.0 in Llama's own)")


def _template(k: Keys, tok: dict, tok_path: Path | None, lf: bool) -> Fact:
    if lf and k.has("template"):
        return Fact(f"llamafactory:{k.values['template']}", f"LLaMA-Factory template {k.values['template']!r}",
                    k.origin["template"])
    if isinstance(tok.get("chat_template"), str):
        return unknown("the tokenizer has a chat_template; whether the script applied it is not in the files",
                       f"{tok_path.name if tok_path else 'tokenizer_config.json'}:chat_template")
    return unknown("the prompt format is the script's (no template in the configs)")


def _packing(k: Keys, lf: bool) -> Fact:
    for key in ("packing", "neat_packing"):
        if k.has(key) and k.values[key]:
            return Fact(True, f"packed ({key})", k.origin[key])
    if lf:
        return Fact(False, "no packing (the default for sft)", "LLaMA-Factory DataArguments packing")
    return unknown("the script's data preparation decides")


def _precision(k: Keys) -> Fact:
    for key, name in (("bf16", "bf16-mixed"), ("fp16", "fp16-mixed")):
        if k.values.get(key) is True:
            return Fact(name, f"{name} (fp32 master weights, {key} autocast)", k.origin[key])
    mp = str(k.values.get("mixed_precision", "")).lower()
    if mp in ("bf16", "fp16"):
        return Fact(f"{mp}-mixed", f"{mp}-mixed", k.origin["mixed_precision"])
    if k.hf:
        return Fact("float32", "float32 (no bf16/fp16 flag)", "transformers TrainingArguments bf16/fp16 defaults")
    return unknown("the script decides the precision")


def _order(k: Keys) -> Fact:
    seed = k.values.get("data_seed") if k.has("data_seed") else k.values.get("seed", HF_DEFAULTS["seed"])
    if k.values.get("group_by_length") is True:
        return Fact(f"hf-length-grouped:{seed}", f"length-grouped sampler, seed {seed}", k.origin["group_by_length"])
    if k.hf:
        return Fact(f"hf-random:{seed}", f"the Trainer's RandomSampler (torch generator, seed {seed})",
                    "transformers Trainer._get_train_sampler")
    return unknown("the script's sampler decides")

