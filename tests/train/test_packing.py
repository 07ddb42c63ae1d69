"""Packing (``batching.packing: true``, porting/train/data/packing.py): rows, positions, segments and labels;
packed training equals unpacked training on the same examples (loss and gradients, fp32, real
stories260K cells, reference ops and port's C++ CPU kernel); the packed forward equals HF transformers
run on each example alone; the Ascend plan (FlashAttentionScore in TND with cumulative ends) compiled
and trained in GRAPH_MODE on the CPU with contract-enforcing stand-ins (tests/npu_models.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn

from converters.loading import load_hf_dir
from model_zoo import LlamaConfig, build, cpu_kernels, kernels
from model_zoo import llama as llama_mod
from model_zoo.cpu_cells import CpuPackedAttention
from model_zoo.errors import RecipeError
from porting.train.data.batching import build_plan, pad_micro_batch
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.examples import DataReport, Example, MicroBatch, TokenizedData
from porting.train.data.tokenise import tokenize_dataset
from porting.train.data import packing, padding
from porting.train.run.step import cells as train_step
from porting.train.recipe.schema import validate_recipe
from porting.tokenizer import load_tokenizer
from tests.npu_models import GRAPH_KERNELS, NUMPY_KERNELS, KernelContractError
from tests.train.conftest import ROOT

EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
TEXT = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"
SEQ, SLOTS = 160, 4
REFERENCE = {"attention": "reference", "rope": "reference", "rmsnorm": "reference"}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(EMBEDDED)


@pytest.fixture(scope="module")
def alpaca_file(tmp_path_factory):
    """Alpaca rows cut from the real TinyStories sample: short prompts (masked) and outputs of many lengths."""
    lines = [s.strip() for s in TEXT.read_text().splitlines() if len(s.strip()) > 60]
    rows = [{"instruction": s[:30], "input": "", "output": s[30:30 + 25 * (1 + i % 6)]} for i, s in enumerate(lines)]
    p = tmp_path_factory.mktemp("pack") / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _recipe(path, **batching):
    return validate_recipe({"model": {"source": "stories260k"}, "data": {"path": str(path), "max_seq_length": SEQ},
                            "batching": {"micro_batch_size": 2, **batching}})


@pytest.fixture(scope="module")
def td(tok, alpaca_file):
    return tokenize_dataset(_recipe(alpaca_file).data, tok)


@pytest.fixture(scope="module")
def packed(td):
    """Two packed rows of several examples each, and the examples they hold."""
    rows = packing.pack_rows(td.lengths, SEQ, SLOTS, seed=0)
    two = sorted(rows, key=len)[-2:]
    assert all(len(r) >= 2 for r in two), rows
    return two, packing.pack_micro_batch(td, two, packing.row_length(SEQ, SLOTS), SLOTS)


# ------------------------------------------------------------------ rows, positions, segments, labels
def test_rows_hold_every_example_once_within_the_bounds(td):
    rows = packing.pack_rows(td.lengths, SEQ, SLOTS, seed=3)
    assert sorted(i for r in rows for i in r) == list(range(len(td.examples)))
    assert all(1 <= len(r) <= SLOTS and sum(td.examples[i].length for i in r) <= SEQ for r in rows)
    assert len(rows) < len(td.examples)   # short examples do share rows


def test_packed_micro_batch_resets_positions_and_masks_boundary_labels(td, packed):
    rows, mb = packed
    pos, seg, ends = mb.packed
    width = packing.row_length(SEQ, SLOTS)
    assert mb.input_ids.shape == pos.shape == seg.shape == (2, width)
    assert ends.dtype == np.int64 and ends.shape == (2 * SLOTS,)
    assert (np.diff(ends, prepend=0) > 0).all() and ends[-1] == 2 * width   # no empty segment, last = T
    want_tokens = 0
    for r, row in enumerate(rows):
        off = 0
        for slot, i in enumerate(row):
            e = td.examples[i]
            sl = slice(off, off + e.length)
            assert (mb.input_ids[r, sl] == e.input_ids).all()
            assert (pos[r, sl] == np.arange(e.length)).all() and (seg[r, sl] == slot).all()
            assert mb.labels[r, off] == IGNORE_INDEX                       # nothing predicts across
            assert (mb.labels[r, off + 1:off + e.length] == e.labels[1:]).all()
            assert ends[r * SLOTS + slot] == r * width + off + e.length
            want_tokens += int((e.labels[1:] != IGNORE_INDEX).sum())
            off += e.length
        assert (mb.labels[r, off:] == IGNORE_INDEX).all()
    assert mb.tokens == want_tokens and mb.real_tokens == sum(td.examples[i].length for r in rows for i in r)


def test_plan_packs_every_step_to_one_shape_and_reports_both_paddings(tok, alpaca_file):
    r = _recipe(alpaca_file, packing=True)
    plan = build_plan(r, tok)
    assert plan.describe()["packing"] and len(plan.shapes()) == 1
    width = plan.boundaries[0]
    assert width == packing.row_length(SEQ, plan.slots)
    seen = [i for s in plan.steps() for mb in s.micro_batches for i in mb.example_ids]
    assert len(seen) == len(set(seen))     # one epoch: no example twice
    assert all(mb.shape == (2, width) and mb.packed[2].shape == (2 * plan.slots,)
               for s in plan.steps() for mb in s.micro_batches)
    # at one static shape each, packing pads far less than padding every row to the longest example
    one = _recipe(alpaca_file, packing=True, bucketing={"max_shapes": 1})
    choices = padding.padding_choices(one, tok)
    assert choices.packing.shapes == choices.bucketing.shapes == 1
    assert choices.packing.padding_fraction < choices.bucketing.padding_fraction - 0.1
    _, line = padding.dry_run_padding(r)
    assert line.startswith("padding per epoch (using packing): bucketing ") and f"rows of {width} tokens" in line


def test_recipe_refuses_packing_with_bucket_boundaries(alpaca_file):
    with pytest.raises(RecipeError, match="batching.packing.*batching.bucketing.boundaries"):
        _recipe(alpaca_file, packing=True, bucketing={"boundaries": [64, 160]})


# ------------------------------------------------------------------ packed training == unpacked training
def _grad_step(kernels_override):
    """port's real gradient step (AccumGradStep) on stories260K, and its parameters and buffers."""
    m = build(LlamaConfig.from_hf(EMBEDDED), device="CPU", kernels_override=kernels_override)
    load_hf_dir(m, EMBEDDED)
    params = ParameterTuple(list(m.trainable_params()))
    buffers = train_step.accumulation_buffers(params)
    return train_step.AccumGradStep(m, params, buffers), params, buffers


