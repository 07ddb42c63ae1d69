"""port train's AdamW, both paths (MindSpore's fused AdamWeightDecay with the bias correction folded
into its scalars, and the element-wise one), against torch.optim.AdamW, and the skip of a non-finite step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mindspore as ms
from mindspore import Parameter, Tensor

from porting.train.run.step import cells as train_step

BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1
LRS = [1e-2, 5e-3, 0.0, 2e-3]  # lr 0 included: a warm-up step must leave the weights alone


def _shapes():
    return [(5, 7), (7,), (3, 2, 4)]


def _run_port(fused: bool, grads_per_step: list[list[np.ndarray]], init: list[np.ndarray]):
    params = [Parameter(Tensor(a.copy()), name=f"p{i}") for i, a in enumerate(init)]
    opt = train_step.AdamW(params, BETAS, EPS, WD, fused=fused)
    assert opt.fused is fused
    for t, (lr, grads) in enumerate(zip(LRS, grads_per_step), start=1):
        f = lambda x: Tensor(np.float32(x))  # noqa: E731
        finite = Tensor(bool(all(np.isfinite(g).all() for g in grads)))
        opt(tuple(Tensor(g) for g in grads), f(lr), f(1 - BETAS[0] ** t), f(1 - BETAS[1] ** t), finite)
    return [p.asnumpy() for p in params], [m.asnumpy() for m in opt.m], [v.asnumpy() for v in opt.v]


def _run_torch(grads_per_step, init):
    params = [torch.nn.Parameter(torch.tensor(a.copy())) for a in init]
    opt = torch.optim.AdamW(params, lr=1.0, betas=BETAS, eps=EPS, weight_decay=WD)
    for lr, grads in zip(LRS, grads_per_step):
        for group in opt.param_groups:
            group["lr"] = lr
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in params]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "elementwise"])
def test_matches_torch_adamw(fused):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in _shapes()]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in _shapes()] for _ in LRS]
    got, _, _ = _run_port(fused, grads, init)
    want = _run_torch(grads, init)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-7)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "elementwise"])
def test_a_non_finite_step_applies_nothing(fused):
    """Weights and both moments after an overflowing third step are bit-identical to after step 2."""
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(s).astype(np.float32) for s in _shapes()]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in _shapes()] for _ in range(3)]
    grads[2][1][3] = np.inf
    after_bad = _run_port(fused, grads, init)
    after_two = _run_port(fused, grads[:2], init)
    for part_bad, part_two in zip(after_bad, after_two):
        for a, b in zip(part_bad, part_two):
            np.testing.assert_array_equal(a, b)
