"""The two sides of every verification, from one directory: HF transformers' model (the reference) and
the zoo's MindSpore cell, on the same weights.

:func:`load_reference` is port's one loader of an HF causal LM (tests/test_house_rules.py finds a
second ``from_pretrained``), :func:`load_zoo` its one way to build and fill the zoo cell, and
:func:`load_pair` holds both for a directory: each side is loaded when asked for, so a caller decides the
order and how long each lives (`port bisect` drops the reference before building the cell, so peak memory
is one framework's model, not two).

The reference's attention is ``eager``: transformers' own ``eager_attention_forward``
(transformers/models/llama/modeling_llama.py) computes the softmax in float32 whatever the model's dtype,
one fixed sequence of operations on every machine. Left unset, transformers picks ``sdpa``
(``PreTrainedModel.get_correct_attn_implementation`` in transformers/modeling_utils.py), and
``torch.nn.functional.scaled_dot_product_attention`` chooses among its flash, memory-efficient and math
backends at run time by device, dtype and shape
(https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html), so the
reference's rounding would depend on where it ran. Only the CUDA training baseline (`port baseline`,
porting/baseline/torch_loop.py) asks for ``sdpa``: it measures the speed and memory a user's CUDA
fine-tune has, not a reference's numbers.

Dynamic NTK RoPE is made a function of each call (:func:`per_call_rope`), as the zoo computes it
(model_zoo/rope.py): a raw transformers model keeps the longest length it has seen until a call shorter
than the original context, so a batch would depend on the batches before it (docs/baseline.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model_zoo.config import LlamaConfig
from model_zoo.errors import CheckpointError
from porting.verify.stats import tolerances

if TYPE_CHECKING:
    from model_zoo.llama import LlamaForCausalLM

REFERENCE_ATTENTION = "eager"
TORCH_DTYPES = ("float32", "float16", "bfloat16")
# Where the zoo cell's weights come from: an HF directory, a `port convert` output (MindSpore names, its
# own config.json), or a `port train` checkpoint (checkpoints/step_N: weights and AdamW moments).
WEIGHT_KINDS = ("hf", "convert", "checkpoint")


def load_reference(hf_dir: str | Path, dtype: str = "float32", *, attention: str = REFERENCE_ATTENTION) -> Any:
    """HF transformers' causal LM of ``hf_dir`` (local files only) in ``dtype``, in eval mode."""
    from porting.env import require_torch

    require_torch("the HF reference")
    import torch
    from transformers import AutoModelForCausalLM   # LlamaForCausalLM, or Qwen2's / Mistral's class
    from transformers.utils import logging as hf_logging

    if dtype not in TORCH_DTYPES:
        raise ValueError(f"reference dtype {dtype!r}: expected one of {', '.join(TORCH_DTYPES)}")
    hf_logging.disable_progress_bar()  # port prints its own lines; the weights are local
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=getattr(torch, dtype), local_files_only=True,
                                                 attn_implementation=attention)
    per_call_rope(model)
    return model.eval()


def per_call_rope(model: Any) -> int:
    """Make every dynamic-NTK rotary embedding of ``model`` start each call from its initial frequencies
    (transformers' ``dynamic_rope_update`` then grows them to the call's own ``max(position_ids) + 1`` past
    the original context, and keeps them below it): the frequencies of a call no longer depend on the calls
    before it. A KV-cache generation is unchanged (its lengths only grow). Returns the modules changed."""
    changed = 0
    for m in model.modules():
        if "dynamic" in str(getattr(m, "rope_type", "")) and hasattr(m, "original_inv_freq"):
            m.register_forward_pre_hook(_reset_dynamic_rope)
            changed += 1
    return changed


def _reset_dynamic_rope(module: Any, args: Any) -> None:
    # the state transformers' own reset restores (modeling_rope_utils.dynamic_rope_update, 4.56 and 5.x); 4.56
    # keeps original_inv_freq as a plain attribute, which model.to(device) does not move
    original = module.original_inv_freq.to(module.inv_freq.device)
    module.register_buffer("inv_freq", original, persistent=False)
    module.max_seq_len_cached = module.original_max_seq_len