def _grads(grad_step, mb, tokens):
    """(summed loss, token count, gradients) of one micro-batch, its loss scaled by 1/tokens."""
    step, params, buffers = grad_step
    for b in buffers:
        b.set_data(Tensor(np.zeros(b.shape, np.float32)))
    t, c = step(Tensor(mb.input_ids), Tensor(mb.labels), Tensor(np.float32(1.0 / tokens)),
                *train_step.packed_inputs(mb))
    return float(t.asnumpy()), float(c.asnumpy()), {p.name: b.asnumpy().copy() for p, b in zip(params, buffers)}


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_packed_training_equals_unpacked_on_the_same_examples(td, packed, impl):
    if impl == "cpu" and not cpu_kernels.available():
        pytest.skip(f"no C++ compiler for port's CPU kernels: {cpu_kernels.status()[1]}")
    rows, mb = packed
    override = REFERENCE if impl == "reference" else {"attention": "cpu"}
    # the same examples unpacked: one padded row each, in one micro-batch
    unpacked = pad_micro_batch(td, [i for row in rows for i in row], [SEQ])
    step = _grad_step(override)
    tot_p, cnt_p, g_p = _grads(step, mb, mb.tokens)
    tot_u, cnt_u, g_u = _grads(step, unpacked, mb.tokens)
    assert cnt_p == cnt_u == mb.tokens
    assert tot_p == pytest.approx(tot_u, rel=1e-6)
    rtol = 2e-5 if impl == "reference" else 5e-5   # the kernel sums in another order
    for k in g_u:
        np.testing.assert_allclose(g_p[k], g_u[k], rtol=rtol, atol=rtol * np.abs(g_u[k]).max(), err_msg=k)
    if impl == "cpu":
        return
    # A mask that let examples see each other would change the gradients far beyond that.
    leaky = MicroBatch(mb.input_ids, mb.labels, mb.tokens, mb.real_tokens, mb.example_ids,
                         (mb.packed[0], np.zeros_like(mb.packed[1]), mb.packed[2]))
    _, _, g_leak = _grads(step, leaky, mb.tokens)
    assert max(np.abs(g_leak[k] - g_u[k]).max() / np.abs(g_u[k]).max() for k in g_u) > 1e-3


