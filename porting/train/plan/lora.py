"""What a LoRA recipe trains, for the planner: the trainable parameters of one tensor-parallel rank, in the
order model_zoo's cells hold them, and the frozen rest.

A LoRA run's optimizer, gradients, their reduction and its checkpoints cover the trainable parameters only
(porting/train/run/lora.py freezes the base), so the plan's :class:`porting.train.plan.layout.Layout` holds
these as its ``numels`` (every term and collective that scales with the trained parameters follows) and the
frozen base as ``frozen`` (weights only: no gradient, no master, no AdamW state). The split of an adapter over
tensor parallel (model_zoo/lora.py): beside a column-parallel layer (q/k/v, gate/up) ``lora_B`` is split by
rows and ``lora_A`` whole; beside a row-parallel layer (o, down) ``lora_A`` is split by columns and ``lora_B``
whole; modules_to_save split as their layer is (embedding and LM head by vocabulary, norms whole).
"""

from __future__ import annotations

import dataclasses

from converters import lora_names, names
from model_zoo.config import LlamaConfig
from porting.train.recipe.schema import Recipe

ROW_PARALLEL = ("attention.wo", "feed_forward.w2")        # model_zoo/llama.py _row
VOCAB_PARALLEL = ("model.tok_embeddings.embedding_weight", "lm_head.weight")
LEAF_ORDER = {"lora_A": 0, "lora_B": 1}


@dataclasses.dataclass(frozen=True)
class LoraShapes:
    numels: tuple[int, ...]       # trainable elements of one TP rank, by zoo name order
    names: tuple[str, ...]
    adapted_per_layer: int        # adapted linear layers in one decoder layer (the largest)
    rank: int


def _split(zoo: str, shape: tuple[int, ...], tp: int) -> int:
    n = 1
    for d in shape:
        n *= d
    if tp == 1:
        return n
    module, leaf = zoo.rsplit(".", 2)[0], zoo.rsplit(".", 2)[1]
    row = module.endswith(ROW_PARALLEL)
    if leaf in LEAF_ORDER:   # an adapter: the half beside the layer's split axis is split
        return n // tp if (leaf == "lora_B") != row else n
    if zoo in VOCAB_PARALLEL or (len(shape) == 2 and zoo.endswith(".weight")) or (
            zoo.endswith(".bias") and not row):
        return n // tp
    return n


def shapes(recipe: Recipe, cfg: LlamaConfig, tp: int = 1) -> LoraShapes:
    """The trainable parameters of ``recipe``'s LoRA on one tensor-parallel rank of ``cfg``'s model."""
    lo = recipe.lora
    found = lora_names.resolve(cfg, lo.target_modules, tuple(lo.modules_to_save), lo.bias)
    hf_shapes = names.expected_hf_shapes(cfg)
    table = lora_names.ModuleTable.of(cfg)
    by_zoo: dict[str, tuple[int, ...]] = {}
    for hf, zoo in found.adapted.items():
        o, i = hf_shapes[f"{hf}.weight"]
        by_zoo[f"{zoo}.lora_A.weight"] = (lo.r, i)
        by_zoo[f"{zoo}.lora_B.weight"] = (o, lo.r)
    hf_of = {z: h for h, z in table.params.items()}
    for zoo in found.trainable.values():
        by_zoo[zoo] = hf_shapes[hf_of[zoo]]
    order = sorted(by_zoo)
    per_layer = max((sum(1 for m in found.adapted if m.startswith(f"model.layers.{i}."))
                     for i in range(cfg.num_hidden_layers)), default=0)
    return LoraShapes(tuple(_split(z, by_zoo[z], tp) for z in order), tuple(order), per_layer, lo.r)



def describe(recipe: Recipe, layout) -> str:
    """What the run trains, for the dry run's plan."""
    if recipe.lora is None:
        return "full fine-tuning: every weight trains (gradients, fp32 masters when bf16, AdamW states)"
    lo = recipe.lora
    trained = sum(layout.numels)
    share = 100 * trained / max(trained + layout.frozen, 1)
    return (f"LoRA r {lo.r}, alpha {lo.alpha:g}{' (rsLoRA)' if lo.use_rslora else ''}, {layout.lora[1]} adapted "
            f"layer(s) per decoder layer: {trained:,} trainable parameters per device ({share:.3f}%), the frozen base "
            f"({layout.frozen:,}) holds weights only: no gradient, no master, no AdamW state, no all-reduce")
