"""fp32 master weights for bf16 parameters (porting/train/run/step/cells.py AdamW), measured on the real
stories260K at lr 1e-5 through FusedTrainStep in GRAPH_MODE on the CPU.

bf16 storage on the CPU: MindSpore's CPU backend has no bfloat16 Assign, so the parameters are held in
float32 and every write is rounded to bfloat16 (``AdamW(storage_dtype="bfloat16")``, the same
round-to-nearest-even cast the Ascend parameters get); compute is float32 (the weights are cast up).
All three runs start from the same bf16-representable weights, so only the update path differs.
"""

from __future__ import annotations

import numpy as np
import pytest

import mindspore as ms

from porting.train.run.step import cells as train_step

ROOT_ASSET = "model_zoo/assets/stories260k"
STEPS, MICRO, SEQ, LR = 30, 4, 64, 1e-5


# Test bodies and the module-scoped fixtures that train both run in GRAPH_MODE (tests/conftest.py).
pytestmark = [pytest.mark.graph_mode, pytest.mark.usefixtures("graph_mode_module")]


def _batches(root) -> list[np.ndarray]:
    """Real TinyStories text in the model's own tokenizer, as (MICRO, SEQ) batches."""
    from porting.tokenizer import load_tokenizer

    tok = load_tokenizer(root / ROOT_ASSET)
    text = (root / "porting" / "train" / "assets" / "tinystories_sample.txt").read_text()
    ids = np.asarray(tok(text)["input_ids"], np.int32)
    n = len(ids) // (MICRO * SEQ)
    assert n >= 2, len(ids)
    return [ids[i * MICRO * SEQ:(i + 1) * MICRO * SEQ].reshape(MICRO, SEQ) for i in range(n)]


def _run(root, storage: str | None, masters: bool) -> dict:
    from converters.loading import load_hf_dir
    from model_zoo import LlamaConfig, build

    cfg = LlamaConfig.from_hf(root / ROOT_ASSET)
    model = build(cfg, param_dtype="float32", compute_dtype="float32", device="CPU", seed=0)
    load_hf_dir(model, root / ROOT_ASSET)
    params = list(model.trainable_params())
    for p in params:   # the same bf16-representable start for every run
        p.set_data(ms.Tensor(p.asnumpy().astype(ms.dtype_to_nptype(ms.bfloat16)).astype(np.float32)))
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.0, master_weights=masters, storage_dtype=storage)
    step = train_step.FusedTrainStep(model, opt, 1, None)
    batches = _batches(root)
    f = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
    b = ms.Tensor(batches[0])   # one fixed batch: the fp32 loss falls step after step
    start = np.concatenate([p.asnumpy().ravel() for p in params])
    losses, first = [], None
    for t in range(1, STEPS + 1):
        total, count, _, finite = step(b, b, f(1.0 / (MICRO * (SEQ - 1))), f(1.0), f(LR),
                                       f(1 - 0.9 ** t), f(1 - 0.95 ** t))
        assert bool(finite.asnumpy())
        losses.append(float(total.asnumpy()) / float(count.asnumpy()))
        if t == 1:
            stored = np.concatenate([p.asnumpy().ravel() for p in params])
            trained = np.concatenate([m.asnumpy().ravel() for m in opt.masters]) if opt.use_masters else stored
            first = {"stored": float(np.mean(stored != start)), "trained": float(np.mean(trained != start))}
    return {"losses": np.asarray(losses), "first_step_changed": first, "masters": opt.use_masters}


@pytest.fixture(scope="module")
def runs():
    from tests.conftest import ROOT

    return {"fp32": _run(ROOT, None, True), "bf16_masters": _run(ROOT, "bfloat16", True),
            "bf16_plain": _run(ROOT, "bfloat16", False)}