def test_packed_forward_equals_hf_on_each_example_alone(td, packed):
    """HF is the reference: each example's logits inside a packed row equal HF's on the example alone."""
    import torch
    from transformers import LlamaForCausalLM

    rows, mb = packed
    hf = LlamaForCausalLM.from_pretrained(str(EMBEDDED), torch_dtype=torch.float32).eval()
    m = build(LlamaConfig.from_hf(EMBEDDED), device="CPU")
    load_hf_dir(m, EMBEDDED)
    got = m(Tensor(mb.input_ids), *train_step.packed_inputs(mb)).asnumpy()
    for r, row in enumerate(rows):
        off = 0
        for i in row:
            e = td.examples[i]
            with torch.no_grad():
                want = hf(torch.as_tensor(e.input_ids[None].astype(np.int64))).logits[0].numpy()
            np.testing.assert_allclose(got[r, off:off + e.length], want, atol=1e-4, rtol=1e-4)
            off += e.length


# ------------------------------------------------------------------ Ascend: TND in GRAPH_MODE on the CPU
CFG = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
G_SEQ, G_SLOTS = 24, 3


def _synthetic_packed():
    rng = np.random.default_rng(4)
    lens = [7, 9, 5, 11, 4, 6]
    ex = [Example(rng.integers(3, CFG.vocab_size, n).astype(np.int32), rng.integers(3, CFG.vocab_size, n)
                    .astype(np.int32), i) for i, n in enumerate(lens)]
    data = TokenizedData(ex, DataReport("x", "0", "text"), 0)
    return packing.pack_micro_batch(data, [[0, 1, 2], [3, 4]], packing.row_length(G_SEQ, G_SLOTS), G_SLOTS)


def _one_step(fused: bool, mb):
    if fused:
        with llama_mod.fused_ops_replaced(GRAPH_KERNELS):
            model = build(CFG, param_dtype="float32", compute_dtype="float16", device="Ascend", seed=5)
        assert all(c.fused for c in model.plan.choices())
    else:
        model = build(CFG, param_dtype="float32", compute_dtype="float16", device="CPU", seed=5,
                      kernels_override=REFERENCE)
    opt = train_step.AdamW(list(model.trainable_params()), (0.9, 0.95), 1e-8, 0.1)
    step = train_step.FusedTrainStep(model, opt, 1, 1.0)
    before = {p.name: p.asnumpy().copy() for p in model.trainable_params()}
    f = lambda x: Tensor(np.float32(x))  # noqa: E731
    total, count, norm, finite = step(Tensor(mb.input_ids), Tensor(mb.labels), f(1.0 / mb.tokens), f(1.0),
                                      f(1e-3), f(0.1), f(0.05), *train_step.packed_inputs(mb))
    moved = {p.name: p.asnumpy() - before[p.name] for p in model.trainable_params()}
    return float(total.asnumpy()) / float(count.asnumpy()), float(norm.asnumpy()), bool(finite.asnumpy()), moved


@pytest.mark.graph_mode
@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_packed_ascend_plan_trains_in_graph_mode_like_the_reference():
    """FusedTrainStep (forward, backward, clip, AdamW in one graph) with TND flash attention and B1SD
    fused RoPE, against the reference kernels on the same packed rows; fp16 compute."""
    assert ms.get_context("mode") == ms.GRAPH_MODE
    mb = _synthetic_packed()
    loss_f, norm_f, fin_f, moved_f = _one_step(True, mb)
    loss_r, norm_r, fin_r, moved_r = _one_step(False, mb)
    assert fin_f and fin_r
    assert loss_f == pytest.approx(loss_r, rel=5e-3) and loss_f == pytest.approx(np.log(CFG.vocab_size), rel=0.1)
    assert norm_f == pytest.approx(norm_r, rel=3e-2)
    for k in moved_r:
        big = np.abs(moved_r[k]) > 5e-4
        assert np.mean(np.sign(moved_f[k][big]) == np.sign(moved_r[k][big])) > 0.97, k


