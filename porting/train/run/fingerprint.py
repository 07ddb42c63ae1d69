"""`port train`'s side of the fingerprints (``logging.fingerprint_every: N``; the format, the statistics and why they
compose: porting/rundir/fingerprints.py; what reads them: `port diverge`, docs/diverge.md).

At a sampled step a rank records, keyed by HF name (converters/names.py, the map every converter uses):

- ``batch``: its rows' real tokens (every data-parallel rank, tensor-parallel rank 0): the data order;
- ``forward``: each decoder layer's output on the real positions of its rows (a forward hook on the layer; hooks
  exist in PyNative only, https://www.mindspore.cn/docs/en/r2.3.1/api_python/nn/mindspore.nn.Cell.html
  #mindspore.nn.Cell.register_forward_hook), summed over micro-batches and data-parallel ranks by the reader;
- ``collective``: each gradient bucket's all-reduce, its input on every data-parallel rank and its output
  (PyNative with port's overlapped buckets: porting/train/run/fingerprint_collective.py);
- ``gradient``: each parameter's gradient after the data-parallel reduction and the unscale, before clipping
  (PyNative: the step cell hands them to :meth:`Fingerprinter.gradients`, porting/train/run/step/cells.py; not
  under ZeRO, whose gradients are reduce-scattered flat shards);
- ``update``: each parameter after the step minus before (host copies, into buffers held while fingerprints are
  on: one float32 copy of the parameters; graph mode too).

Parameters are written by data-parallel rank 0 only (every data-parallel rank holds the same ones); a
tensor-parallel slice by each tensor-parallel rank with its logical offset, a replicated one by tensor-parallel
rank 0. ``PORT_TEST_PLANT_DIVERGENCE`` (porting/train/run/faults.py) multiplies one of those tensors by 1+r at
one step on every rank.
"""

from __future__ import annotations

import logging

import mindspore as ms
import numpy as np

from converters import names
from model_zoo.errors import RecipeError
from porting.rundir import fingerprints as fp
from porting.rundir.paths import RunDir
from porting.train.run.faults import Faults
from porting.train.run.fingerprint_collective import CollectiveTap
from porting.train.run.fingerprint_collective import host_float32 as _np   # its copy: Fingerprinter._copy
from porting.train.run.step.buckets import OverlappedGradBuckets


def hf_names(model) -> list[str]:
    """The HF name of each trainable parameter, in ``trainable_params()`` order (the optimizer's)."""
    table = {v: k for k, v in names.NAME_MAPS[model.config.model_type].items()}
    out = []
    for p in model.trainable_params():
        hf = names.map_name(p.name, table)
        out.append(hf if hf is not None else p.name)   # a name the map lacks is kept as the zoo spells it
    return out


def _lengths(mb, examples) -> list[int]:
    """Each row's real positions (right-padded rows); a packed row counts whole (its padding included)."""
    b, s = mb.input_ids.shape
    if mb.packed is not None:
        return [s] * b
    out = [min(int(examples[i].length), s) for i in mb.example_ids]
    return out + [0] * (b - len(out))


