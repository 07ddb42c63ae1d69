"""Where two runs part: their fingerprints compared step by step, in the order the step computes them.

Order within a step: ``forward`` (decoder layer 0 .. L-1), then ``collective`` (the gradient buckets' all-reduce:
every bucket's input on every data-parallel rank, then every bucket's output), then ``gradient`` (backward order: the
last parameter of the forward first), then ``update`` (forward order). Parameters are ordered by where they act in
the forward (:func:`param_key`), whatever order either framework lists them in.

Collectives. A bucket is compared only where both runs' buckets hold the same gradients (first, last, count), its
inputs only where both ran the same data-parallel and tensor-parallel sizes (rank d's rows are the same rows then).
Every input comes before every output, so an output that parts at a step where every input matched is the
collective's doing: "inputs matched, outputs did not". An input that parts is the backward's (the local gradient
entered the collective already different): the verdict names the first gradient that parts at that step, with the
bucket and rank whose input differed.

The noise envelope. Two correct runs of one step differ by rounding: a different summation order, a fused kernel, a
different framework. Each of the statistics compared (the sum of squares, the largest magnitude, and the sum
relative to its scale sqrt(count * sumsq); the largest magnitude is shown, not tested) is then off by a small multiple of the unit roundoff of the dtype the
sums run in, and the differences compound through the steps (the weights of step n carry every earlier step's
rounding). The envelope is the relative tolerance

    tol(step) = max(K * eps(float32), 4 * eps(compute dtype)) * sqrt(step),   K = 2**11

eps: the machine epsilon (``numpy.finfo``: 2**-23 float32, 2**-7 bfloat16, 2**-10 float16); accumulations run
in float32 (Megatron and MindSpore's matmuls accumulate in float32), so float32's eps is the floor; the
compute dtype's, for the roundings to it (4 of them); sqrt(step) for independent roundings compounding over
steps. K is a training figure: set from port against its torch baseline on recipes/tiny-cpu.yaml, whose largest
difference over 20 steps was 1.5e-4 relative (an update of a 64-element norm weight at step 20), 7x below
tol(20) = 1.1e-3 (docs/diverge.md, with the held-out pairings). A perturbation of relative size r moves a sum of
squares by about 2r: 1e-2 is seen up to step ~1,700 in float32; bfloat16 compute sees only r above ~2e-2.

Two runs of one layout (both zoo, or both torch) are also compared bit for bit (the digests): "bitwise equal up to
step N" is the last step through which every common record's digest agreed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model_zoo.errors import PortingError
from porting.rundir import fingerprints as fp

K = 2 ** 11
STORE_ROUNDINGS = 4
ORDER = ("forward", "collective", "gradient", "update")
WORDS = {"forward": "forward activation", "collective": "collective", "gradient": "backward gradient",
         "update": "update"}
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "bf16-mixed": "bfloat16"}
# where a parameter acts within a decoder layer, in forward order (HF names, converters/names.py)
_IN_LAYER = ("input_layernorm", "self_attn.q_proj", "self_attn.q_norm", "self_attn.k_proj", "self_attn.k_norm",
             "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
             "mlp.down_proj")
_LAYER = re.compile(r"model\.layers\.(\d+)(?:\.(.*))?$")


class DivergeError(PortingError):
    """Two runs `port diverge` cannot compare."""


def eps(dtype: str) -> float:
    return float(np.finfo({"float32": np.float32, "float16": np.float16}.get(dtype, np.float32)).eps) \
        if dtype != "bfloat16" else 2.0 ** -7


def tolerance(dtype: str, step: int) -> float:
    return max(K * eps("float32"), STORE_ROUNDINGS * eps(dtype)) * math.sqrt(step)


def layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


def param_key(name: str) -> tuple:
    """Where ``name`` acts in the forward: embedding, layers in order (their parameters in data-flow order), the
    final norm, the head."""
    m = _LAYER.match(name)
    if m is None:
        first = {"model.embed_tokens.weight": -1, "model.norm.weight": 1 << 30, "lm_head.weight": (1 << 30) + 1}
        return (first.get(name, (1 << 30) + 2), 0, name)
    rest = m.group(2) or ""
    stem, _, leaf = rest.rpartition(".")
    pos = _IN_LAYER.index(stem) if stem in _IN_LAYER else len(_IN_LAYER)
    return (int(m.group(1)), pos, leaf != "weight", name)


@dataclass(frozen=True)
class Side:
    path: Path
    prints: fp.Fingerprints

    @property
    def layout(self) -> str:
        return "/".join(sorted({str(h.get("layout")) for h in self.prints.headers}))

    @property
    def formats(self) -> set:
        """The fingerprint format versions of its files' launches (porting/rundir/fingerprints.py VERSIONS)."""
        return {h.get("fingerprints") for h in self.prints.headers}

    @property
    def dtype(self) -> str:
        kinds = {DTYPES.get(str(h.get("dtype")), "float32") for h in self.prints.headers}
        return max(kinds, key=eps)

    @property
    def sizes(self) -> set:
        """The (data-parallel, tensor-parallel) sizes of its launches."""
        return {(h.get("dp"), h.get("tp")) for h in self.prints.headers}

    def describe(self) -> str:
        h = self.prints.headers[0]
        what = h.get("execution") if h.get("source") == "port" else "torch baseline"
        return f"{self.path} ({what}, {h.get('world')} rank(s), tp {h.get('tp')}, dtype {self.dtype})"


