"""Numerical parity of a zoo cell against HF ``transformers`` on the same weights and inputs.

Both sides load the same HF directory: transformers (torch, CPU) as the reference, and the zoo's
MindSpore cell through the converters' name map. The same fixed token ids go through both; logits,
loss, and optionally every layer's hidden state and every parameter's gradient norm are compared
against documented per-dtype tolerances (TOLERANCES).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from model_zoo.errors import ConfigError

# Max abs difference of logits / hidden states, abs difference of the mean loss, and relative
# difference of gradient norms, per compute dtype. fp32 is the 1e-4 on logits; the half
# precisions are bounded by their 8- and 11-bit mantissas over a handful of layers.
TOLERANCES = {
    "float32": {"logits": 1e-4, "loss": 1e-5, "hidden": 1e-4, "grad_rel": 1e-4},
    "float16": {"logits": 5e-2, "loss": 5e-3, "hidden": 5e-2, "grad_rel": 2e-2},
    "bfloat16": {"logits": 2.5e-1, "loss": 3e-2, "hidden": 2.5e-1, "grad_rel": 1e-1},
}


@dataclasses.dataclass
class Check:
    name: str
    max_abs: float
    max_rel: float
    tolerance: float
    measure: str  # which number is held against the tolerance: "max_abs" or "max_rel"

    @property
    def passed(self) -> bool:
        value = self.max_abs if self.measure == "max_abs" else self.max_rel
        return bool(np.isfinite(value)) and value <= self.tolerance

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "passed": self.passed}


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.abs(a64 - b64)
    rel = d / np.maximum(np.abs(b64), 1e-6)
    return float(d.max()), float(rel.max())


def probe_ids(vocab: int, batch: int, seq: int, seed: int, bos: int | None) -> np.ndarray:
    """Fixed token ids: BOS then seeded random tokens (no padding, so both sides see the same thing)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    if bos is not None:
        ids[:, 0] = bos
    return ids


def load_hf_reference(hf_dir: Path, dtype: str):
    from porting.env import require_torch

    require_torch("the HF reference")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one-line output; the weights are local and small to list
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=tdt, local_files_only=True,
                                                 attn_implementation="eager")
    return model.eval()


def hf_outputs(model, ids: np.ndarray, want_hidden: bool, want_grads: bool, split=None) -> dict:
    """``split(name, grad)``: (name, array) pairs a fused HF gradient is compared as (converters/fused.py)."""
    import torch

    x = torch.tensor(ids, dtype=torch.long)
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(want_grads):
        out = model(input_ids=x, labels=x, output_hidden_states=want_hidden)
    res = {"logits": out.logits.detach().float().numpy(), "loss": float(out.loss.detach().float())}
    if want_hidden:
        res["hidden"] = [h.detach().float().numpy() for h in out.hidden_states]
    if want_grads:
        out.loss.backward()
        grads = [(n, p.grad.detach().double().numpy()) for n, p in model.named_parameters() if p.grad is not None]
        if split is not None:
            grads = [part for n, g in grads for part in split(n, g)]
        res["grad_norms"] = {n: float(np.linalg.norm(g)) for n, g in grads}
    return res


def zoo_outputs(model, ids: np.ndarray, want_hidden: bool, want_grads: bool) -> dict:
    import mindspore as ms

    from model_zoo.loss import shifted_token_loss

    x = ms.Tensor(ids.astype(np.int32))
    logits = model(x)
    s, c = shifted_token_loss(logits, x)
    res = {"logits": logits.asnumpy(), "loss": float((s / c).asnumpy())}
    if want_hidden:
        res["hidden"] = [h.asnumpy().astype(np.float32) for h in model.hidden_states(x)]
    if want_grads:
        params = model.trainable_params()

        def loss_fn(inp):
            s, c = shifted_token_loss(model(inp), inp)
            return s / c

        _, grads = ms.value_and_grad(loss_fn, None, params)(x)
        res["grad_norms"] = {p.name: float(np.linalg.norm(g.asnumpy().astype(np.float64)))
                             for p, g in zip(params, grads)}
    return res


