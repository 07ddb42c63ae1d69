"""Length-dependent RoPE where a run leaves the one short row: packed rows, buckets in any order, partial
rotation, all against transformers itself (5.x, installed).

* Packed rows (documents shorter than the original context of 64 inside rows of 160, and a batch where one
  document passes it): the zoo's logits equal HF's, given the same position ids (HF's ``dynamic_rope_update``
  takes ``max(position_ids) + 1``; its mask keeps documents apart from the ids), for every RoPE type the zoo
  takes (longrope, dynamic NTK, YaRN, linear, llama3; Phi-3's default and longrope with a partial rotation);
  the row length's tables (what the zoo used before) are shown to differ, so the comparison can fail.
* Buckets: the torch baseline's model (porting/verify/pair.py ``load_reference``) gives each call the
  frequencies of its own length, as the zoo does, when a shorter bucket past the original context follows a
  longer one; a raw HF model, which keeps the longer length's frequencies, is shown to differ.
* Partial rotation: Phi-3 with ``partial_rotary_factor`` 0.75 matches HF past the original context, forward,
  backward and in a KV-cache generation; the same key on Llama is refused by name; the real Phi-4-mini
  config reads with 96 of 128 dimensions rotated.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_zoo import LlamaConfig, build, rope
from model_zoo.errors import ConfigError
from tests.conftest import FIXTURES

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ORIGINAL = 64
LONG = [1.0 + 0.5 * i for i in range(8)]
SHORT = [1.0 + 0.05 * i for i in range(8)]
# name -> (transformers config class, extra keys); head_dim 16 unless the family's own class says otherwise
KINDS = {
    "longrope": ("LlamaConfig", dict(head_dim=16, max_position_embeddings=256, rope_parameters={
        "rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
        "original_max_position_embeddings": ORIGINAL})),
    "dynamic": ("LlamaConfig", dict(head_dim=16, max_position_embeddings=ORIGINAL,
                                    rope_parameters={"rope_type": "dynamic", "factor": 4.0})),
    "yarn": ("Qwen3Config", dict(head_dim=16, max_position_embeddings=256, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL})),
    # length-independent types: the packed rows gather from one table (the same at any length)
    "linear": ("MistralConfig", dict(head_dim=16, max_position_embeddings=256, sliding_window=None,
                                     rope_parameters={"rope_type": "linear", "factor": 4.0})),
    "llama3": ("LlamaConfig", dict(head_dim=16, max_position_embeddings=256, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL})),
    "phi3-partial-default": ("Phi3Config", dict(max_position_embeddings=256, partial_rotary_factor=0.75)),
    # Phi-4-mini's shape: 3/4 of each head rotated (12 of 16: six factors per list), longrope, top-level original
    "phi3-partial-longrope": ("Phi3Config", dict(max_position_embeddings=256, original_max_position_embeddings=ORIGINAL,
                                                 partial_rotary_factor=0.75, rope_scaling={
                                                     "type": "longrope", "short_factor": SHORT[:6],
                                                     "long_factor": LONG[:6]})),
}
# buckets: dynamic NTK with weights large enough (normal 0.3) that the frequencies move the loss by ~0.1
BUCKETED = ("LlamaConfig", dict(KINDS["dynamic"][1], initializer_range=0.3))
WIDTH = 160
BATCHES = {"short-documents": [[40, 50, 30, 40], [60, 45, 55]],     # every document within the original 64
           "one-long-document": [[40, 100, 20], [60, 45, 55]]}      # one past it: the whole batch goes long


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """kind -> (HF model in eval mode, its directory), seeded random weights written by transformers."""
    import torch
    import transformers

    out = {}
    for kind, (cls, extra) in {**KINDS, "bucketed": BUCKETED}.items():
        torch.manual_seed(0)
        cfg = getattr(transformers, cls)(**{**BASE, **extra})
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
        d = tmp_path_factory.mktemp(kind)
        model.save_pretrained(d)
        out[kind] = (model, d)
    return out


_ZOO: dict = {}


def _zoo(d):
    """The zoo cell of ``d`` with its weights, built once per directory (the tests only run it forward)."""
    from converters.loading import load_hf_dir

    if str(d) not in _ZOO:
        model = build(LlamaConfig.from_hf(d), device="CPU")
        load_hf_dir(model, d)
        _ZOO[str(d)] = model
    return _ZOO[str(d)]


def _packed(docs_rows: list[list[int]]):
    """ids, positions (restarting at 0 for each document, padding at 0), segment ids and cumulative ends of
    rows of WIDTH tokens (porting/train/data/packing.py's layout), and a mask of the real tokens."""
    b = len(docs_rows)
    pos, seg, real = np.zeros((b, WIDTH), np.int32), np.zeros((b, WIDTH), np.int32), np.zeros((b, WIDTH), bool)
    ends = []
    for r, docs in enumerate(docs_rows):
        off = 0
        for k, n in enumerate(docs):
            pos[r, off:off + n], seg[r, off:off + n], real[r, off:off + n] = np.arange(n), k, True
            off += n
            ends.append(r * WIDTH + off)
        seg[r, off:] = len(docs)
        ends.append(r * WIDTH + WIDTH)
    ids = np.random.default_rng(0).integers(3, BASE["vocab_size"], (b, WIDTH)).astype(np.int32)
    return ids, pos, seg, np.asarray(ends, np.int64), real


def _hf_logits(model, ids, pos=None):
    import torch

    with torch.no_grad():
        kw = {} if pos is None else {"position_ids": torch.tensor(pos, dtype=torch.long)}
        return model(input_ids=torch.tensor(ids, dtype=torch.long), use_cache=False, **kw).logits.numpy()


@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_packed_rows_match_transformers(saved, kind, batch):
    from mindspore import Tensor

    hf, d = saved[kind]
    ids, pos, seg, ends, real = _packed(BATCHES[batch])
    got = _zoo(d)(Tensor(ids), Tensor(pos), Tensor(seg), Tensor(ends)).asnumpy()
    want = _hf_logits(hf, ids, pos)
    assert np.abs(got - want)[real].max() <= 1e-5


@pytest.mark.parametrize("kind", ["longrope", "dynamic", "phi3-partial-longrope"])
def test_the_row_lengths_tables_are_not_transformers(saved, kind):
    """The check above can fail: HF's cos at these packed positions is not the row length's table (what the zoo
    gathered from before), and the zoo's in-graph tables are HF's."""
    import torch
    from mindspore import Tensor

    hf, d = saved[kind]
    _, pos, _, _, real = _packed(BATCHES["short-documents"])
    want, _ = hf.model.rotary_emb(torch.zeros(1), torch.tensor(pos, dtype=torch.long))
    cfg = LlamaConfig.from_hf(d)
    row_cos, _ = rope.rope_tables(cfg, WIDTH, WIDTH)
    assert np.abs(row_cos[pos] - want.numpy())[real].max() > 1e-2
    got, _ = build(cfg, device="CPU").packed_rope(Tensor(pos))
    np.testing.assert_allclose(got.asnumpy(), want.numpy(), rtol=0, atol=2e-6)


def test_a_shorter_bucket_after_a_longer_one_equals_the_baselines_model(saved):
    """Buckets of 128 then 96 tokens, both past the original 64, on dynamic NTK: port's tables are a function of
    the call, and so are those of the baseline's reference (load_reference); a raw HF model keeps 128's."""
    from mindspore import Tensor

    from porting.verify.pair import load_reference

    _, d = saved["bucketed"]
    rng = np.random.default_rng(1)
    long_ids, short_ids = (rng.integers(3, BASE["vocab_size"], (2, n)).astype(np.int32) for n in (128, 96))
    zoo = _zoo(d)
    baseline = load_reference(d)
    raw = load_reference(d)
    for m in raw.modules():   # undo the per-call reset: transformers' own state, as a raw HF run keeps it
        m._forward_pre_hooks.clear()
    for ids in (long_ids, short_ids):
        got, want = zoo(Tensor(ids)).asnumpy(), _hf_logits(baseline, ids)
        scale = np.abs(want).max()   # logits of tens: float32's rounding is relative
        assert np.abs(got - want).max() <= 1e-5 * scale
        raw_logits = _hf_logits(raw, ids)
    assert np.abs(got - raw_logits).max() > 1e-2 * scale   # the raw model used 128's frequencies for the 96 bucket


def test_the_baseline_loop_runs_each_bucket_with_its_own_frequencies(saved):
    """The baseline's training loop itself (porting/baseline/torch_loop.py, lr 0 so the weights stay) gives
    each bucket the loss the zoo's forward gives it, longer bucket first."""
    import mindspore as ms
    from mindspore import Tensor

    from model_zoo.loss import shifted_token_loss
    from porting.baseline import torch_loop
    from porting.baseline.memory import meter_for
    from porting.train.data.examples import MicroBatch

    _, d = saved["bucketed"]
    rng = np.random.default_rng(2)
    batches = []
    for n in (128, 96, 80):
        ids = rng.integers(3, BASE["vocab_size"], (2, n)).astype(np.int32)
        batches.append(MicroBatch(ids, ids.copy(), 2 * (n - 1), 2 * n, (0, 1)))
    loop = torch_loop.LoopConfig()
    model = torch_loop.load_model(str(d), loop)
    res = torch_loop.train(model, [[mb] for mb in batches], torch_loop.OptimConfig(lr_at=lambda s: 0.0), loop,
                           meter_for("cpu"))
    zoo = _zoo(d)
    for mb, loss in zip(batches, res.loss):
        logits = zoo(Tensor(mb.input_ids))
        total, count = shifted_token_loss(logits, Tensor(mb.labels, ms.int32))
        want = float(total.asnumpy()) / float(count.asnumpy())
        assert abs(loss - want) <= 1e-5 * abs(want), (mb.input_ids.shape, loss, want)   # a raw HF run: ~0.1 off


def test_partial_rotation_matches_transformers_past_the_original_context(saved):
    from porting.verify.parity import check_parity

    _, d = saved["phi3-partial-longrope"]
    assert LlamaConfig.from_hf(d).rotary_dim == 12
    report = check_parity(d, batch=2, seq=96, hidden_states=True, grads=True)
    assert report["passed"], report["checks"]


def test_generation_with_a_partial_rotation_past_the_original_context_equals_hf_generate(saved):
    """A 60-token prompt and 10 greedy tokens with the KV cache: the cache passes the original 64 mid-way."""
    import torch

    from model_zoo.decode import greedy
    from porting.verify.pair import load_reference, load_zoo

    hf, d = saved["phi3-partial-longrope"]
    # seed 10: HF's top two logits differ by at least 0.02 at every step (no near-tie decides a token)
    prompt = np.random.default_rng(10).integers(3, BASE["vocab_size"], 60).tolist()
    ours = greedy(load_zoo(d), prompt, 10, cache="static")   # its own cell: decoding grows the model's tables
    with torch.no_grad():
        ref = load_reference(d).generate(torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10,
                                         do_sample=False, pad_token_id=0)[0, 60:].tolist()
    assert ours == ref


def test_the_real_phi4_mini_config_rotates_96_of_128_dimensions():
    raw = json.loads((FIXTURES / "model_configs" / "phi4_mini_instruct.json").read_text())
    cfg = LlamaConfig.from_hf(raw)
    assert (cfg.head_dim, cfg.rotary_dim, cfg.partial_rotary_factor) == (128, 96, 0.75)
    assert cfg.rope_scaling["original_max_position_embeddings"] == 4096 and len(cfg.rope_scaling["long_factor"]) == 48
    inv, attention = rope.inv_freq(cfg, 8192)
    assert inv.shape == (48,) and attention == pytest.approx((1 + np.log(32) / np.log(4096)) ** 0.5)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "mistral"])
def test_a_partial_rotation_outside_phi3_is_refused_by_name(model_type):
    raw = {"model_type": model_type, **BASE, "head_dim": 16, "partial_rotary_factor": 0.75}
    with pytest.raises(ConfigError, match=f"partial_rotary_factor: found 0.75; transformers' {model_type} attention "
                                          "rotates the whole head"):
        LlamaConfig.from_hf(raw)
