"""The baseline's step breakdown (`port baseline run --breakdown-every N`) and its place beside the port run's
in `port compare`.

On a sampled step the torch loop runs under ``torch.profiler`` with its phases marked (``port.step``,
``port.forward``, ``port.backward``, ``port.optimizer`` ranges, a device synchronisation at each boundary on
CUDA) and each decoder layer's forward marked (``port.layer.<i>``, by forward hooks). The kernels are the
profile's CUDA kernels on CUDA, its ``aten::`` operators on the CPU; the parts (compute, host, idle; no
communication: the baseline is one device) are those of :mod:`porting.rundir.breakdown`, the same definition as
the port run's. Sampling: every N-th step after the timed warm-up, at most ``MAX_SAMPLES``; the profiler's
own overhead is in those steps' times, so a sampled step is left out of the baseline's steady timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

from porting.rundir import breakdown as bd

MARK = "port."


class TorchSampler:
    """``begin(step)``, then ``phase(name)`` around each phase, then ``end(step)``; a no-op off the sampled steps."""

    def __init__(self, every: int, device: str, warmup: int, layers: list | None = None):
        self.every, self.device, self.warmup, self.layers = every, device, warmup, list(layers or [])
        self.taken, self.active = 0, False
        self.prof = self.step_range = None
        self.hooks: list = []

    def due(self, step: int) -> bool:
        return self.every > 0 and step >= self.warmup and self.taken < bd.MAX_SAMPLES and (step + 1) % self.every == 0

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def begin(self, step: int) -> bool:
        self.active = self.due(step)
        if not self.active:
            return False
        import torch
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        self._sync()
        self.prof = profile(activities=acts)
        self.prof.__enter__()
        self.step_range = record_function(MARK + "step")
        self.step_range.__enter__()
        for i, layer in enumerate(self.layers):
            self.hooks.append(layer.register_forward_pre_hook(_enter(f"{MARK}layer.{i}")))
            self.hooks.append(layer.register_forward_hook(_exit))
        del torch
        return True

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.active:
            yield
            return
        from torch.profiler import record_function

        self._sync()
        with record_function(MARK + name):
            yield
            self._sync()

    def end(self, step: int) -> bd.Breakdown | None:
        if not self.active:
            return None
        self._sync()
        self.step_range.__exit__(None, None, None)
        self.prof.__exit__(None, None, None)
        for h in self.hooks:
            h.remove()
        self.hooks, self.active = [], False
        self.taken += 1
        return from_events(step + 1, self.prof.events(), self.device)


def _enter(name: str):
    def hook(module, args):
        from torch.profiler import record_function

        rf = record_function(name)
        rf.__enter__()
        module._port_range = rf
    return hook


def _exit(module, args, out):
    rf = getattr(module, "_port_range", None)
    if rf is not None:
        rf.__exit__(None, None, None)
        module._port_range = None


def _span(e) -> tuple[int, int]:
    return int(e.time_range.start * 1000), int(e.time_range.end * 1000)


def from_events(step: int, events: Any, device: str) -> bd.Breakdown:
    """The record of one profiled step from torch's events (microseconds on one clock)."""
    marks = [e for e in events if e.name.startswith(MARK)]
    window = next(_span(e) for e in marks if e.name == MARK + "step")
    cells = [(e.name[len(MARK):], *_span(e)) for e in marks if e.name[len(MARK):] in ("forward", "backward", "optimizer")]
    if device == "cuda":
        ks = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    else:
        ks = [e for e in events if e.name.startswith("aten::")]
    kernels = [bd.Kernel(e.name[:400], _span(e)[0], max(0, _span(e)[1] - _span(e)[0])) for e in ks]
    rec = bd.from_timeline(step, 0, "torch-profiler", window, cells, kernels)
    spans = bd.union((k.start_ns, k.end_ns) for k in kernels)
    fwd = bd.union((a, b) for n, a, b in cells if n == "forward")
    layers: dict[str, dict[str, float]] = {}
    for e in marks:
        if e.name.startswith(MARK + "layer.") and len(layers) < bd.MAX_LAYERS:
            i = e.name.rsplit(".", 1)[-1]
            own = bd.intersect(bd.intersect(spans, [_span(e)]), fwd)
            slot = layers.setdefault(i, {})
            slot["forward"] = round(slot.get("forward", 0.0) + bd.length(own) / 1e9, 6)
    return dataclasses.replace(rec, layers=dict(sorted(layers.items(), key=lambda x: int(x[0]))))