def _tnd_inputs():
    rng = np.random.default_rng(0)
    q = Tensor(rng.standard_normal((20, 4, 32)).astype(np.float32)).astype(ms.float16)
    k = Tensor(rng.standard_normal((20, 2, 32)).astype(np.float32)).astype(ms.float16)
    kw = dict(head_num=4, attn_mask=Tensor(kernels.compressed_causal_mask()), scalar_value=32 ** -0.5,
              input_layout="TND", sparse_mode=3, next_tokens=0,
              actual_seq_qlen=Tensor(np.array([6, 13, 20], np.int64)),
              actual_seq_kvlen=Tensor(np.array([6, 13, 20], np.int64)))
    return q, k, kw


def test_tnd_stand_in_computes_what_the_numpy_model_computes():
    q, k, kw = _tnd_inputs()
    want = NUMPY_KERNELS["flash_attention_score"](q, k, k, **kw).asnumpy().astype(np.float32)
    got = GRAPH_KERNELS["flash_attention_score"](q, k, k, **kw).asnumpy().astype(np.float32)
    np.testing.assert_allclose(got, want, atol=2e-3)
    # and each sequence alone in BNSD (the unpacked call) gives the same rows
    for lo, hi in ((0, 6), (6, 13), (13, 20)):
        qb = Tensor(q.asnumpy()[lo:hi].transpose(1, 0, 2)[None])
        kb = Tensor(k.asnumpy()[lo:hi].transpose(1, 0, 2)[None])
        one = NUMPY_KERNELS["flash_attention_score"](qb, kb, kb, **kernels.flash_attention_kwargs(
            num_heads=4, head_dim=32, q_len=hi - lo, kv_len=hi - lo)).asnumpy()[0].transpose(1, 0, 2)
        np.testing.assert_allclose(want[lo:hi], one.astype(np.float32), atol=2e-3)


@pytest.mark.parametrize("change,match", [
    (lambda kw: {**kw, "actual_seq_qlen": kw["actual_seq_qlen"].astype(ms.int32)}, "int64"),
    (lambda kw: {**kw, "next_tokens": 2147483647}, "next_tokens 0"),
    (lambda kw: {**kw, "sparse_mode": 0}, "sparse_mode 2 or 3"),
    (lambda kw: {**kw, "actual_seq_qlen": None}, "actual_seq_qlen and actual_seq_kvlen"),
    (lambda kw: {**kw, "attn_mask": kw["attn_mask"][:1024, :1024]}, r"\(2048, 2048\)"),
])
def test_tnd_stand_in_rejects(change, match):
    q, k, kw = _tnd_inputs()
    with pytest.raises((TypeError, ValueError), match=match):
        GRAPH_KERNELS["flash_attention_score"](q, k, k, **change(kw))


@pytest.mark.parametrize("ends,match", [([6, 13, 19], "last equal to T=20"), ([6, 6, 20], "0 must not exist"),
                                        ([13, 6, 20], "non-decreasing")])
def test_tnd_numpy_model_checks_the_cumulative_ends(ends, match):
    q, k, kw = _tnd_inputs()
    e = Tensor(np.array(ends, np.int64))
    with pytest.raises(KernelContractError, match=match):
        NUMPY_KERNELS["flash_attention_score"](q, k, k, **{**kw, "actual_seq_qlen": e, "actual_seq_kvlen": e})


# ------------------------------------------------------------------ the C++ kernel's packed entry points
class _PackedLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.attn = CpuPackedAttention()

    def construct(self, q, k, v, seg, w):
        return (self.attn(q, k, v, seg) * w).sum()


class _RefLoss(nn.Cell):
    def construct(self, q, k, v, seg, w):
        return (llama_mod.reference_attention(q, k, v, q.shape[-1] ** -0.5, 2, 0, seg) * w).sum()


