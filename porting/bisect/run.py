"""`port bisect`: one forward and backward on a fixed batch, HF + torch against the zoo's MindSpore cell
from the same weights, every sub-block compared, the first divergent one named.

The reference runs first: each tapped tensor and each parameter gradient is written to a temporary
directory (``.npy``, read back memory-mapped) and the torch model is dropped, so peak memory is one
framework's model and gradients, not two. The MindSpore run then compares each tensor the moment its
hook sees it and keeps only the statistics (:mod:`porting.bisect.rows`); full tensors are written
only for the layer named by ``dump_layer``.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from converters import fused
from model_zoo.errors import ConfigError, PortingError
from porting.bisect import blocks, rows as rowing
from porting.bisect.rows import Row
from porting.verify.stats import compare


def slot_name(layer: int | None, block: str) -> str:
    return block if layer is None else f"layers.{layer}.{block}"


class RefStore:
    """The reference side's tensors on disk, one ``.npy`` per tensor (first write wins)."""

    def __init__(self, root: Path):
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / (key.replace("/", "_") + ".npy")

    def put(self, key: str, a: np.ndarray) -> None:
        p = self._path(key)
        if not p.exists():
            np.save(p, np.asarray(a, np.float32))

    def get(self, key: str) -> np.ndarray | None:
        p = self._path(key)
        return np.load(p, mmap_mode="r") if p.exists() else None

    def record(self, phase: str, layer: int | None, block: str, a: np.ndarray) -> None:
        self.put(f"{phase}.{slot_name(layer, block)}", a)