# ------------------------------------------------------------------------------------------ port compare
PARTS = ("wall_s", "compute_s", "comm_s", "host_s", "idle_s")


def _mean(recs: list[bd.Breakdown], get) -> float | None:
    vals = [get(r) for r in recs]
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _summary(recs: list[bd.Breakdown], tokens: float | None) -> dict[str, Any]:
    phases = sorted({p for r in recs for p in r.phases})
    layers = sorted({i for r in recs for i in r.layers}, key=int)
    return {"steps": len(recs), "source": recs[0].source, "tokens_per_step": tokens,
            **{k: _mean(recs, lambda r, k=k: getattr(r, k)) for k in PARTS},
            "phases": {p: _mean(recs, lambda r, p=p: r.phases.get(p)) for p in phases},
            "layers": {i: _mean(recs, lambda r, i=i: r.layers.get(i, {}).get("forward")) for i in layers}}


def side_by_side(raw: Any, run_path: Any, base_tokens: float | None, run_tokens: float | None
                 ) -> dict[str, Any] | None:
    """The baseline's sampled steps (``raw``: its file's ``breakdown`` list, or None) and the run's (every rank,
    mean), per part and phase; None when either has none. ``base_tokens``, ``run_tokens``: padded tokens one
    device processes per step (the baseline's one device processes the global batch, a data-parallel rank its
    share)."""
    notes: list[str] = []
    base = []
    for i, d in enumerate((raw if isinstance(raw, (list, tuple)) else ())[:bd.MAX_SAMPLES * 4]):
        try:
            base.append(bd.from_dict(d, f"baseline breakdown[{i}]"))
        except bd.RunDirError as e:
            notes.append(str(e)[:200])
    run = [r for recs in bd.read(run_path, notes).values() for r in recs]
    if not base or not run:
        return None if not notes else {"notes": notes}
    return {"baseline": _summary(base, base_tokens), "run": _summary(run, run_tokens), "notes": notes}


def render_side_by_side(sbs: dict[str, Any] | None) -> list[str]:
    if not sbs or "baseline" not in sbs:
        return [f"NOTE (breakdown): {n}" for n in (sbs or {}).get("notes", [])]
    b, r = sbs["baseline"], sbs["run"]

    def per_k(x, side):   # ms per 1,000 tokens of that device's work
        t = side["tokens_per_step"]
        return f"{x * 1e6 / t:>9.2f}" if x is not None and t else f"{'-':>9}"

    lines = ["", f"STEP BREAKDOWN (ms per 1k tokens each device processes; baseline {b['source']} on {b['steps']} step(s), "
                 f"run {r['source']}, mean of all ranks on {r['steps']} record(s))",
             f"  {'part':<22} {'baseline':>9} {'run':>9} {'ratio':>7}"]

    def row(name, x, y):
        bx, ry = per_k(x, b), per_k(y, r)
        ratio = (y / r["tokens_per_step"]) / (x / b["tokens_per_step"]) if x and y and r["tokens_per_step"] \
            and b["tokens_per_step"] else None
        lines.append(f"  {name:<22} {bx} {ry} {f'{ratio:.2f}' if ratio else '-':>7}")

    for k in PARTS:
        row(k[:-2].replace("comm", "exposed comm"), b[k], r[k])
    for p in sorted(set(b["phases"]) | set(r["phases"])):
        row(f"phase {p}", b["phases"].get(p), r["phases"].get(p))
    for i in sorted(set(b["layers"]) & set(r["layers"]), key=int):
        row(f"layer {i} forward", b["layers"][i], r["layers"][i])
    lines += [f"  note: {n}" for n in sbs.get("notes", [])]
    return lines
