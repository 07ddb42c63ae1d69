"""LoRA (Hu et al. 2021, arXiv:2106.09685) on the zoo's linear layers, exact to HF PEFT's ``LoraLayer``.

What PEFT computes (huggingface/peft ``src/peft/tuners/lora/layer.py``, ``Linear.forward`` and
``LoraLayer.update_layer``, v0.21): ``result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``, the
base layer's bias included in ``base_layer(x)``; ``scaling = lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with
``use_rslora`` (Kalajdzievski 2023, arXiv:2312.03732); ``lora_A`` (r, in) drawn Kaiming-uniform with
``a = sqrt(5)`` (``nn.init.kaiming_uniform_``: bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)),
so U(-1/sqrt(in), 1/sqrt(in))), ``lora_B`` (out, r) zeros; dropout an ``nn.Dropout(p)`` on the adapter's
input only, the identity at p = 0. A LoRA layer here is the zoo's own :class:`model_zoo.linear.Linear` (or
its tensor-parallel shard) with two more parameters, ``<layer>.lora_A.weight`` and ``<layer>.lora_B.weight``:
the base weight keeps its name, so the HF loader and the converters' name maps are unchanged, and PEFT's
key ``base_model.model.<hf module>.lora_A.weight`` is the zoo name through ``converters/names.py``.

Tensor parallel (Megatron's split, as NeMo's ``ParallelLinearAdapter`` and MindSpeed-LLM's LoRA cut it):

- column-parallel layer (q/k/v, gate/up: output rows split): ``lora_B`` is split by rows like the base weight,
  ``lora_A`` is whole on every rank. Each rank's ``h = x A^T`` is the same, but the gradient reaching ``h``
  is only its own rows' part, so ``A`` enters through :class:`model_zoo.parallel.CopyToTP` (forward identity,
  backward AllReduce): every rank then holds the full, equal gradient of ``A``, like a replicated norm's.
- row-parallel layer (o, down: input columns split): ``lora_A`` is split by columns like the base weight,
  ``lora_B`` is whole. Each rank's ``x_local A_local^T`` is a partial sum of ``h``, added over the group by
  :class:`model_zoo.parallel.ReduceFromTP` (forward AllReduce, backward identity) before ``B``; ``B``'s
  gradient is then equal on every rank.

Frozen base: every parameter that is not an adapter (or named trainable: ``modules_to_save``, ``bias``) gets
``requires_grad = False``, so ``model.trainable_params()`` (what the training step differentiates, reduces
and updates, and what a checkpoint holds) is the adapters alone.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

import mindspore as ms
from mindspore import Parameter, nn
from mindspore.common.initializer import Zero, initializer

from model_zoo import parallel
from model_zoo.errors import ConfigError
from model_zoo.linear import Linear
from model_zoo.lora_spec import LoraSpec

class LoraFactor(nn.Cell):
    """One LoRA matrix as a cell with one ``weight`` (PEFT's ``lora_A`` / ``lora_B`` are ``nn.Linear``s), so its
    name is ``<layer>.lora_A.weight``. ``tp_axes``: its tensor-parallel split (model_zoo/parallel.py shard_layout)."""

    def __init__(self, shape: tuple[int, int], dtype: ms.Type, axis: int | None):
        super().__init__()
        # zeros until init_adapters or a checkpoint sets it: never a random draw of MindSpore's own
        self.weight = Parameter(initializer(Zero(), shape, dtype), name="weight")
        self.tp_axes = {} if axis is None else {"weight": axis}


def attach(layer: Linear, spec: LoraSpec, tp: parallel.TensorParallel | None) -> None:
    """Make ``layer`` a LoRA layer of ``spec`` (its forward: model_zoo/linear.py ``Linear._lora``)."""
    out_f, in_f = layer.weight.shape
    dtype = layer.weight.dtype
    a_axis = b_axis = None
    if isinstance(layer, parallel.ColumnParallelLinear):
        b_axis = 0
        layer.lora_a_sum = parallel.CopyToTP(tp)     # dA: each rank's rows' share, added over the group
    elif isinstance(layer, parallel.RowParallelLinear):
        a_axis = 1
        layer.lora_h_sum = parallel.ReduceFromTP(tp)  # h = x A^T: each rank's columns' share, added
    layer.lora_A = LoraFactor((spec.r, in_f), dtype, a_axis)
    layer.lora_B = LoraFactor((out_f, spec.r), dtype, b_axis)
    layer.lora_dropout = nn.Dropout(p=spec.dropout) if spec.dropout > 0 else None
    layer.lora_scaling = float(spec.scaling)
    layer.lora_rank = spec.r
    layer.lora_on = True


def apply_lora(model: nn.Cell, spec: LoraSpec, targets: Iterable[str], trainable: Iterable[str] = ()) -> list[str]:
    """Attach LoRA to the linear cells at the zoo paths ``targets`` (``model.layers.0.attention.wq``), freeze
    every other parameter but the names in ``trainable`` (modules_to_save, biases), and return the adapter
    parameters' names. A path that is not a linear layer of ``model`` is a ConfigError naming it."""
    cells = dict(model.cells_and_names())
    tp = getattr(model, "tp", None)
    targets = list(targets)
    for path in targets:
        cell = cells.get(path)
        if not isinstance(cell, Linear):
            found = "missing" if cell is None else type(cell).__name__
            raise ConfigError(f"LoRA target {path}: {found} in the zoo model, expected a linear layer")
        if getattr(cell, "lora_on", False):
            raise ConfigError(f"LoRA target {path}: named twice")
        attach(cell, spec, tp)
    names = []
    for path in targets:   # attached after the model was built: the full path is set here, as a build would
        for leaf in ("lora_A", "lora_B"):
            p = getattr(cells[path], leaf).weight
            p.name = f"{path}.{leaf}.weight"
            names.append(p.name)
    keep = set(names) | set(trainable)
    params = {p.name: p for p in model.get_parameters()}
    unknown = sorted(set(trainable) - set(params))
    if unknown:
        raise ConfigError(f"LoRA: trainable parameter(s) {unknown[:4]} not in the zoo model")
    for name, p in params.items():
        p.requires_grad = name in keep
    return names


def adapter_shapes(model: nn.Cell) -> dict[str, tuple[int, int]]:
    """Full (unsharded) shape of every adapter parameter of a LoRA model, by name."""
    tp = getattr(model, "tp", None)
    axes = parallel.shard_layout(model) if tp is not None else {}
    out = {}
    for p in model.get_parameters():
        if ".lora_A." in p.name or ".lora_B." in p.name:
            axis = axes.get(p.name)
            out[p.name] = tuple(n * tp.size if i == axis else n for i, n in enumerate(p.shape))
    return out


def set_values(model: nn.Cell, values: Mapping[str, np.ndarray]) -> None:
    """Set parameters from full (unsharded) float32 arrays by zoo name, each cut to this rank's tensor-parallel
    slice; every adapter must be among them (ConfigError otherwise), each with its full shape."""
    tp = getattr(model, "tp", None)
    axes = parallel.shard_layout(model) if tp is not None else {}
    params = {p.name: p for p in model.get_parameters()}
    missing = sorted(set(adapter_shapes(model)) - set(values))
    unknown = sorted(set(values) - set(params))
    if missing or unknown:
        raise ConfigError(f"LoRA: no initial value for {missing[:3]}, no parameter {unknown[:3]} in the model")
    for name, value in values.items():
        p, axis = params[name], axes.get(name)
        full = tuple(n * tp.size if i == axis else n for i, n in enumerate(p.shape)) if tp is not None else p.shape
        arr = np.asarray(value, np.float32)
        if tuple(arr.shape) != tuple(full):
            raise ConfigError(f"LoRA: {name} has shape {list(arr.shape)}, the model needs {list(full)}")
        part = parallel.split_shard(arr, axis, tp.rank, tp.size) if tp is not None else arr
        p.set_data(ms.Tensor(part).astype(p.dtype))


def lora_layers(model: nn.Cell) -> dict[str, Linear]:
    """Zoo path -> LoRA layer, for every layer :func:`apply_lora` adapted."""
    return {path: c for path, c in model.cells_and_names() if isinstance(c, Linear) and getattr(c, "lora_on", False)}
