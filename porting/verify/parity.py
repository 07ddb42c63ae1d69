"""Numerical parity of a zoo cell against HF ``transformers`` on the same weights and inputs.

Both sides load the same HF directory: transformers (torch, CPU) as the reference, and the zoo's
MindSpore cell through the converters' name map. The same fixed token ids go through both; logits,
loss, and optionally every layer's hidden state and every parameter's gradient norm are compared
against documented per-dtype tolerances (:data:`porting.verify.stats.TOLERANCES`), each a
:class:`porting.verify.check.Check` row measured by :func:`porting.verify.stats.compare`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from model_zoo.errors import ConfigError
from porting.verify.check import Check
from porting.verify.pair import load_pair
from porting.verify.stats import TOLERANCES, compare


def _check(name: str, got, ref, tolerance: float, measure: str = "max_abs") -> Check:
    """One row from the one difference function: ``measure`` held against the tolerance, the other in detail."""
    s = compare(np.asarray(got), np.asarray(ref))
    other = "max_rel" if measure == "max_abs" else "max_abs"
    return Check.within(name, measure, getattr(s, measure), tolerance,
                        f"{other.replace('_', ' ')} {getattr(s, other):.3e}")


def probe_ids(vocab: int, batch: int, seq: int, seed: int, bos: int | None) -> np.ndarray:
    """Fixed token ids: BOS then seeded random tokens (no padding, so both sides see the same thing)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    if bos is not None:
        ids[:, 0] = bos
    return ids


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
    """Run HF and the zoo on the same ids; return a report dict with its rows (``checks``) and ``passed``.

    The zoo cell loads the same HF directory, or with ``ms_dir`` a converted MindSpore checkpoint.
    The reference runs and is dropped before the cell is built (peak memory: one side's model).
    """
    pair = load_pair(hf_dir, ms_dir, dtype=dtype, kernels_override=kernels_override)
    cfg = pair.cfg
    seq = min(seq, cfg.longest_sequence)
    if cfg.sliding_window and seq > cfg.sliding_window:   # the zoo's attention is full: equal within the window only
        raise ConfigError(f"--seq {seq} is longer than the model's sliding_window={cfg.sliding_window}; port attends "
                          "over the whole sequence, which equals sliding-window attention only within the window: "
                          f"use --seq {cfg.sliding_window} or less")
    ids = probe_ids(cfg.vocab_size, batch, seq, seed, cfg.bos_token_id)
    tol = TOLERANCES[dtype]

    t0 = time.perf_counter()
    from converters.fused import split_named

    ref = hf_outputs(pair.reference(), ids, hidden_states, grads, split=lambda n, g: split_named(cfg, n, g))
    t_hf = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = pair.zoo()
    got = zoo_outputs(model, ids, hidden_states, grads)
    t_zoo = time.perf_counter() - t0

    checks = [_check("logits", got["logits"], ref["logits"], tol["logits"]),
              _check("loss", np.array(got["loss"]), np.array(ref["loss"]), tol["loss"])]
    if hidden_states:
        if len(got["hidden"]) != len(ref["hidden"]):
            raise ConfigError(f"hidden states: zoo gives {len(got['hidden'])}, HF gives {len(ref['hidden'])}")
        for i, (a, b) in enumerate(zip(got["hidden"], ref["hidden"])):
            label = "embeddings" if i == 0 else f"layer {i - 1}" + (" + final norm" if i == len(got["hidden"]) - 1 else "")
            checks.append(_check(f"hidden[{i}] {label}", a, b, tol["hidden"]))
    if grads:
        checks += _grad_checks(cfg, got["grad_norms"], ref["grad_norms"], tol["grad_rel"])
    return {
        "hf_dir": str(pair.hf_dir), "zoo_weights_from": str(pair.weights), "dtype": dtype, "batch": batch, "seq": seq,
        "seed": seed, "model_type": cfg.model_type, "kernels": model.plan.as_dict(),
        "loss": {"zoo": got["loss"], "hf": ref["loss"]},
        "seconds": {"hf": round(t_hf, 3), "zoo": round(t_zoo, 3)},
        "tolerances": tol, "checks": [c.to_dict() for c in checks],
        "passed": all(c.passed for c in checks),
    }


def _grad_checks(cfg, zoo_norms: dict[str, float], hf_norms_by_hf_name: dict[str, float], tol: float) -> list[Check]:
    """Every parameter's gradient norm, and the global one, relative to HF's (names through the converters' map)."""
    from converters import names

    table = names.NAME_MAPS[cfg.model_type]
    hf_norms = {names.map_name(n, table): v for n, v in hf_norms_by_hf_name.items()}
    zoo_names = sorted(zoo_norms)
    a = np.array([zoo_norms[n] for n in zoo_names])
    b = np.array([hf_norms.get(n, np.nan) for n in zoo_names])
    return [_check(f"grad norms ({len(zoo_names)} tensors)", a, b, tol, "max_rel"),
            _check("global grad norm", np.linalg.norm(a), np.linalg.norm(b), tol, "max_rel")]