def locate(path: str | Path) -> Side:
    """A run directory (its ``fingerprints/``), a baseline file (``<file>.fingerprints/``) or such a folder."""
    p = Path(path)
    if p.is_file() and Path(str(p) + ".fingerprints").is_dir():
        folder = Path(str(p) + ".fingerprints")
    elif p.is_dir() and (p / "fingerprints").is_dir():
        folder = p / "fingerprints"
    elif p.is_dir() and p.name.endswith("fingerprints"):
        folder = p
    else:
        raise DivergeError(f"{p}: no fingerprints there (expected a run directory with fingerprints/, or a baseline "
                           "file with FILE.fingerprints/ beside it); record them with --set logging.fingerprint_every=N")
    return Side(p, fp.read(folder))


def _same_batches(a: Side, b: Side, steps: list[int]) -> None:
    """Refuses two runs whose common steps did not see the same input tokens (the data order differs)."""
    for s in steps:
        x, y = a.prints.stats.get((s, "batch", "input_ids")), b.prints.stats.get((s, "batch", "input_ids"))
        if x is None or y is None:
            raise DivergeError(f"step {s}: {a.path if x is None else b.path} has no batch record; its data order "
                               "cannot be checked (fingerprints of an older port?)")
        if x.digest != y.digest or x.count != y.count:
            raise DivergeError(f"the two runs did not see the same batches: step {s}'s input tokens differ ({x.count} "
                               f"vs {y.count} real tokens, digest {x.digest:016x} vs {y.digest:016x}); compare runs "
                               "of one data order (the same data, seed and global batch: micro_batch_size x "
                               "grad_accum_steps x data-parallel size)")


def relative(x: fp.Stat, y: fp.Stat) -> tuple[str, float]:
    """The statistic that differs most between ``x`` and ``y``, and by how much (relative)."""
    if x.count != y.count or x.nonfinite != y.nonfinite:
        return ("count" if x.count != y.count else "nonfinite"), math.inf
    if x.nonfinite:
        return "nonfinite", 0.0

    def rel(u: float, v: float, scale: float) -> float:
        return abs(u - v) / scale if scale > 0 else (0.0 if u == v else math.inf)

    scale = math.sqrt(max(x.count * max(x.sumsq, y.sumsq), 0.0))
    # the largest magnitude is one element, not a sum: its rounding is not bounded by the envelope (an AdamW
    # update of an element whose second moment is near zero magnifies it), so it is shown, not tested
    parts = {"sumsq": rel(x.sumsq, y.sumsq, max(abs(x.sumsq), abs(y.sumsq))), "sum": rel(x.sum, y.sum, scale)}
    worst = max(parts, key=lambda k: parts[k])
    return worst, parts[worst]


