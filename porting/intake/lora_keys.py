"""LoRA jobs at intake: LLaMA-Factory's, ms-swift's and HF PEFT's LoRA keys as the recipe's ``lora`` section.

Sources: LLaMA-Factory ``src/llamafactory/hparams/finetuning_args.py`` (``LoraArguments``: ``lora_rank`` 8,
``lora_alpha`` default ``lora_rank * 2``, ``lora_dropout`` 0, ``lora_target`` "all" = every linear layer but the
output layer, comma-separated names otherwise, ``additional_target``, ``use_rslora``, ``use_dora``,
``loraplus_lr_ratio``, ``pissa_init``; ``quantization_bit`` in its model arguments); ms-swift's command-line
parameters (swift.readthedocs.io, Instruction/Command-line-parameters: ``train_type`` / ``tuner_type`` lora,
``lora_rank`` 8, ``lora_alpha`` 32, ``lora_dropout`` 0.05, ``target_modules`` ['all-linear'], ``modules_to_save``,
``lora_bias`` none|all, ``use_rslora``, ``use_dora``, ``lorap_lr_ratio``, ``quant_method`` / ``quant_bits``);
HF PEFT's ``adapter_config.json`` (converters/peft_adapter.py: the same key rules as a run's ``lora.init_from``).

QLoRA (a 4/8-bit base: bitsandbytes NF4, HQQ, ...) is refused in one line: MindSpore on Ascend has no NF4 matmul
and bitsandbytes is CUDA-only; what to use instead is bf16 LoRA, which the recipe then trains (at 8B it fits one
910C die: `port train --dry-run`). DoRA and LoRA+ are refused with the reasons of porting/train/recipe/lora.py.
"""

from __future__ import annotations

from typing import Any

from converters import peft_adapter
from porting.intake.typed import Flag, Num, Text

# source key -> job field (LLaMA-Factory, ms-swift and PEFT spellings)
FIELDS = {"lora_rank": "lora_r", "r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
          "lora_target": "lora_target", "target_modules": "lora_target", "additional_target": "lora_save",
          "modules_to_save": "lora_save", "use_rslora": "lora_rslora", "lora_bias": "lora_bias", "bias": "lora_bias",
          "train_type": "finetuning_type", "tuner_type": "finetuning_type", "sft_type": "finetuning_type",
          "peft_type": "finetuning_type"}
TARGET = {"lora_r": "lora.r", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
          "lora_target": "lora.target_modules", "lora_save": "lora.modules_to_save", "lora_rslora": "lora.use_rslora",
          "lora_bias": "lora.bias"}
TYPES = {"lora_r": Num(1, 4096, whole=True), "lora_alpha": Num(0, 1e6, low_open=True),
         "lora_dropout": Num(0, 1, high_open=True), "lora_target": Text(many=True), "lora_save": Text(many=True),
         "lora_rslora": Flag(), "lora_bias": Text()}

QLORA = ("QLoRA (a 4/8-bit quantized base): MindSpore on Ascend has no NF4/int4 matmul and bitsandbytes is "
         "CUDA-only; train bf16 LoRA instead (the recipe's lora section with precision bfloat16)")
DORA = "DoRA: not implemented (its magnitude vector needs the norm of W + BA per output row each step); plain LoRA"
LORAPLUS = "LoRA+: not implemented (a second learning rate for lora_B; port's AdamW has one rate for every parameter)"
BLOCKING = {
    "quantization_bit": QLORA, "quantization_method": QLORA, "quant_bits": QLORA, "quant_method": QLORA,
    "load_in_4bit": QLORA, "load_in_8bit": QLORA, "bnb_4bit_quant_type": QLORA, "double_quantization": QLORA,
    "quantization_type": QLORA, "use_dora": DORA, "loraplus_lr_ratio": LORAPLUS, "loraplus_lr_embedding": LORAPLUS,
    "lorap_lr_ratio": LORAPLUS, "pissa_init": "PiSSA initialisation: port starts from PEFT's default init, or from "
                                              "an adapter (lora.init_from)",
    "adapter_name_or_path": "a path read from the config: port never follows it; start from that adapter with "
                            "--set lora.init_from=DIR (PEFT format)",
}
# defaults of each source where a key is absent (module docstring)
DEFAULTS = {"llamafactory": {"lora_r": 8, "lora_dropout": 0.0, "lora_target": "all"},
            "ms-swift": {"lora_r": 8, "lora_alpha": 32, "lora_dropout": 0.05, "lora_target": ["all-linear"]},
            "peft-adapter": {}}


