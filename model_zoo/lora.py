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

import dataclasses
import math
from typing import Iterable, Mapping

import numpy as np

import mindspore as ms
from mindspore import Parameter, nn
from mindspore.common.initializer import Zero, initializer

from model_zoo import parallel
from model_zoo.errors import ConfigError
from model_zoo.linear import Linear

MAX_RANK = 4096            # far past any published adapter (PEFT's examples: 4 to 256)


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """The numbers of one LoRA adapter (PEFT ``LoraConfig``'s ``r``, ``lora_alpha``, ``lora_dropout``,
    ``use_rslora``)."""

    r: int
    alpha: float
    dropout: float = 0.0
    use_rslora: bool = False

    def __post_init__(self):
        if isinstance(self.r, bool) or not isinstance(self.r, int) or not 1 <= self.r <= MAX_RANK:
            raise ConfigError(f"LoRA r {self.r!r}: expected an integer in [1, {MAX_RANK}]")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ConfigError(f"LoRA alpha {self.alpha!r}: expected a finite number > 0")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ConfigError(f"LoRA dropout {self.dropout!r}: expected a number in [0, 1)")

    @property
    def scaling(self) -> float:
        """PEFT ``update_layer``: lora_alpha / sqrt(r) with use_rslora, else lora_alpha / r."""
        return self.alpha / math.sqrt(self.r) if self.use_rslora else self.alpha / self.r


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


def kaiming_bound(in_features: int) -> float:
    """PEFT's ``nn.init.kaiming_uniform_(lora_A.weight, a=math.sqrt(5))`` bound: 1 / sqrt(fan_in)."""
    gain = math.sqrt(2.0 / (1.0 + 5.0))
    return gain * math.sqrt(3.0 / in_features)


def draw_initial(shapes: Mapping[str, tuple[int, int]], seed: int) -> dict[str, np.ndarray]:
    """The initial adapter of a run, drawn once in float32 by NumPy (the same numbers on every machine and
    layout): for each ``lora_A`` name (sorted) U(-b, b) with PEFT's Kaiming bound over its full input width,
    every ``lora_B`` zeros. ``shapes``: full (unsharded) shape by parameter name."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        if ".lora_A." in name:
            b = kaiming_bound(shape[1])
            out[name] = rng.uniform(-b, b, size=shape).astype(np.float32)
        else:
            out[name] = np.zeros(shape, np.float32)
    return out


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


def set_adapters(model: nn.Cell, values: Mapping[str, np.ndarray]) -> None:
    """Set every adapter parameter from full (unsharded) float32 arrays, each cut to this rank's slice.
    Every adapter must be given, each with its full shape (ConfigError otherwise)."""
    tp = getattr(model, "tp", None)
    axes = parallel.shard_layout(model) if tp is not None else {}
    shapes = adapter_shapes(model)
    missing = sorted(set(shapes) - set(values))
    if missing:
        raise ConfigError(f"LoRA: no initial value for {len(missing)} adapter(s): {missing[:3]}")
    params = {p.name: p for p in model.get_parameters()}
    for name, shape in shapes.items():
        full = np.asarray(values[name], np.float32)
        if tuple(full.shape) != shape:
            raise ConfigError(f"LoRA: {name} has shape {list(full.shape)}, the model needs {list(shape)}")
        part = parallel.split_shard(full, axes.get(name), tp.rank, tp.size) if tp is not None else full
        p = params[name]
        p.set_data(ms.Tensor(part).astype(p.dtype))


def lora_layers(model: nn.Cell) -> dict[str, Linear]:
    """Zoo path -> LoRA layer, for every layer :func:`apply_lora` adapted."""
    return {path: c for path, c in model.cells_and_names() if isinstance(c, Linear) and getattr(c, "lora_on", False)}