def step_order(a: Side, b: Side, step: int) -> list[tuple[str, str]]:
    """The (phase, name) pairs both runs recorded at ``step``, in the order the step computes them."""
    out = []
    for phase in ORDER:
        common = [n for n in a.prints.names.get(phase, []) if (step, phase, n) in a.prints.stats
                  and (step, phase, n) in b.prints.stats]
        if phase == "collective":
            common = _collectives(a, b, common)
        else:
            key = (lambda n: layer_of(n) or 0) if phase == "forward" else param_key
            common.sort(key=key, reverse=phase == "gradient")
        out += [(phase, n) for n in common]
    return out


def _collectives(a: Side, b: Side, names: list[str]) -> list[str]:
    """The collective records to compare (module docstring): every input, then every output, in bucket order."""
    same_ranks = a.sizes == b.sizes and len(a.sizes) == 1
    keep = []
    for n in names:
        m = fp.COLLECTIVE.fullmatch(n)
        if m is None or a.prints.buckets.get(m.group(1)) != b.prints.buckets.get(m.group(1)):
            continue   # another bucket plan: not the same gradients
        if m.group(3) is None or same_ranks:
            keep.append((m.group(3) is None, int(m.group(2)), n))
    return [n for *_, n in sorted(keep)]


def collective_of(side: Side, name: str) -> dict:
    """What a collective record names: its bucket, the gradients the bucket holds, the side and rank."""
    m = fp.COLLECTIVE.fullmatch(name)
    first, last, count = side.prints.buckets[m.group(1)]
    return {"op": "allreduce", "bucket": int(m.group(2)), "record": m.group(1), "first_tensor": first,
            "last_tensor": last, "tensors": count, "side": "output" if m.group(3) is None else "input",
            "dp_rank": None if m.group(3) is None else int(m.group(3))}


def compare(a: Side, b: Side) -> dict:
    """The verdict of ``a`` against ``b`` (a JSON object; :func:`words` says it in one paragraph)."""
    steps = sorted(set(a.prints.steps) & set(b.prints.steps))
    if not steps:
        raise DivergeError(f"{a.path} (steps {_span(a.prints.steps)}) and {b.path} (steps {_span(b.prints.steps)}) "
                           "share no sampled step; use one logging.fingerprint_every for both")
    if len(a.formats | b.formats) > 1:   # format 1 hashed elements, format 2 pairs: no digest of one is the other's
        raise DivergeError(f"{a.path} and {b.path} hold fingerprints of formats "
                           f"{', '.join(map(str, sorted(a.formats | b.formats)))}, whose digests differ by construction; "
                           "record both runs with one port (run again the older one)")
    _same_batches(a, b, steps)
    dtype = max((a.dtype, b.dtype), key=eps)
    digests = a.layout == b.layout
    bitwise_through, bitwise, first, compared = None, digests, None, 0
    for s in steps:
        tol, inputs = tolerance(dtype, s), False
        for phase, name in step_order(a, b, s):
            x, y = a.prints.stats[(s, phase, name)], b.prints.stats[(s, phase, name)]
            compared += 1
            if bitwise and x.digest != y.digest:
                bitwise = False
            first = _parts(s, phase, name, x, y, tol)
            if first is not None:
                first = _collective_cause(a, b, first, inputs) if phase == "collective" else first
                break
            inputs = inputs or (phase == "collective" and "/input/" in name)
        if first is not None:
            break
        if bitwise:
            bitwise_through = s
    phases = sorted({p for s in steps for p, _ in step_order(a, b, s)}, key=ORDER.index)
    return {"format": "port-diverge", "version": 1, "a": a.describe(), "b": b.describe(),
            "verdict": "diverged" if first is not None else ("bitwise_equal" if bitwise else "within_envelope"),
            "first": first, "bitwise_equal_through": bitwise_through if digests else None,
            "steps_compared": [s for s in steps if first is None or s <= first["step"]], "records_compared": compared,
            "phases": phases, "truncated": a.prints.truncated or b.prints.truncated,
            "envelope": {"rule": f"relative max(K*eps(float32), {STORE_ROUNDINGS}*eps(dtype))*sqrt(step), K={K}, "
                                 "on sumsq, and sum over sqrt(count*sumsq)",
                         "dtype": dtype, "at_step_1": tolerance(dtype, 1)},
            "digests_compared": digests}


