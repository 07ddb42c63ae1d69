"""`port baseline run`'s side of the fingerprints: the torch reference records what `port train` records
(porting/train/run/fingerprint.py; the format: porting/rundir/fingerprints.py), under the same HF names, in
``<baseline file>.fingerprints/rank_0.jsonl``, when the recipe sets ``logging.fingerprint_every``.

- ``batch``: the step's rows (every data-parallel rank's, gathered: porting/baseline/runner.py);
- ``forward``: each ``model.layers.<i>`` output on the real positions of its rows (``register_forward_hook``,
  https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_forward_hook);
- ``gradient``: ``p.grad`` after every micro-batch's backward, before ``clip_grad_norm_`` (the loss is already
  the step's mean token loss: porting/baseline/torch_loop.py);
- ``update``: the parameter after ``optimizer.step()`` minus before.

``PORT_TEST_PLANT_DIVERGENCE`` multiplies one of them by 1+r at one step, as in `port train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from porting.rundir import fingerprints as fp


def folder_of(baseline_file: str | Path) -> Path:
    """Where a baseline file's fingerprints are: ``<file>.fingerprints/``."""
    return Path(str(baseline_file) + ".fingerprints")


def _lengths(mb, examples) -> list[int]:
    b, s = mb.input_ids.shape
    out = [min(int(examples[i].length), s) for i in mb.example_ids]
    return out + [0] * (b - len(out))


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()   # a CPU float32 tensor's numpy() shares its memory


class TorchFingerprinter:
    """The recorder of one baseline run; ``every`` 0 with a plant: the plant alone, nothing written."""

    def __init__(self, model, examples, every: int, plant: tuple | None, out: str | Path, dtype: str,
                 warn: Callable[[str], None] = lambda s: None):
        from porting.train.run.faults import FaultHookError

        self.model, self.examples, self.every, self.plant = model, examples, every, plant
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in self.params]
        layers = model.model.layers
        if plant is not None:
            known = [f"model.layers.{i}" for i in range(len(layers))] if plant[2] == "forward" else self.names
            if plant[1] not in known:
                raise FaultHookError(f"PORT_TEST_PLANT_DIVERGENCE: {plant[1]!r} is no {plant[2]} tensor of this "
                                     f"model; expected one of {', '.join(known[:4])}, ...")
        self.writer = None
        if every:
            header = {"source": "torch", "rank": 0, "world": 1, "tp": 1, "dp": 1, "zero": False, "execution": "torch",
                      "every": every, "dtype": dtype, "layout": "hf",
                      "planted": None if plant is None else ":".join(str(x) for x in plant),
                      "phases": [p for p in fp.PHASES if p != "collective"]}
            self.writer = fp.Writer(folder_of(out) / "rank_0.jsonl", header, warn, fresh=True)
        self.step_no, self.sampled, self.lengths, self.calls, self.acts, self.before = 0, False, [], {}, {}, {}
        self.handles = [layer.register_forward_hook(self._on_layer(i)) for i, layer in enumerate(layers)]

    def _planted(self, phase: str, name: str) -> bool:
        p = self.plant
        return p is not None and p[0] == self.step_no and p[2] == phase and p[1] == name

    def begin(self, step: int, micro) -> None:
        """Step ``step`` (0-based) with its gathered micro-batches is about to run."""
        self.step_no = n = step + 1
        self.sampled = self.writer is not None and n % self.every == 0
        self.calls, self.acts = {}, {}
        self.lengths = [_lengths(mb, self.examples) for mb in micro]
        if self.sampled:
            tokens = fp.EMPTY
            for mb, lens in zip(micro, self.lengths):
                tokens = tokens + fp.rows_stat(np.asarray(mb.input_ids, dtype=np.float32), lens)
            self.writer.record(n, "batch", "input_ids", tokens)

    def gradients(self) -> None:
        """After the step's backward, before clipping: record (and plant) the gradients, copy the parameters."""
        for name, p in self.params:
            if p.grad is None:
                continue
            if self._planted("gradient", name):
                p.grad.mul_(1.0 + self.plant[3])
            if self.sampled:
                self.writer.record(self.step_no, "gradient", name, fp.stat_of(_np(p.grad)))
        plant_update = self.plant is not None and self.plant[0] == self.step_no and self.plant[2] == "update"
        if self.sampled or plant_update:
            self.before = {name: _np(p) for name, p in self.params}

    def end(self) -> None:
        """After ``optimizer.step()``: record (and plant) the updates and the forward records of the step."""
        import torch

        for name, p in self.params:
            if name not in self.before:
                continue
            delta = _np(p) - self.before[name]
            if self._planted("update", name):
                delta = delta * np.float32(1.0 + self.plant[3])
                with torch.no_grad():
                    p.copy_(torch.from_numpy(self.before[name] + delta).to(p.dtype))
            if self.sampled:
                self.writer.record(self.step_no, "update", name, fp.stat_of(delta))
        self.before = {}
        if self.sampled:
            for layer in sorted(self.acts):
                self.writer.record(self.step_no, "forward", f"model.layers.{layer}", self.acts[layer])
            self.writer.flush()

    def _on_layer(self, i: int):
        def hook(module, inputs, output):
            k = self.calls.get(i, 0)
            self.calls[i] = k + 1
            hidden = output[0] if isinstance(output, tuple) else output
            if self._planted("forward", f"model.layers.{i}"):
                hidden = hidden * (1.0 + self.plant[3])
                output = (hidden, *output[1:]) if isinstance(output, tuple) else hidden
            if self.sampled and k < len(self.lengths):
                self.acts[i] = self.acts.get(i, fp.EMPTY) + fp.rows_stat(_np(hidden), self.lengths[k])
            return output
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        if self.writer is not None:
            self.writer.close()
