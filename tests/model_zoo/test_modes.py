"""Graph (jit) mode and PyNative give the same forward and the same gradient step."""

from __future__ import annotations

import importlib.util
import sys

import pytest

SCRIPT = r"""
import numpy as np, mindspore as ms
from mindspore import nn
from model_zoo import LlamaConfig, build
from model_zoo.loss import shifted_token_loss


def run(mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    m = build(cfg, seed=7)
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 64, (2, 12)).astype(np.int32))
    logits = m(ids).asnumpy()
    opt = nn.AdamWeightDecay(m.trainable_params(), learning_rate=1e-2)
    def loss_fn(x):
        s, c = shifted_token_loss(m(x), x)
        return s / c
    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    def step(x):
        loss, grads = grad_fn(x)
        opt(grads)
        return loss
    if mode == "graph":
        step = ms.jit(step)
    losses = [float(step(ids).asnumpy()) for _ in range(3)]
    w = m.model.layers[1].feed_forward.w2.weight.asnumpy()
    return {"logits": logits.ravel()[:64].tolist(), "losses": losses, "w": w.ravel()[:64].tolist()}
"""


def _run(mode: str, tmp_path) -> dict:
    """SCRIPT's ``run(mode)`` in this process (tests/conftest.py puts PyNative back after the test); a process for
    each mode imported MindSpore again, about 3 of the test's ~4.5 CPU-s."""
    import mindspore as ms

    script = tmp_path / f"modes_check_{mode}.py"  # graph mode compiles from source files only
    script.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location(script.stem, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[script.stem] = module   # MindSpore's graph parser finds the function's module by name
    try:
        spec.loader.exec_module(module)
        return module.run(mode)
    finally:
        del sys.modules[script.stem]
        ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.mark.slow
def test_graph_and_pynative_agree_on_forward_and_training_steps(tmp_path):
    import numpy as np

    g, p = _run("graph", tmp_path), _run("pynative", tmp_path)
    np.testing.assert_allclose(g["logits"], p["logits"], atol=1e-5)
    np.testing.assert_allclose(g["losses"], p["losses"], rtol=1e-5)
    assert g["losses"][2] < g["losses"][0]  # the step trains
    np.testing.assert_allclose(g["w"], p["w"], atol=1e-5)