class Fingerprinter:
    """One rank's recorder; ``every`` 0 with a plant set: the plant alone, nothing written."""

    def __init__(self, trainer, every: int, plant: tuple | None, log: logging.Logger):
        self.ms, self.every, self.plant, self.log = ms, every, plant, log
        self.pynative = ms.get_context("mode") == ms.PYNATIVE_MODE
        grid, model = trainer.grid, trainer.model
        self.model, self.params = model, list(model.trainable_params())
        self.names = hf_names(model)
        self.examples = trainer.plan.data.examples
        self.layout, self.tp, self.tp_rank = trainer.layout, grid.tp, grid.tp_rank
        self.writes_params = grid.dp_rank == 0
        self.writes_rows = grid.tp_rank == 0
        self.zero = trainer.zero is not None
        # the overlapped gradient buckets' all-reduce (PyNative, one micro-batch a step, DP > 1): its fingerprints
        self.reducer = next((r for r in (getattr(c, "reducer", None) for c in trainer.cells)
                             if isinstance(r, OverlappedGradBuckets)), None)
        self.sampled, self.step_no, self.before, self.acts = False, 0, {}, {}
        self.buffers: dict[int, np.ndarray] = {}   # the host copies' memory, reused (:meth:`_copy`)
        self.calls: dict[int, int] = {}
        self.lengths: list[list[int]] = []
        self.recompute = trainer.recipe.memory.recompute
        self.writer = None
        if every:
            header = {"source": "port", "rank": grid.rank, "world": grid.world, "tp": grid.tp, "dp": grid.dp,
                      "zero": self.zero, "execution": trainer.recipe.execution, "every": every,
                      "dtype": trainer.recipe.precision.compute_dtype, "layout": "zoo", "planted": _plant_text(plant),
                      "phases": self.phases()}
            self.writer = fp.Writer(RunDir(trainer.run_dir).fingerprint_file(grid.rank), header, log.warning)
        self._check_plant()
        self._check_pairs()
        self.handles: list = []   # the forward hooks, on a sampled (or the planted forward) step only

    def phases(self) -> list[str]:
        out = ["batch"]
        if self.pynative and not self.recompute:
            out.append("forward")
        if self.reducer is not None:
            out.append("collective")
        if self.pynative and not self.zero:
            out.append("gradient")
        return out + ["update"]

    def _check_plant(self) -> None:
        if self.plant is None:
            return
        step, name, phase, _ = self.plant
        if phase not in self.phases():
            raise RecipeError(f"PORT_TEST_PLANT_DIVERGENCE: phase {phase} is not observable in this run (records "
                              f"{', '.join(self.phases())}); plant it under execution: pynative without "
                              "memory.recompute or ZeRO (collective: with data parallelism and "
                              "batching.grad_accum_steps: 1), or plant an update")
        known = [f"model.layers.{i}" for i in range(len(self.model.model.layers))] if phase == "forward" else self.names
        if name not in known:
            raise RecipeError(f"PORT_TEST_PLANT_DIVERGENCE: {name!r} is no {phase} tensor of this model; expected "
                              f"one of {', '.join(known[:4])}, ...")

    def _check_pairs(self) -> None:
        """A tensor-parallel slice's digest composes when its element pairs are logical pairs: when the slab below
        its split axis holds an even count (porting/rundir/fingerprints.py); refused before the first step."""
        if not self.every or self.tp == 1:
            return
        for p, name in zip(self.params, self.names):
            axis = self.layout.get(p.name)
            if axis is not None and int(np.prod(p.shape[axis:])) % 2:
                raise RecipeError(f"logging.fingerprint_every: {name}'s tensor-parallel slice {tuple(p.shape)} (split "
                                  f"on axis {axis}) holds an odd count per slab, so its fingerprint digest cannot "
                                  "compose; set logging.fingerprint_every: 0 or another parallel.tensor_parallel")

    # -- the step
    def begin(self, step) -> None:
        """Before step ``step`` (a data Step) runs: record its batch, copy the parameters for the update."""
        self.step_no = n = step.index + 1
        self.sampled = self.writer is not None and n % self.every == 0
        self.calls, self.acts = {}, {}
        self.lengths = [_lengths(mb, self.examples) for mb in step.micro_batches]
        planting_update = self.plant is not None and self.plant[0] == n and self.plant[2] == "update"
        planting_forward = self.plant is not None and self.plant[0] == n and self.plant[2] == "forward"
        if "forward" in self.phases() and ((self.sampled and self.writes_rows) or planting_forward):
            self.handles = self._hook_layers()
        if self.sampled and self.writes_rows:
            tokens = fp.EMPTY
            for mb, lens in zip(step.micro_batches, self.lengths):
                tokens = tokens + fp.rows_stat(mb.input_ids.astype(np.float32), lens)
            self.writer.record(n, "batch", "input_ids", tokens)
        if (self.sampled and self.writes_params) or planting_update:
            self.before = {i: self._copy(i) for i in range(len(self.params))}

    def _copy(self, i: int) -> np.ndarray:
        """Parameter ``i`` on the host, into a buffer kept from one sampled step to the next (a fresh 4-byte copy of
        every parameter each step costs its page faults again: about a fifth of the fingerprints' time)."""
        host = _np(self.params[i])
        buf = self.buffers.get(i)
        if buf is None or buf.shape != host.shape:
            buf = self.buffers[i] = np.empty(host.shape, np.float32)
        np.copyto(buf, host)
        return buf

    def end(self) -> None:
        """After the step: record (and plant) the updates, write this step's forward records."""
        n = self.step_no
        planted = self.plant if self.plant is not None and self.plant[0] == n and self.plant[2] == "update" else None
        for i, before in self.before.items():
            p = self.params[i]
            if planted is not None and self.names[i] == planted[1]:
                delta = (_np(p) - before) * np.float32(1.0 + planted[3])
                self.ms.ops.assign(p, self.ms.Tensor(before + delta).astype(p.dtype))
                if self.sampled and self.writes_params:
                    self._param("update", i, delta)
            elif self.sampled and self.writes_params:
                self._param("update", i, _np(p), minus=before)
        self.before = {}
        self._unhook()
        if self.sampled:
            for layer in sorted(self.acts):
                self.writer.record(n, "forward", f"model.layers.{layer}", self.acts[layer])
            self.writer.flush()
        self.sampled = False

    def _param(self, phase: str, i: int, arr: np.ndarray, minus: np.ndarray | None = None) -> None:
        """Record parameter ``i``'s ``arr`` (this rank's slice of it; ``minus``: of ``arr - minus``), placed in the
        logical tensor."""
        p = self.params[i]
        axis = self.layout.get(p.name) if self.tp > 1 else None
        if axis is None:
            if self.tp_rank == 0:
                self.writer.record(self.step_no, phase, self.names[i], fp.stat_of(arr, minus=minus))
            return
        full = list(arr.shape)
        full[axis] *= self.tp
        index = fp.shard_index(arr.shape, tuple(full), axis, self.tp_rank * arr.shape[axis])
        self.writer.record(self.step_no, phase, self.names[i], fp.stat_of(arr, index, minus))

    def gradients(self, grads):
        """The step's gradients (reduced, unscaled, before clipping), from the step cell in PyNative: recorded at a
        sampled step, one multiplied at the planted step; returns what the update uses."""
        n = self.step_no
        # with overlapped buckets the gradient is planted as it enters its bucket, before the all-reduce (the tap)
        if self.plant is not None and self.plant[0] == n and self.plant[2] == "gradient" and self.reducer is None:
            k = self.names.index(self.plant[1])
            grads = tuple(g * (1.0 + self.plant[3]) if i == k else g for i, g in enumerate(grads))
        if self.sampled and self.writes_params:
            for i, g in enumerate(grads):
                self._param("gradient", i, _np(g))
        return grads

    # -- the forward hooks
    def _hook_layers(self) -> list:
        return [layer.register_forward_hook(self._on_layer(i)) for i, layer in enumerate(self.model.model.layers)]

    def _on_layer(self, i: int):
        def hook(cell, inputs, output):
            k = self.calls.get(i, 0)
            self.calls[i] = k + 1
            planted = (self.plant is not None and self.plant[0] == self.step_no and self.plant[2] == "forward"
                       and self.plant[1] == f"model.layers.{i}")
            if planted:
                output = output * (1.0 + self.plant[3])
            if self.sampled and self.writes_rows and k < len(self.lengths):
                s = fp.rows_stat(_np(output), self.lengths[k])
                self.acts[i] = self.acts.get(i, fp.EMPTY) + s
            return output if planted else None
        return hook

    def _unhook(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def close(self) -> None:
        self._unhook()
        if self.reducer is not None:
            self.reducer.tap = None
        if self.writer is not None:
            self.writer.close()


def _plant_text(plant: tuple | None) -> str | None:
    return None if plant is None else ":".join(str(x) for x in plant)


def attach(trainer, faults: Faults, log: logging.Logger) -> Fingerprinter | None:
    """The trainer's recorder, handed to its step cells (PyNative gradients); None when neither
    ``logging.fingerprint_every`` nor a plant asks for one (the step then runs exactly as without this module)."""
    every = trainer.recipe.logging.fingerprint_every
    if not every and faults.plant is None:
        return None
    rec = Fingerprinter(trainer, every, faults.plant, log)
    if rec.reducer is not None:
        grid = trainer.grid
        tp_rank = grid.tp_rank if grid.tp > 1 else None
        rec.reducer.tap = CollectiveTap(rec, rec.reducer.bucket_idx, grid.dp_rank, tp_rank)
    if rec.pynative and not rec.zero:
        for cell in trainer.cells:
            if hasattr(cell, "grad_tap"):
                cell.grad_tap = rec.gradients
    if every:
        log.info(f"fingerprints every {every} steps: {', '.join(rec.phases())} ({RunDir(trainer.run_dir).fingerprints})")
    return rec