@pytest.mark.skipif(not cpu_kernels.available(), reason=f"{cpu_kernels.status()[1]}")
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_cpu_packed_kernel_matches_the_block_diagonal_reference(mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    rng = np.random.default_rng(2)
    b, n, g, s, d = 2, 4, 2, 29, 16
    q, w = (rng.standard_normal((b, n, s, d)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((b, g, s, d)).astype(np.float32) for _ in range(2))
    seg = np.array([[0] * 5 + [1] * 13 + [2] * 11, [0] * 20 + [1] * 9], np.int32)
    args = [Tensor(x) for x in (q, k, v, seg, w)]
    np.testing.assert_allclose(_PackedLoss().attn(*args[:4]).asnumpy(),
                               llama_mod.reference_attention(*args[:3], d ** -0.5, 2, 0, args[3]).asnumpy(),
                               rtol=1e-5, atol=2e-6)
    got = ms.value_and_grad(_PackedLoss(), grad_position=(0, 1, 2))(*args)[1]
    want = ms.value_and_grad(_RefLoss(), grad_position=(0, 1, 2))(*args)[1]
    for name, a, b_ in zip("qkv", got, want):
        np.testing.assert_allclose(a.asnumpy(), b_.asnumpy(), rtol=1e-4, atol=5e-5, err_msg=f"d{name}")


def test_dry_run_prints_the_padding_of_both_choices():
    """`port train --dry-run` on the tiny recipe: one line for bucketing vs packing, and both in --json."""
    from click.testing import CliRunner

    from porting.cli import main

    recipe = str(ROOT / "recipes" / "tiny-cpu.yaml")
    res = CliRunner().invoke(main, ["train", recipe, "--dry-run"])
    assert res.exit_code == 0, res.output
    line = [x for x in res.output.splitlines() if x.startswith("padding per epoch")]
    assert line and "(using bucketing): bucketing " in line[0] and "; packing " in line[0], res.output[-2000:]
    res = CliRunner().invoke(main, ["train", recipe, "--dry-run", "--json", "--set", "batching.packing=true"])
    assert res.exit_code == 0, res.output
    padding = json.loads(res.output)["padding"]
    assert padding["packing"]["shapes"] == 1 and padding["bucketing"]["real_tokens"] > 0
    assert padding["packing"]["segments_per_row"] >= 1
    from porting.train.plan.make import TrainPlan   # the document reads back with its padding records

    back = TrainPlan.from_dict(json.loads(res.output), "--dry-run --json")
    assert back.padding is not None and back.padding.packing.shapes_list == tuple(padding["packing"]["shapes_list"])
    assert json.dumps(back.to_dict(), indent=2) + "\n" == res.output


def test_unused_slots_become_padding_segments_and_a_full_row_keeps_its_count():
    """Rows are seq + slots - 1 long: every slot is a non-empty segment (TND: no empty key segment)."""
    ex = [Example(np.arange(1, n + 1, dtype=np.int32), np.arange(1, n + 1, dtype=np.int32), i)
          for i, n in enumerate([5, 3, 2, 2, 2, 2])]
    width = packing.row_length(10, 4)
    assert width == 13
    ids, labels, pos, seg, ends = packing.row_arrays(ex, [0, 1], width, 4, pad_id=0, base=100)
    assert ends == [105, 108, 109, 113]                       # two examples, then 1 and 4 padding tokens
    assert seg.tolist() == [0] * 5 + [1] * 3 + [2] + [3] * 4
    assert pos.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 0, 0, 0]   # padding at 0: max + 1 is the longest example
    assert (labels[8:] == IGNORE_INDEX).all() and (ids[8:] == 0).all()
    _, labels, pos, seg, ends = packing.row_arrays(ex, [2, 3, 4, 5], width, 4, pad_id=0, base=0)
    assert ends == [2, 4, 6, 13] and seg.tolist() == [0, 0, 1, 1, 2, 2] + [3] * 7   # the last one takes the padding
    assert pos.tolist()[6:] == [0, 1] + [0] * 5 and (labels[8:] == IGNORE_INDEX).all()
    with pytest.raises(RecipeError, match="more than data.max_seq_length=10"):
        packing.pack_rows(np.array([4, 11]), 10, 4, seed=0)
