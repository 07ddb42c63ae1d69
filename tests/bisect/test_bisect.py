"""`port bisect` on the real stories260K (HF reference: real transformers): a clean conversion bisects to
"no divergence", and each perturbation of a COPY of the converted checkpoint (or of its config, or of the
built MindSpore model through the ``ms_hook`` test hook) is named at its layer, block and phase."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import EMBEDDED

pytestmark = pytest.mark.slow   # one HF and one MindSpore forward/backward per test (~10 s on 2 cores)

W = "model.layers.{}.{}"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    from converters import convert

    out = tmp_path_factory.mktemp("bisect") / "ms"
    convert.hf_to_ms(EMBEDDED, out)
    return out


def _copy(converted: Path, tmp_path: Path, edit=None, config=None) -> Path:
    """A copy of the conversion, with ``edit(tensors)`` applied to its safetensors or ``config(dict)`` to its
    config.json."""
    from safetensors.numpy import load_file, save_file

    dst = tmp_path / "ms"
    shutil.copytree(converted, dst)
    if edit is not None:
        tensors = load_file(dst / "model.safetensors")
        edit(tensors)
        save_file(tensors, dst / "model.safetensors")
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _bisect(ms_dir: Path, **kw) -> dict:
    from porting.bisect.run import bisect

    return bisect(EMBEDDED, ms_dir, **kw)


def _named(rep: dict, layer, block, phase, key="first_divergent") -> None:
    got = rep[key]
    assert got is not None, rep["verdict"]
    assert (got["layer"], got["block"], got["phase"]) == (layer, block, phase), got
    # everything before it in data-flow order is within tolerance (or, for NaN origin, finite)
    before = rep["rows"][: next(i for i, r in enumerate(rep["rows"]) if r["tensor"] == got["tensor"]
                                and r["phase"] == got["phase"])]
    if key == "first_divergent":
        assert all(r["passed"] for r in before if r["metrics"] is not None)
    else:
        assert all(r["metrics"]["nonfinite_ms"] == 0 for r in before if r["metrics"] is not None)


def test_clean_conversion_is_no_divergence(converted):
    rep = _bisect(converted)
    assert rep["first_divergent"] is None and rep["verdict"].startswith("no divergence")
    assert rep["unobserved"] == 0 and rep["compared"] == len(rep["rows"])
    phases = {r["phase"] for r in rep["rows"]}
    assert phases == {"forward", "backward"}
    # every layer's every block in both directions, and one gradient row per parameter (47)
    assert sum(r["tensor"].startswith("d loss / d model") or r["tensor"].startswith("d loss / d lm_head")
               for r in rep["rows"]) == 47
    assert {r["block"] for r in rep["rows"] if r["layer"] == 4} >= {
        "attention_norm", "q_proj", "k_proj", "v_proj", "q_rope", "k_rope", "attention", "o_proj", "mlp_norm",
        "gate_proj", "up_proj", "swiglu", "down_proj", "output"}
    assert all(r["metrics"]["cosine"] > 0.99999 for r in rep["rows"])
    kernels = {r["block"]: r["kernel"] for r in rep["rows"] if r["layer"] == 0}
    assert kernels["attention"].startswith("attention:") and kernels["q_rope"].startswith("rope:")


def test_rmsnorm_weight_scaled_in_one_layer(converted, tmp_path):
    def edit(t):
        t[W.format(3, "attention_norm.weight")] = t[W.format(3, "attention_norm.weight")] * np.float32(1.01)
    _named(_bisect(_copy(converted, tmp_path, edit)), 3, "attention_norm", "forward")


def test_wrong_rms_norm_eps_in_one_layer(converted):
    import mindspore as ms

    def hook(model):   # the test hook: layer 2's MLP norm built with eps 1e-3 instead of config.json's 1e-5
        norm = model.model.layers[2].ffn_norm
        norm.eps = 1e-3
        if norm.cpu is not None:
            norm.cpu.eps = ms.Tensor([1e-3], ms.float32)
    _named(_bisect(converted, ms_hook=hook), 2, "mlp_norm", "forward")


def _interleave(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The row order of Meta's interleaved RoPE layout, from HF's rotate-half rows (the inverse of
    transformers' convert_llama_weights_to_hf.py ``permute``)."""
    d1, d2 = w.shape
    return w.reshape(n_heads, 2, d1 // n_heads // 2, d2).transpose(0, 2, 1, 3).reshape(d1, d2)


def test_rope_layout_permutation_of_q_and_k(converted, tmp_path):
    def edit(t):
        t[W.format(1, "attention.wq.weight")] = _interleave(t[W.format(1, "attention.wq.weight")], 8)
        t[W.format(1, "attention.wk.weight")] = _interleave(t[W.format(1, "attention.wk.weight")], 4)
    _named(_bisect(_copy(converted, tmp_path, edit)), 1, "q_proj", "forward")


def test_wrong_rope_theta(converted, tmp_path):
    rep = _bisect(_copy(converted, tmp_path, config=lambda c: c.__setitem__("rope_theta", 500000.0)))
    _named(rep, 0, "q_rope", "forward")
    assert any("rope_theta" in n for n in rep["notes"])


class _WrongBackward:
    """An identity cell whose bprop scales the gradient by 1.5: a gradient bug in the backward only."""

    def __new__(cls):
        from mindspore import nn

        class WrongBackward(nn.Cell):
            def construct(self, x):
                return x

            def bprop(self, x, out, dout):
                return (dout * 1.5,)
        return WrongBackward()


def test_gradient_bug_in_one_layers_backward(converted):
    bad = _WrongBackward()

    def hook(model):
        model.model.layers[3].ffn_norm.register_forward_hook(lambda cell, inputs, out: bad(out))
    rep = _bisect(converted, ms_hook=hook)
    _named(rep, 3, "mlp_norm", "backward")
    assert all(r["passed"] for r in rep["rows"] if r["phase"] == "forward")


def test_nan_origin(converted):
    import mindspore as ms

    def hook(model):
        def poison(cell, inputs, out):
            mask = np.zeros(out.shape, np.float32)
            mask[0, 5, 7] = np.nan
            return out + ms.Tensor(mask)
        model.model.layers[2].attention.wo.register_forward_hook(poison)
    rep = _bisect(converted, ms_hook=hook, nan_origin=True)
    _named(rep, 2, "o_proj", "forward", key="first_nonfinite")
    assert rep["mode"] == "nan-origin" and rep["verdict"].startswith("first non-finite: layer 2 o_proj")


def test_cli_on_real_text_json(converted):
    """The command as a user runs it, on the first tokens of real TinyStories text (--data): exit 0, the
    JSON's first_divergent null, every row a dict with the documented keys."""
    from click.testing import CliRunner

    from porting.cli import main
    from tests.attacks.harness import SAMPLE_TEXT

    res = CliRunner().invoke(main, ["bisect", "--hf", str(EMBEDDED), "--ms", str(converted), "--data",
                                    str(SAMPLE_TEXT), "--seq", "64", "--json"])
    assert res.exit_code == 0, res.output[-2000:]
    rep = json.loads(res.stdout)
    assert rep["first_divergent"] is None and rep["batch"] == [2, 64] and rep["weights"] == "convert"
    assert set(rep["rows"][0]) >= {"phase", "layer", "block", "tensor", "kernel", "metrics", "measure", "tolerance"}
    assert rep["loss"]["hf"] < 3.0    # real text: the model knows it (about 1.3 nats/token)


def test_qwen3_bisects_its_q_and_k_norm_blocks(tmp_path):
    """Qwen3 (random weights saved by transformers): the per-head q/k norms are blocks of their own, clean
    against HF, and a scaled k norm in layer 1 is named there, after q_norm and before k_rope."""
    from converters import convert
    from porting.bisect.run import bisect
    from tests.converters.conftest import make_hf

    hf = make_hf(tmp_path / "hf", "qwen3")
    ms_dir = tmp_path / "ms0"
    convert.hf_to_ms(hf, ms_dir)
    rep = bisect(hf, ms_dir)
    assert rep["first_divergent"] is None and rep["unobserved"] == 0, rep["verdict"]
    blocks_1 = [r["block"] for r in rep["rows"] if r["layer"] == 1 and r["phase"] == "forward"]
    assert blocks_1.index("v_proj") < blocks_1.index("q_norm") < blocks_1.index("k_norm") < blocks_1.index("q_rope")

    def edit(t):
        t[W.format(1, "attention.k_layernorm.weight")] = t[W.format(1, "attention.k_layernorm.weight")] * np.float32(1.01)
    rep = bisect(hf, _copy(ms_dir, tmp_path, edit))
    assert (rep["first_divergent"]["layer"], rep["first_divergent"]["block"]) == (1, "k_norm"), rep["first_divergent"]