def is_lora(value: Any) -> bool:
    return str(value).lower() in ("lora", "lora_llm")


def adapter_row(job, file: str, key: str, value: Any) -> bool:
    """One key of a PEFT adapter_config.json: False when it maps (the caller takes it as any config key), else
    its row, recorded or refused with converters/peft_adapter.py's reason (blocking when it changes what trains)."""
    if key in peft_adapter.IMPLEMENTED:
        return False
    if key in peft_adapter.RECORDED:
        job.row(file, key, value, "refused", blocking=False,
                reason="recorded by PEFT (a version, a task, a path: never followed); it does not change what trains")
    elif key in peft_adapter.DEFAULT_ONLY:
        default, why = peft_adapter.DEFAULT_ONLY[key]
        off = value == default or (default is None and value in (None, {}, [], ""))
        job.row(file, key, value, "refused", blocking=not off, reason="PEFT's default (nothing to reproduce)"
                if off else why)
    elif value in (None, False, {}, [], ""):
        job.row(file, key, value, "refused", blocking=False, reason="a PEFT option that is off here")
    else:
        job.row(file, key, value, "refused", blocking=True,
                reason="a PEFT option port does not know, and it is set: port refuses what it cannot reproduce")
    return True


def _targets(value: Any) -> Any:
    """LLaMA-Factory's "all" / comma-separated string, ms-swift's list, PEFT's list or "all-linear"."""
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    if [v.lower() for v in items] in (["all"], ["all-linear"]):
        return "all-linear"
    return [v for v in items if v]


def section(job, kinds: dict[str, str]) -> dict[str, Any] | None:
    """The recipe's lora section from the job's fields (None: a full fine-tune), each default that was taken
    named in a note."""
    kind = job.get("finetuning_type")
    if kind is None and job.get("lora_r") is None:
        return None
    if kind is not None and not is_lora(kind):
        return None
    source = next((k for k in ("llamafactory", "ms-swift", "peft-adapter") if k in kinds.values()), "peft-adapter")
    taken = []
    value = {}
    for name in ("lora_r", "lora_alpha", "lora_dropout", "lora_target"):
        v = job.get(name)
        if v is None:
            if name == "lora_alpha" and source == "llamafactory":
                v = 2 * int(value["lora_r"])   # LLaMA-Factory: lora_alpha defaults to lora_rank * 2
            else:
                v = DEFAULTS[source].get(name)
            if v is None:
                continue
            taken.append(f"{TARGET[name]} {v!r}")
        value[name] = v
    if taken:
        job.notes.append(f"LoRA: {', '.join(taken)}: {source}'s default(s), not in the configs")
    out: dict[str, Any] = {"r": int(value.get("lora_r", 8)), "alpha": float(value.get("lora_alpha", 16)),
                           "dropout": float(value.get("lora_dropout", 0.0)),
                           "target_modules": _targets(value.get("lora_target", "all-linear"))}
    save = job.get("lora_save")
    if save:
        out["modules_to_save"] = [v.strip() for v in save.split(",")] if isinstance(save, str) else list(save)
    if job.get("lora_rslora"):
        out["use_rslora"] = True
    if job.get("lora_bias") not in (None, "none"):
        out["bias"] = str(job.get("lora_bias"))
    return out


def recipe_part(job, kinds: dict[str, str]) -> dict[str, Any]:
    """``{"lora": section}`` for a LoRA job, else nothing (a full fine-tune's recipe)."""
    lo = section(job, kinds)
    return {"lora": lo} if lo is not None else {}
