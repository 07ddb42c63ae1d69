"""Run under msrun (2 workers) by tests/train/test_zero.py, with stand-ins for the fused Ascend kernels
(tests/npu_models.py) in GRAPH_MODE on the CPU:

- compiles, without running, the Ascend plan's sharded step graphs (native
  ReduceScatter; the CPU's would be a stub) for one micro-batch a step (FusedTrainStep) and for ZeRO-2
  accumulation (ShardedAccumGradStep + ApplyStep), each dumping its IR under OUT/ir/<name>;
- then runs 2 optimizer steps of 2 accumulated micro-batches a rank, three ways from the same
  weights: plain data parallel (AllReduce), ZeRO-1 and ZeRO-2 with the CPU's emulated reduce-scatter;
  rank 0 writes the losses and weights of each, and the compile errors, to OUT/result.json.
"""

from __future__ import annotations

import json
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
from porting.train.run.step import zero  # noqa: E402
from porting.train.recipe.schema import validate_recipe  # noqa: E402
from tests.npu_models import GRAPH_KERNELS  # noqa: E402

CFG = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
MICRO, SEQ, STEPS, ACCUM = 2, 16, 2, 2
SPLITS = [4, 9]   # comm_fusion index mode: 3 flat buckets, in backward order (parameters 11-10, 9-5, 4-0)


def recipe(accum: int, stage: str | int = "auto", device: str = "ascend"):
    return validate_recipe({
        "model": {"source": "x"}, "data": {"path": "x", "max_seq_length": SEQ},
        "batching": {"micro_batch_size": MICRO, "grad_accum_steps": accum},
        "optimizer": {"lr": 1e-3, "weight_decay": 0.1, "grad_clip": 1.0},
        "parallel": {"optimizer_sharding": True, "zero_stage": stage,
                     "comm_fusion": {"allreduce_mode": "index", "allreduce_config": SPLITS}},
        "cluster": {"device": device, "devices_per_node": 2}}, check_files=False)


def model(ascend: bool = True):
    """The Ascend kernel plan with stand-ins (the graphs compiled), or the CPU plan in float32 (the runs
    compared: float16 compute would blur a 1e-6 comparison)."""
    if not ascend:
        return build(CFG, param_dtype="float32", compute_dtype="float32", device="CPU", seed=9)
    with llama_mod.fused_ops_replaced(GRAPH_KERNELS):
        m = build(CFG, param_dtype="float32", compute_dtype="float16", device="Ascend", seed=9)
    assert all(c.fused for c in m.plan.choices())
    return m


f32 = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
HYPER = (f32(1e-3), f32(0.1), f32(0.05))


def compile_graphs(ir_dir: Path, rank: int, world: int) -> dict:
    """Each graph's IR in its own folder; the CPU has no ReduceScatter kernel, so a graph holding one
    stops at kernel selection, after the kernel graph (hwopt_common_before_graph_*.ir) was dumped."""
    ids = ms.Tensor(np.zeros((MICRO, SEQ), np.int32))
    errors = {}

    def compile_in(name, cell, *args):
        ms.set_context(save_graphs=1, save_graphs_path=str(ir_dir / name))
        try:
            cell.compile(*args)
        except RuntimeError as e:   # kept for the test to check: only the missing CPU kernel may stop it
            errors[name] = " ".join(str(e).split())[:300]
        ms.set_context(save_graphs=0)

    for accum in (1, ACCUM):
        m = model()
        opt, choice = zero.optimizer_for(recipe(accum, 2 if accum > 1 else "auto"), CFG, list(m.trainable_params()),
                                         rank, world, reduce_scatter="reduce_scatter")
        assert opt.native and choice.stage == (2 if accum > 1 else 1)
        if accum == 1:
            compile_in("fused", train_step.FusedTrainStep(m, opt, world, 1.0), ids, ids, f32(1.0), f32(1.0), *HYPER)
        else:
            buffers = opt.shard_buffers()
            compile_in("zero2_accum", zero.ShardedAccumGradStep(m, opt, buffers), ids, ids, f32(1.0))
            compile_in("zero2_apply", train_step.ApplyStep(opt, buffers, world, 1.0), f32(1.0), f32(1.0), f32(1.0),
                       *HYPER)
    return errors


def train(kind: str, rank: int, world: int, data) -> dict:
    m = model(ascend=False)
    params = list(m.trainable_params())
    if kind == "dp":
        opt = train_step.AdamW(params, (0.9, 0.95), 1e-8, 0.1)
        buffers = train_step.accumulation_buffers(ParameterTuple(params))
        grad_step = train_step.AccumGradStep(m, opt.params, buffers)
    else:
        stage = 1 if kind == "zero1" else 2
        opt, choice = zero.optimizer_for(recipe(ACCUM, stage), CFG, params, rank, world,
                                         reduce_scatter="allreduce+slice")
        assert not opt.native and choice.stage == stage
        if stage == 2:
            buffers = opt.shard_buffers()
            grad_step = zero.ShardedAccumGradStep(m, opt, buffers)
        else:
            buffers = train_step.accumulation_buffers(ParameterTuple(params))
            grad_step = train_step.AccumGradStep(m, opt.params, buffers)
    apply = train_step.ApplyStep(opt, buffers, world, 1.0)
    start = np.concatenate([p.asnumpy().ravel() for p in params])
    scale = f32(1.0 / (world * ACCUM * MICRO * (SEQ - 1)))
    losses = []
    for t in range(1, STEPS + 1):
        tot = cnt = 0.0
        for b in data[t - 1][rank]:
            a, c = grad_step(ms.Tensor(b), ms.Tensor(b), scale)
            tot, cnt = tot + float(a.asnumpy()), cnt + float(c.asnumpy())
        total, count, norm, finite = apply(f32(tot), f32(cnt), f32(1.0), f32(1e-3), f32(1 - 0.9 ** t),
                                           f32(1 - 0.95 ** t))
        assert bool(finite.asnumpy())
        losses.append([float(total.asnumpy()) / float(count.asnumpy()), float(norm.asnumpy())])
    moved = float(np.abs(np.concatenate([p.asnumpy().ravel() for p in params]) - start).max())
    return {"losses": losses, "moved": moved, "weights": {p.name: p.asnumpy().ravel().tolist() for p in params}}


def main(out: str) -> None:
    from mindspore.communication import get_group_size, get_rank, init
    from mindspore.device_context.cpu.op_tuning import threads_num

    ms.set_context(mode=ms.GRAPH_MODE)
    threads_num(1)
    init()
    world, rank = get_group_size(), get_rank()
    probes.install(faults.active(), rank)   # the suite's refusal of the retiring parallel API (tests/conftest.py)
    import time

    t0 = time.perf_counter()
    errors = compile_graphs(Path(out) / "ir", rank, world)
    print(f"compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    rng = np.random.default_rng(4)
    data = [[[rng.integers(0, CFG.vocab_size, (MICRO, SEQ)).astype(np.int32) for _ in range(ACCUM)]
             for _ in range(world)] for _ in range(STEPS)]
    res = {}
    for kind in ("dp", "zero1", "zero2"):
        t0 = time.perf_counter()
        res[kind] = train(kind, rank, world, data)
        print(f"{kind} in {time.perf_counter() - t0:.1f} s", flush=True)
    if rank == 0:
        (Path(out) / "result.json").write_text(json.dumps({"compile_errors": errors, "runs": res}))


if __name__ == "__main__":
    main(sys.argv[1])