def build_zoo(cfg: LlamaConfig, *, dtype: str = "float32", kernels_override: dict | None = None) -> LlamaForCausalLM:
    """The zoo cell of ``cfg`` with its seeded initial weights, for a caller that fills it itself (the step
    replay of `port bisect --baseline` restores weights and AdamW moments together)."""
    from model_zoo import build

    return build(cfg, param_dtype=dtype, kernels_override=kernels_override)


def load_zoo(cfg_dir: str | Path, weights: str | Path | None = None, *, kind: str = "hf", dtype: str = "float32",
             kernels_override: dict | None = None, cfg: LlamaConfig | None = None) -> LlamaForCausalLM:
    """The zoo cell of ``cfg_dir``'s config.json (or ``cfg``) in ``dtype``, its weights from ``weights``
    (default ``cfg_dir``) read as ``kind``: "hf" (HF names), "convert" (a `port convert` output, each
    tensor's shape checked first) or "checkpoint" (a `port train` checkpoint, read by port train's own
    strict loader: every parameter and AdamW moment present; fp32 master weights allowed and not used)."""
    if kind not in WEIGHT_KINDS:
        raise ValueError(f"weights kind {kind!r}: expected one of {', '.join(WEIGHT_KINDS)}")
    cfg = cfg if cfg is not None else LlamaConfig.from_hf(Path(cfg_dir))
    src = Path(weights if weights is not None else cfg_dir)
    model = build_zoo(cfg, dtype=dtype, kernels_override=kernels_override)
    if kind == "hf":
        from converters.loading import load_hf_dir

        load_hf_dir(model, src)
    elif kind == "convert":
        from converters.loading import load_ms_dir

        _check_shapes(model, src)
        load_ms_dir(model, src)
    else:
        _load_train_checkpoint(model, src)
    return model


def _load_train_checkpoint(model: LlamaForCausalLM, path: Path) -> None:
    from porting.train.run.checkpoint import save as ckpt
    from porting.train.run.step.cells import AdamW

    params = list(model.trainable_params())
    opt = AdamW(params, (0.9, 0.999), 1e-8, 0.0)   # holds the moments the strict loader requires; not stepped
    ckpt.load_whole(path, params + list(opt.m) + list(opt.v), allowed={f"master.{p.name}" for p in params})


def _check_shapes(model: LlamaForCausalLM, ms_dir: Path) -> None:
    """Each stored tensor's shape against the model's (load_param_into_net would fail with a traceback)."""
    from converters.sources import open_ms

    params = {p.name: tuple(p.shape) for p in model.get_parameters()}
    for f in open_ms(ms_dir).files:
        for t in f.tensors:
            if t.name in params and tuple(t.shape) != params[t.name]:
                raise CheckpointError(f"{f.path}: tensor {t.name} has shape {list(t.shape)}, its config.json implies "
                                      f"{list(params[t.name])}; the checkpoint does not match its config")


@dataclasses.dataclass(frozen=True)
class Pair:
    """The reference and the zoo cell of one model; each call of :meth:`reference` / :meth:`zoo` loads afresh."""

    hf_dir: Path
    cfg: LlamaConfig
    dtype: str
    weights: Path            # where the zoo cell's weights come from (``hf_dir`` unless ``ms_dir`` was given)
    kind: str                # how they are read (WEIGHT_KINDS)
    kernels_override: dict | None = None

    def reference(self) -> Any:
        return load_reference(self.hf_dir, self.dtype)

    def zoo(self, cfg: LlamaConfig | None = None) -> LlamaForCausalLM:
        return load_zoo(self.hf_dir, self.weights, kind=self.kind, dtype=self.dtype,
                        kernels_override=self.kernels_override, cfg=cfg or self.cfg)


def load_pair(hf_dir: str | Path, ms_dir: str | Path | None = None, *, dtype: str = "float32", kind: str | None = None,
              kernels_override: dict | None = None) -> Pair:
    """The pair for ``hf_dir`` (the reference, and the zoo cell's config), the cell's weights from ``ms_dir``
    (a `port convert` output unless ``kind`` says otherwise) or from ``hf_dir``. ``dtype`` must be one of
    the parity table's (one-line ConfigError otherwise). Nothing heavy is loaded here."""
    tolerances(dtype)
    hf_dir = Path(hf_dir)
    kind = kind or ("hf" if ms_dir is None else "convert")
    return Pair(hf_dir, LlamaConfig.from_hf(hf_dir), dtype, Path(ms_dir) if ms_dir is not None else hf_dir, kind,
                kernels_override)