@pytest.mark.slow
def test_master_weights_keep_small_updates_and_track_fp32(runs, capsys):
    fp32, mw, plain = runs["fp32"], runs["bf16_masters"], runs["bf16_plain"]
    assert not fp32["masters"] and mw["masters"] and not plain["masters"]
    with capsys.disabled():
        print(f"\nfirst step, fraction of weights changed: bf16+masters trained (fp32 master) "
              f"{mw['first_step_changed']['trained']:.4f}, stored bf16 {mw['first_step_changed']['stored']:.4f}; "
              f"bf16 without masters {plain['first_step_changed']['trained']:.4f}; fp32 "
              f"{fp32['first_step_changed']['trained']:.4f}")
        for name, r in runs.items():
            print(f"{name}: loss step 1 {r['losses'][0]:.6f} step {STEPS} {r['losses'][-1]:.6f} "
                  f"mean |loss - fp32| {np.abs(r['losses'] - fp32['losses']).mean():.2e}")
    # One step: the masters take (almost) every update; bf16 storage alone loses most of them.
    assert mw["first_step_changed"]["trained"] > 0.95
    assert plain["first_step_changed"]["trained"] < 0.5 * mw["first_step_changed"]["trained"]
    # 30 steps on one batch: with masters the loss falls as fp32's does (in stairs: Adam moves every
    # weight by about lr a step, so the stored bf16 values cross their rounding points together);
    # without them nearly nothing of the fall survives the rounding.
    drop32 = fp32["losses"][0] - fp32["losses"][-1]
    drop_mw = mw["losses"][0] - mw["losses"][-1]
    drop_plain = plain["losses"][0] - plain["losses"][-1]
    assert drop32 > 0.1
    assert drop_mw > 0.8 * drop32
    assert drop_plain < 0.2 * drop32
    err_mw = np.abs(mw["losses"] - fp32["losses"]).mean()
    err_plain = np.abs(plain["losses"] - fp32["losses"]).mean()
    assert err_mw < 0.5 * err_plain


@pytest.mark.compat
def test_bf16_parameters_get_float32_masters():
    """Real bfloat16 Parameters (the Ascend case): one float32 master per parameter, equal to it."""
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(0)
    params = [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)).astype(ms.bfloat16), name=f"w{i}")
              for i, s in enumerate([(8, 4), (4,), (3, 3)])]
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.0)
    assert opt.use_masters and not opt.fused
    assert [m.name for m in opt.masters] == ["master.w0", "master.w1", "master.w2"]
    for m, p in zip(opt.masters, params):
        assert m.dtype == ms.float32
        np.testing.assert_array_equal(m.asnumpy(), p.astype(ms.float32).asnumpy())
    assert not train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.0, master_weights=False).use_masters
    fp32 = [Parameter(Tensor(np.ones((2, 2), np.float32)), name="f")]
    assert not train_step.AdamW(fp32, (0.9, 0.95), 1e-8, 0.0).use_masters


def test_sharded_bf16_parameters_keep_float32_master_shards():
    """ZeRO (porting/train/run/step/zero.py): each rank's float32 master is its flat slice of the parameters."""
    from mindspore import Parameter, Tensor

    from porting.train.plan import sharding
    from porting.train.run.step import zero

    rng = np.random.default_rng(0)
    params = [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)).astype(ms.bfloat16), name=f"w{i}")
              for i, s in enumerate([(8, 4), (4,), (3, 3)])]
    buckets = sharding.flat_buckets([32, 4, 9], 2, type("CF", (), {"enabled": False})(), 2)
    flat = np.concatenate([p.astype(ms.float32).asnumpy().ravel() for p in params])
    for rank in (0, 1):
        opt = zero.ShardedAdamW(params, (0.9, 0.95), 1e-8, 0.0, rank=rank, dp=2, buckets=buckets, native=False)
        assert opt.use_masters and [m.name for m in opt.masters] == [f"master.shard{k}.rank{rank}" for k in range(3)]
        got = np.concatenate([m.asnumpy() for m in opt.masters])
        # the buckets in backward order (the last parameter first: porting/train/plan/comm.py), each padded to 2
        spans = {0: (0, 32), 1: (32, 36), 2: (36, 45)}
        assert [b.indices for b in buckets] == [(2,), (1,), (0,)]
        flats = [np.concatenate([flat[slice(*spans[i])] for i in b.indices]) for b in buckets]
        want = np.concatenate([np.pad(f, (0, -len(f) % 2))[rank * ((len(f) + 1) // 2):(rank + 1) * ((len(f) + 1) // 2)]
                               for f in flats])
        assert all(m.dtype == ms.float32 for m in opt.masters)
        np.testing.assert_array_equal(got, want)


@pytest.mark.compat
def test_accumulation_buffers_follow_grad_reduce_dtype():
    from mindspore import Parameter, ParameterTuple, Tensor

    params = ParameterTuple([Parameter(Tensor(np.ones((3, 2), np.float32)).astype(ms.bfloat16), name="w")])
    assert train_step.accumulation_buffers(params)[0].dtype == ms.float32
    low = train_step.accumulation_buffers(params, grad_fp32=False)[0]
    assert low.dtype == ms.bfloat16 and low.name == "accum.w" and low.shape == (3, 2)
