"""Two real optimizer steps of the Ascend kernel plan (stand-ins for the fused ops) through `port train`'s
step graphs, in GRAPH_MODE on the CPU: ``dp`` under msrun (each rank one micro-batch, FusedTrainStep with
the gradient all-reduce) or ``accum`` in one process (AccumGradStep over both micro-batches + ApplyStep).
Both see the same global batch, so they must end at the same weights. Writes JSON to argv[2]."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import ParameterTuple  # noqa: E402

from model_zoo import LlamaConfig, build  # noqa: E402
from model_zoo import llama as llama_mod  # noqa: E402
from porting.train.run import faults  # noqa: E402
from porting.train.run.step import cells as train_step  # noqa: E402
from porting.train.run.step import probes  # noqa: E402
from tests.npu_models import GRAPH_KERNELS  # noqa: E402

CFG = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
MICRO, SEQ, STEPS = 2, 16, 2


def main(mode: str, out: str) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    world, rank = 1, 0
    if mode == "dp":
        from mindspore.communication import get_group_size, get_rank, init
        from mindspore.device_context.cpu.op_tuning import threads_num

        threads_num(1)
        init()
        world, rank = get_group_size(), get_rank()
        probes.install(faults.active(), rank)   # the suite's refusal of the retiring parallel API (tests/conftest.py)
    with llama_mod.fused_ops_replaced(GRAPH_KERNELS):
        model = build(CFG, param_dtype="float32", compute_dtype="float16", device="Ascend", seed=9)
    assert all(c.fused for c in model.plan.choices())
    params = list(model.trainable_params())
    opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.1)
    rng = np.random.default_rng(4)
    data = [[rng.integers(0, CFG.vocab_size, (MICRO, SEQ)).astype(np.int32) for _ in range(2)] for _ in range(STEPS)]
    f = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
    scale = f(1.0 / (2 * MICRO * (SEQ - 1)))
    losses = []
    if mode == "dp":
        step = train_step.FusedTrainStep(model, opt, world, 1.0)
    else:
        buffers = train_step.accumulation_buffers(ParameterTuple(params))
        grad_step = train_step.AccumGradStep(model, opt.params, buffers)
        apply = train_step.ApplyStep(opt, buffers, 1, 1.0)
    for t in range(1, STEPS + 1):
        hyper = (f(1e-3), f(1 - 0.9 ** t), f(1 - 0.95 ** t))
        if mode == "dp":
            ids = ms.Tensor(data[t - 1][rank])
            total, count, _, finite = step(ids, ids, scale, f(1.0), *hyper)
        else:
            tot = cnt = 0.0
            for b in data[t - 1]:
                a, c = grad_step(ms.Tensor(b), ms.Tensor(b), scale)
                tot, cnt = tot + float(a.asnumpy()), cnt + float(c.asnumpy())
            total, count, _, finite = apply(f(tot), f(cnt), f(1.0), *hyper)
        assert bool(finite.asnumpy())
        losses.append(float(total.asnumpy()) / float(count.asnumpy()))
    if rank == 0:
        weights = {p.name: p.asnumpy().ravel()[:256].tolist() for p in params}
        Path(out).write_text(json.dumps({"world": world, "losses": losses, "weights": weights,
                                         "pid": os.getpid()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
