"""Fused-weight checkpoints: a family whose HF checkpoint stacks the zoo's separate weights by rows.

Phi-3 and Phi-4 (``model_type: phi3``, transformers' Phi3Attention / Phi3MLP) store ``qkv_proj`` =
[q_proj; k_proj; v_proj] (q rows, then k, then v, which is how ``Phi3Attention.forward`` slices its
output at ``num_heads * head_dim`` and ``num_key_value_heads * head_dim`` further) and ``gate_up_proj``
= [gate_proj; up_proj] (``Phi3MLP.forward``: ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``). Weights
are (out, in) and row-major, so each part is one contiguous byte range of the fused tensor:

* reading (HF -> zoo, ``open_hf``): :func:`unfuse_source` shows the checkpoint as the separate tensors,
  each a byte range of its fused tensor (:class:`PartInfo`), so the Llama name map, the coverage and shape
  checks, the streaming copy and the loaders see a Llama-style checkpoint, and conversion stays a copy;
* writing (zoo -> HF): :func:`fuse_planned` joins the parts back into one output tensor
  (:class:`FusedInfo`), whose bytes are the parts' bytes in row order: HF -> MS -> HF is bitwise.

The split is recorded in the conversion's manifest (:func:`manifest_entry`). The array forms of the same
transforms are :func:`split_rows` and :func:`fuse_rows`, an inverse pair (``split(fuse(x)) == x``).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from converters.safetensors_io import TensorInfo
from model_zoo.errors import CheckpointError

# HF fused tensor -> its parts in row order, each with the config size that gives its rows.
FUSED: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "phi3": {
        "model.layers.{}.self_attn.qkv_proj.weight": (("model.layers.{}.self_attn.q_proj.weight", "q_size"),
                                                      ("model.layers.{}.self_attn.k_proj.weight", "kv_size"),
                                                      ("model.layers.{}.self_attn.v_proj.weight", "kv_size")),
        "model.layers.{}.mlp.gate_up_proj.weight": (("model.layers.{}.mlp.gate_proj.weight", "intermediate_size"),
                                                    ("model.layers.{}.mlp.up_proj.weight", "intermediate_size")),
    },
}


def split_rows(x: np.ndarray, rows: Sequence[int]) -> list[np.ndarray]:
    """The parts of a fused (out, in) weight: consecutive blocks of ``rows`` rows."""
    if sum(rows) != x.shape[0]:
        raise CheckpointError(f"a fused tensor of {x.shape[0]} rows cannot split into {list(rows)}")
    return np.split(x, np.cumsum(rows)[:-1], axis=0)


def fuse_rows(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The fused weight of ``parts`` stacked by rows (the inverse of :func:`split_rows`)."""
    return np.concatenate(parts, axis=0)


@dataclasses.dataclass(frozen=True)
class PartInfo(TensorInfo):
    """A separate weight read as a byte range of its fused HF tensor."""

    fused_name: str = ""
    rows: tuple[int, int] = (0, 0)   # [first, last) rows of the fused tensor


@dataclasses.dataclass(frozen=True)
class FusedInfo(TensorInfo):
    """An HF fused tensor written from its separate parts (``begin``/``end`` span them when contiguous)."""

    parts: tuple[TensorInfo, ...] = ()

    @property
    def contiguous(self) -> bool:
        return all(a.end == b.begin for a, b in zip(self.parts, self.parts[1:]))


def _layer(template: str, name: str) -> str | None:
    head, _, tail = template.partition("{}")
    if name.startswith(head) and name.endswith(tail):
        mid = name[len(head):len(name) - len(tail)]
        return mid if mid.isdigit() else None
    return None


def parts_of(cfg, name: str) -> list[tuple[str, int]] | None:
    """(part name, rows) of the fused HF tensor ``name``, or None when it is not one of ``cfg``'s."""
    for fused, parts in FUSED.get(cfg.model_type, {}).items():
        layer = _layer(fused, name)
        if layer is not None:
            return [(p.replace("{}", layer), getattr(cfg, size)) for p, size in parts]
    return None


def parts_of_any(name: str) -> bool:
    """Whether ``name`` is a fused tensor of some family (before its config.json is read)."""
    return any(_layer(t, name) is not None for table in FUSED.values() for t in table)


def _fused_of(cfg, name: str) -> tuple[str, int] | None:
    """(fused HF name, part index) of the separate HF tensor ``name``, or None."""
    for fused, parts in FUSED.get(cfg.model_type, {}).items():
        for k, (p, _) in enumerate(parts):
            layer = _layer(p, name)
            if layer is not None:
                return fused.replace("{}", layer), k
    return None