def check_parity(hf_dir: str | Path, *, dtype: str = "float32", batch: int = 2, seq: int = 32, seed: int = 0,
                 hidden_states: bool = False, grads: bool = False, kernels_override: dict | None = None,
                 ms_dir: str | Path | None = None) -> dict:
    """Run HF and the zoo on the same ids; return a report dict with per-check rows and ``passed``.

    The zoo cell loads the same HF directory, or with ``ms_dir`` a converted MindSpore checkpoint.
    """
    from converters.loading import load_hf_dir, load_ms_dir
    from model_zoo import LlamaConfig, build

    if dtype not in TOLERANCES:
        raise ConfigError(f"--dtype {dtype!r}: expected one of {', '.join(TOLERANCES)}")
    hf_dir = Path(hf_dir)
    cfg = LlamaConfig.from_hf(hf_dir)
    seq = min(seq, cfg.longest_sequence)
    ids = probe_ids(cfg.vocab_size, batch, seq, seed, cfg.bos_token_id)
    tol = TOLERANCES[dtype]

    t0 = time.perf_counter()
    from converters.fused import split_named

    ref = hf_outputs(load_hf_reference(hf_dir, dtype), ids, hidden_states, grads,
                     split=lambda n, g: split_named(cfg, n, g))
    t_hf = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = build(cfg, param_dtype=dtype, kernels_override=kernels_override)
    if ms_dir is not None:
        load_ms_dir(model, ms_dir)
    else:
        load_hf_dir(model, hf_dir)
    got = zoo_outputs(model, ids, hidden_states, grads)
    t_zoo = time.perf_counter() - t0

    checks = [Check("logits", *_diff(got["logits"], ref["logits"]), tol["logits"], "max_abs"),
              Check("loss", *_diff(np.array(got["loss"]), np.array(ref["loss"])), tol["loss"], "max_abs")]
    if hidden_states:
        if len(got["hidden"]) != len(ref["hidden"]):
            raise ConfigError(f"hidden states: zoo gives {len(got['hidden'])}, HF gives {len(ref['hidden'])}")
        for i, (a, b) in enumerate(zip(got["hidden"], ref["hidden"])):
            label = "embeddings" if i == 0 else f"layer {i - 1}" + (" + final norm" if i == len(got["hidden"]) - 1 else "")
            checks.append(Check(f"hidden[{i}] {label}", *_diff(a, b), tol["hidden"], "max_abs"))
    if grads:
        from converters import names

        table = names.NAME_MAPS[cfg.model_type]
        hf_norms = {names.map_name(n, table): v for n, v in ref["grad_norms"].items()}
        zoo_names = sorted(got["grad_norms"])
        a = np.array([got["grad_norms"][n] for n in zoo_names])
        b = np.array([hf_norms.get(n, np.nan) for n in zoo_names])
        checks.append(Check(f"grad norms ({len(zoo_names)} tensors)", *_diff(a, b), tol["grad_rel"], "max_rel"))
        checks.append(Check("global grad norm", *_diff(np.linalg.norm(a), np.linalg.norm(b)), tol["grad_rel"], "max_rel"))
    return {
        "hf_dir": str(hf_dir), "zoo_weights_from": str(ms_dir or hf_dir), "dtype": dtype, "batch": batch, "seq": seq, "seed": seed,
        "model_type": cfg.model_type, "kernels": model.plan.as_dict(),
        "loss": {"zoo": got["loss"], "hf": ref["loss"]},
        "seconds": {"hf": round(t_hf, 3), "zoo": round(t_zoo, 3)},
        "tolerances": tol, "checks": [c.as_dict() for c in checks],
        "passed": all(c.passed for c in checks),
    }
