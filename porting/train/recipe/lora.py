"""The recipe's ``lora`` section: train LoRA adapters on a frozen base instead of every weight.

The keys are HF PEFT's ``LoraConfig`` (huggingface/peft ``src/peft/tuners/lora/config.py``, v0.21) with the
recipe's spelling of ``lora_alpha`` / ``lora_dropout``: ``r``, ``alpha``, ``dropout``, ``target_modules``
(module names as PEFT spells them, ``q_proj``, ``self_attn.o_proj``, or ``all-linear``), ``use_rslora``,
``modules_to_save`` and ``bias`` (none, all, lora_only); ``init_from`` starts the run from a PEFT adapter
folder (a CUDA job's). Which layers each name reaches is converters/lora_names.py's (PEFT's matching). The
PEFT options port does not reproduce are refused by name with the reason, here (DoRA, LoRA+) or in the adapter
reader (converters/peft_adapter.py). Without the section the run is a full fine-tune.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Union

from pydantic import Field, Strict, field_validator

from porting.train.recipe.checks import Section

MAX_RANK = 4096            # model_zoo/lora.py's bound
MAX_ALPHA = 1e6            # converters/peft_adapter.py's bound
NAME = re.compile(r"[A-Za-z0-9_.\-]{1,256}")   # a module name: letters, digits, _ . - (no pattern characters)


class LoraSection(Section):
    r: Annotated[int, Strict()] = Field(8, ge=1, le=MAX_RANK)   # PEFT's default r
    # PEFT's default lora_alpha is 8; LLaMA-Factory's is 2 x rank (src/llamafactory/hparams/finetuning_args.py)
    alpha: float = Field(16.0, gt=0, le=MAX_ALPHA)
    dropout: float = Field(0.0, ge=0, lt=1)
    # module names only: PEFT's string form is a regular expression, which port does not run (lora_names.py)
    target_modules: Union[Literal["all-linear"], list[str]] = Field(min_length=1, max_length=256)
    use_rslora: bool = False   # scaling alpha / sqrt(r) (Kalajdzievski 2023) instead of alpha / r
    modules_to_save: list[str] = Field(default_factory=list, max_length=256)   # trained whole, saved in the adapter
    bias: Literal["none", "all", "lora_only"] = "none"
    init_from: Optional[str] = Field(None, min_length=1, max_length=4096)   # a PEFT adapter folder to start from
    # refused with the reason (accepted only off, so an imported config that names them says why)
    use_dora: bool = False
    loraplus_lr_ratio: Optional[float] = Field(None, gt=0, le=MAX_ALPHA)

    @field_validator("target_modules", "modules_to_save")
    @classmethod
    def _module_names(cls, v):
        bad = [n for n in ([] if isinstance(v, str) else v) if not NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"{bad[0][:80]!r} is not a module name (letters, digits, _ . -, at most 256): port matches "
                             "PEFT's names, not regular expressions; list the modules (q_proj, self_attn.o_proj)")
        return v

    @field_validator("use_dora")
    @classmethod
    def _no_dora(cls, v: bool) -> bool:
        if v:
            raise ValueError("DoRA is not implemented: its magnitude vector needs the norm of W + BA per output row "
                             "every step, which port's tensor-parallel and ZeRO steps do not compute; use plain LoRA")
        return v

    @field_validator("loraplus_lr_ratio")
    @classmethod
    def _no_loraplus(cls, v: Optional[float]) -> Optional[float]:
        if v is not None:
            raise ValueError("LoRA+ is not implemented: it trains lora_B at a second learning rate, and port's AdamW "
                             "(and its ZeRO shards, flat buckets) has one rate for every parameter")
        return v