def _parts(step: int, phase: str, name: str, x: fp.Stat, y: fp.Stat, tol: float) -> dict | None:
    """The verdict's ``first`` when record ``name`` of the two runs differs beyond ``tol``, else None."""
    stat, r = relative(x, y)
    if r <= tol:
        return None
    return {"step": step, "phase": phase, "name": name, "layer": layer_of(name), "statistic": stat,
            "a": getattr(x, stat, None) if stat in ("sum", "sumsq", "maxabs") else x.count,
            "b": getattr(y, stat, None) if stat in ("sum", "sumsq", "maxabs") else y.count,
            "relative": _num(r), "tolerance": tol, "collective": None}


def _collective_cause(a: Side, b: Side, first: dict, inputs: bool) -> dict:
    """A collective record that parts, explained: an output after every input matched ("inputs matched, outputs
    did not"; ``inputs``: any input compared at that step), or an input: then the first gradient that parts at
    that step is named (the difference entered the collective with the local gradient), with the bucket."""
    info = collective_of(a, first["name"])
    if info["side"] == "output":
        return {**first, "collective": {**info, "inputs": "matched" if inputs else "not compared",
                                        "outputs": "differed"}}
    info["inputs"] = "differed"
    s, tol = first["step"], first["tolerance"]
    for phase, name in step_order(a, b, s):
        grad = _parts(s, phase, name, a.prints.stats[(s, phase, name)], b.prints.stats[(s, phase, name)], tol) \
            if phase == "gradient" else None
        if grad is not None:
            return {**grad, "collective": info}
    return {**first, "collective": info}


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _span(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]}" if steps else "none"


def words(v: dict) -> str:
    """The verdict in a few lines, first the answer."""
    steps = v["steps_compared"]
    bit = v.get("bitwise_equal_through")
    lines = []
    f = v.get("first")
    if f is not None:
        layer = f" (layer {f['layer']})" if f.get("layer") is not None else ""
        c = f.get("collective")
        what = f"{WORDS[f['phase']]} of {f['name']}{layer}"
        if c is not None and c["side"] == "output":
            how = "inputs matched, outputs did not" if c["inputs"] == "matched" else \
                "outputs differed (inputs not compared: other data-parallel or tensor-parallel sizes)"
            what = f"collective all-reduce of gradient bucket {c['bucket']} ({_holds(c)}): {how}"
        lines.append(f"first divergence: step {f['step']}, {what}: {f['statistic']} {_fmt(f['a'])} vs {_fmt(f['b'])}, "
                     f"relative {_fmt(f['relative'])} > envelope {f['tolerance']:.2e}")
        if c is not None and c["side"] == "input":
            lines.append(f"the all-reduce inputs differed (gradient bucket {c['bucket']}: {_holds(c)}; data-parallel "
                         f"rank {c['dp_rank']}): the difference entered before the collective")
    else:
        lines.append(f"no divergence over {len(steps)} common sampled step(s) ({_span(steps)}): "
                     + ("bitwise equal" if v["verdict"] == "bitwise_equal" else "within the noise envelope"))
    if bit is not None and (f is None or bit < f["step"]):
        lines.append(f"bitwise equal up to step {bit}")
    elif v.get("digests_compared") and bit is None:
        lines.append("not bitwise equal at the first compared step")
    lines.append(f"compared: {', '.join(v['phases'])}; {v['records_compared']} records; envelope "
                 f"{v['envelope']['rule']} ({v['envelope']['dtype']}: {v['envelope']['at_step_1']:.2e} at step 1)")
    lines.append(f"A: {v['a']}")
    lines.append(f"B: {v['b']}")
    return "\n".join(lines)


def _holds(c: dict) -> str:
    """What a collective's bucket holds, in words: its first and last gradient (HF names) and how many."""
    n = c["tensors"]
    return (c["first_tensor"] if n == 1 else f"{c['first_tensor']} .. {c['last_tensor']}, {n} tensors")


def _fmt(x) -> str:
    return "n/a" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x))