def run_reference(model, micro: list, total: int, store: RefStore, table: dict,
                  update: Callable | None = None, name_of: Callable[[str], str] | None = None) -> float:
    """HF + torch forward and backward of every micro-batch (loss: summed token cross-entropy over
    ``total`` target tokens, as `port train` and `port baseline` take it), every block of the first
    micro-batch tapped into ``store``, parameter gradients (and ``update(model)``'s per-parameter AdamW
    updates, zoo names) stored; the model is released. Returns the loss."""
    import torch

    from converters import names
    from porting.baseline.torch_loop import token_loss_sum
    from porting.bisect import taps_hf

    loss = 0.0
    with taps_hf.instrumented(model, store.record):
        for ids, labels in micro:
            logits = model(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits
            part = token_loss_sum(logits, torch.as_tensor(labels, dtype=torch.long)) / total
            part.backward()
            loss += float(part.detach())
            del logits, part
    store.record("forward", None, "loss", np.float32(loss))
    for n, p in model.named_parameters():
        if p.grad is not None:
            store.put(f"param.{name_of(n) if name_of else names.map_name(n, table)}", p.grad.detach().float().numpy())
    for name, arr in (update(model) if update is not None else {}).items():
        store.put(f"update.{name}", arr)
    return loss


class Comparator:
    """Turns each MindSpore tensor into a Row against the stored reference, the moment it is seen."""

    def __init__(self, store: RefStore, order: blocks.Order, kernels: dict, dtype: str, dump_layer: int | None):
        self.store, self.order, self.kernels, self.dtype = store, order, kernels, dtype
        self.rows: dict[tuple, Row] = {}
        self.dump_layer = dump_layer
        self.dumped: dict[str, np.ndarray] = {}

    def record(self, phase: str, layer: int | None, block: str, a: np.ndarray) -> None:
        key = (phase, layer, block)
        if key in self.rows:
            return
        name = slot_name(layer, block)
        kernel = blocks.kernel_of(self.kernels, layer, self.order.kernels[(layer, block)])
        tensor = name if phase == "forward" else f"d loss / d {name}"
        self.rows[key] = self._row(self.order.key(phase, layer, block), phase, layer, block, tensor, kernel,
                                   a, self.store.get(f"{phase}.{name}"))

    def record_param(self, name: str, a: np.ndarray, phase: str = "backward") -> None:
        layer, block = blocks.param_block(name, self.order.model_type)
        pos = self.order.param(name) if phase == "backward" else self.order.update(name)
        tensor = f"d loss / d {name}" if phase == "backward" else f"AdamW update of {name}"
        key = "param." + name if phase == "backward" else "update." + name
        self.rows[(key,)] = self._row(pos, phase, layer, block, tensor, blocks.kernel_of(
            self.kernels, layer, self.order.kernels[(layer, block)]), a, self.store.get(key))

    def _row(self, pos, phase, layer, block, tensor, kernel, a, ref) -> Row:
        measure, tol = rowing.tolerance_for(self.dtype, phase, block)
        if ref is None:
            return Row(pos, phase, layer, block, tensor, kernel, None, measure, tol, "not observed on the HF side")
        if tuple(ref.shape) != tuple(np.shape(a)):
            return Row(pos, phase, layer, block, tensor, kernel, None, measure, tol,
                       f"shapes differ: MindSpore {list(np.shape(a))}, HF {list(ref.shape)}")
        if layer is not None and layer == self.dump_layer:
            self.dumped[f"ms/{phase}/{tensor}"] = np.array(a, np.float32)
            self.dumped[f"hf/{phase}/{tensor}"] = np.array(ref, np.float32)
        return Row(pos, phase, layer, block, tensor, kernel, compare(a, ref), measure, tol)

    def unobserved(self, n_layers: int, frozen: str | None = None) -> None:
        """Rows for blocks the MindSpore side never produced (a fused kernel computes them inside; with
        ``frozen``, a backward row neither side computes: that reason)."""
        for layer, block, k in self.order.slots:
            for phase in ("forward", "backward"):
                if (phase, layer, block) in self.rows or (phase, block) == ("backward", "loss"):
                    continue
                measure, tol = rowing.tolerance_for(self.dtype, phase, block)
                both = frozen if phase == "backward" else None
                self.rows[(phase, layer, block)] = Row(
                    self.order.key(phase, layer, block), phase, layer, block, slot_name(layer, block),
                    blocks.kernel_of(self.kernels, layer, k), None, measure, tol,
                    both or "not observed on the MindSpore side (computed inside a fused kernel)")


def run_mindspore(model, micro: list, total: int, comp: Comparator, update: Callable | None = None) -> float:
    """The zoo cell's forward and backward of every micro-batch in PyNative, every block of the first
    tapped; parameter gradients (summed over micro-batches) compared, and ``update(params, grads)``'s
    per-parameter AdamW updates. Returns the loss."""
    import mindspore as ms

    from model_zoo.loss import shifted_token_loss
    from porting.bisect import taps_ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    params = model.trainable_params()

    def loss_fn(inp, labels):
        logits = model(inp)
        taps_ms.tap(comp.record, None, "logits", logits)
        return shifted_token_loss(logits, labels)[0] / total

    loss, acc = 0.0, None
    with taps_ms.instrumented(model, comp.record):
        for ids, labels in micro:
            part, grads = ms.value_and_grad(loss_fn, None, params)(ms.Tensor(ids.astype(np.int32)),
                                                                   ms.Tensor(labels.astype(np.int32)))
            loss += float(part.asnumpy())
            acc = grads if acc is None else tuple(a + g for a, g in zip(acc, grads))
    comp.record("forward", None, "loss", np.float32(loss))
    for p, g in zip(params, acc):
        comp.record_param(p.name, taps_ms._np(g))
    for name, arr in (update(params, acc) if update is not None else {}).items():
        comp.record_param(name, arr, phase="update")
    return loss


def compare_runs(hf_model, model, micro: list, total: int, dtype: str, *, dump_layer: int | None = None,
                 ref_update: Callable | None = None, ms_update: Callable | None = None,
                 name_of: Callable[[str], str] | None = None, frozen: str | None = None) -> tuple[Comparator, dict]:
    """Both sides on the same micro-batches: the reference first (spilled to a temporary directory and
    released), then the MindSpore model compared as it runs. (comparator, losses and seconds)."""
    from converters import names

    cfg = model.config
    table = names.NAME_MAPS[cfg.model_type]
    order = blocks.Order(cfg.num_hidden_layers, [p.name for p in model.trainable_params()], cfg.model_type)
    comp = Comparator(None, order, blocks.kernel_names(model.kernel_report()), dtype, dump_layer)
    root = Path(tempfile.mkdtemp(prefix="port-bisect-"))
    try:
        comp.store = RefStore(root)
        t0 = time.perf_counter()
        hf_loss = run_reference(hf_model(), micro, total, comp.store, table, ref_update, name_of)
        gc.collect()
        t1 = time.perf_counter()
        ms_loss = run_mindspore(model, micro, total, comp, ms_update)
        t2 = time.perf_counter()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    comp.unobserved(cfg.num_hidden_layers, frozen)
    return comp, {"loss": {"ms": ms_loss, "hf": hf_loss}, "seconds": {"hf": round(t1 - t0, 3), "ms": round(t2 - t1, 3)}}


def bisect(hf_dir: str | Path, ms_src: str | Path, *, ids: list[int] | None = None, data: str | None = None,
           dtype: str = "float32", batch: int = 2, seq: int = 32, seed: int = 0, nan_origin: bool = False,
           dump_layer: int | None = None, dump_dir: str | Path | None = None,
           kernels_override: dict | None = None, ms_hook: Callable | None = None) -> dict:
    """The bisection report (a dict; see docs/bisect.md). ``ms_hook(model)`` runs on the built and
    loaded MindSpore model before the run (a test hook: perturbations of one layer)."""
    from porting.bisect import inputs
    from porting.verify.pair import load_pair

    pair = load_pair(hf_dir, dtype=dtype, kernels_override=kernels_override)
    cfg = pair.cfg
    if cfg.model_type in fused.FUSED:   # its HF modules compute q/k/v (and gate/up) in one matmul each
        raise ConfigError(f"port bisect: {cfg.model_type} checkpoints fuse q/k/v and gate/up into one HF module "
                          "each, which bisect cannot tap block by block; compare them with port verify --hf DIR "
                          "--hidden-states --grads")
    w = inputs.resolve_ms(ms_src, cfg)
    notes = inputs.config_notes(cfg, w.cfg, w.path)
    if dump_layer is not None and not 0 <= dump_layer < cfg.num_hidden_layers:
        raise ConfigError(f"--dump-layer {dump_layer}: expected 0 to {cfg.num_hidden_layers - 1}")
    dump = _dump_target(dump_dir, dump_layer)
    batch_ids = inputs.batch_ids(cfg, pair.hf_dir, ids=ids, data=data, batch=batch, seq=seq, seed=seed)
    pair = dataclasses.replace(pair, weights=w.path, kind=w.kind)
    model = pair.zoo(w.cfg)
    if ms_hook is not None:
        ms_hook(model)
    micro = [(batch_ids, batch_ids)]
    total = batch_ids.shape[0] * (batch_ids.shape[1] - 1)
    comp, out = compare_runs(pair.reference, model, micro, total, dtype,
                             dump_layer=dump_layer)
    if dump is not None:
        _write_dump(dump, comp.dumped)
    rows = sorted(comp.rows.values(), key=lambda r: r.order)
    return report(rows, nan_origin=nan_origin, hf_dir=str(pair.hf_dir), ms=str(w.path), weights=w.kind, dtype=dtype,
                  batch=list(batch_ids.shape), notes=notes, kernels=model.plan.as_dict(), **out,
                  dump=str(dump) if dump else None)


def report(rows: list[Row], *, nan_origin: bool = False, **meta) -> dict:
    """The JSON report: meta, every row, ``first_divergent`` (and ``first_nonfinite``)."""
    first = rowing.first_divergent(rows)
    nan = rowing.first_divergent(rows, nan_origin=True)

    def brief(r: Row | None) -> dict | None:
        if r is None:
            return None
        d = r.to_dict()
        return {k: d[k] for k in ("layer", "block", "phase", "tensor", "kernel", "metrics", "measure", "tolerance")}
    unobserved = sum(r.stats is None for r in rows)
    return {**meta, "mode": "nan-origin" if nan_origin else "divergence", "rows": [r.to_dict() for r in rows],
            "compared": len(rows) - unobserved, "unobserved": unobserved,
            "first_divergent": brief(first), "first_nonfinite": brief(nan),
            "verdict": _verdict(first, nan, nan_origin)}


def _verdict(first: Row | None, nan: Row | None, nan_origin: bool) -> str:
    r = nan if nan_origin else first
    if r is None:
        return "no non-finite value" if nan_origin else "no divergence: every row within tolerance"
    where = "" if r.layer is None else f"layer {r.layer} "
    what = "first non-finite" if nan_origin else "first divergence"
    return f"{what}: {where}{r.block}, {r.phase} ({r.tensor})"


def _dump_target(dump_dir, dump_layer) -> Path | None:
    if dump_layer is None:
        return None
    if dump_dir is None:
        raise ConfigError("--dump-layer needs --dump-dir DIR (where the layer's full tensors are written)")
    out = Path(dump_dir) / f"bisect_layer{dump_layer}.npz"
    if out.exists():
        raise ConfigError(f"{out}: already exists; port does not overwrite it, remove it or pick another --dump-dir")
    if not Path(dump_dir).is_dir():
        raise ConfigError(f"{dump_dir}: --dump-dir is not a directory; create it first")
    return out


def _write_dump(out: Path, arrays: dict[str, np.ndarray]) -> None:
    from model_zoo.files import write_atomic

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(out, buf.getvalue(), error=PortingError)