def split_info(t: TensorInfo, parts: list[tuple[str, int]]) -> list[PartInfo]:
    """The byte ranges of ``t``'s parts (row-major (out, in): a part is contiguous)."""
    if len(t.shape) != 2 or t.shape[0] != sum(r for _, r in parts):
        raise CheckpointError(f"tensor {t.name}: shape {list(t.shape)}, expected ({sum(r for _, r in parts)}, "
                              f"hidden_size) rows {[r for _, r in parts]} as config.json implies")
    row_bytes = t.nbytes // t.shape[0]
    out, row, pos = [], 0, t.begin
    for name, rows in parts:
        out.append(PartInfo(name, t.dtype, (rows, t.shape[1]), pos, pos + rows * row_bytes, t.name, (row, row + rows)))
        row, pos = row + rows, pos + rows * row_bytes
    return out


def unfuse_tensors(cfg, tensors: Sequence[TensorInfo], where: str) -> tuple[TensorInfo, ...]:
    """``tensors`` (one HF file's, in data order) with every fused tensor replaced by its parts."""
    out: list[TensorInfo] = []
    for t in tensors:
        parts = parts_of(cfg, t.name)
        if parts is None:
            out.append(t)
        else:
            try:
                out.extend(split_info(t, parts))
            except CheckpointError as e:
                raise CheckpointError(f"{where}: {e}") from None
    return tuple(out)


def fuse_planned(cfg, planned: list, out_tensor) -> list:
    """MS -> HF: (source, output) pairs whose outputs are parts of one fused HF tensor joined into one pair
    (:class:`FusedInfo`, the output the fused tensor) at the place of its last part. ``out_tensor(name,
    dtype, shape)`` makes an output tensor. Every part must be in the same file."""
    groups: dict[str, dict[int, tuple]] = {}
    out: list = []
    for t, o in planned:
        hit = _fused_of(cfg, o.name)
        if hit is None:
            out.append((t, o))
            continue
        fused, k = hit
        groups.setdefault(fused, {})[k] = (t, o)
        n = len(FUSED[cfg.model_type][_template_of(cfg, fused)])
        if len(groups[fused]) == n:
            members = [groups[fused][i] for i in range(n)]
            src = [m[0] for m in members]
            rows = sum(m[1].shape[0] for m in members)
            shape = (rows, members[0][1].shape[1])
            info = FusedInfo(fused, src[0].dtype, shape, src[0].begin, src[-1].end, tuple(src))
            out.append((info, out_tensor(fused, members[0][1].dtype, shape)))
            del groups[fused]
    if groups:
        left = sorted(groups)
        raise CheckpointError(f"the parts of {', '.join(left[:3])} are not all in one file of the MindSpore "
                              "checkpoint; fused HF tensors are written from parts stored in the same file")
    return out


def _template_of(cfg, fused_name: str) -> str:
    return next(t for t in FUSED[cfg.model_type] if _layer(t, fused_name) is not None)


def manifest_entry(cfg) -> dict | None:
    """How the fused HF tensors map onto the zoo's separate weights, for the conversion manifest."""
    table = FUSED.get(cfg.model_type)
    if not table:
        return None
    return {fused: [{"part": p, "rows": getattr(cfg, size), "rows_from": size} for p, size in parts]
            for fused, parts in table.items()}


def split_named(cfg, name: str, value: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """(name, array) pairs of an HF tensor as the zoo's separate weights (the tensor itself when not fused);
    for per-tensor comparisons such as gradient norms."""
    parts = parts_of(cfg, name)
    if parts is None:
        return [(name, value)]
    return list(zip((p for p, _ in parts), split_rows(value, [r for _, r in parts])))


def fuse_named(cfg, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``tensors`` (HF names, the zoo's separate weights) with every fused family's parts joined into the
    tensor its HF checkpoint stores (the inverse of :func:`split_named` over a whole state dict)."""
    out = dict(tensors)
    for template, parts in FUSED.get(cfg.model_type, {}).items():
        for layer in range(cfg.num_hidden_layers):
            members = [p.replace("{}", str(layer)) for p, _ in parts]
            if all(m in out for m in members):
                out[template.replace("{}", str(layer))] = fuse_rows([out.pop(m) for m in members])
    return out


def stored_names(cfg, hf_names: Sequence[str]) -> list[str]:
    """HF names as a fused family's checkpoint stores them: each separate part named by its fused tensor
    (once), so an error lists the tensors the file has or should have, never the split ones it never holds."""
    out: list[str] = []
    for n in hf_names:
        hit = _fused_of(cfg, n)
        name = hit[0] if hit else n
        if name not in out:
            out.append(name)
    return out


def separate_parts(cfg, hf_names: Sequence[str]) -> list[str]:
    """The names among ``hf_names`` that a fused family's checkpoint never holds (its parts stored apart)."""
    return [n for n in hf_names if _fused_of(cfg, n) is not None]
