"""Tensor parallel under real msrun workers (fp32, the real stories260K cut to its first layer).

Each configuration runs once (module-scoped fixtures) and the tests compare them with one reference,
1 device in-process with micro-batch 2 x 2 accumulation steps (global batch 4):
- TP=2 on 2 workers (micro-batch 4), 2 steps, then ``--resume`` to 3, equals it;
- TP=2 x DP=2 on 4 workers (micro-batch 1 x 2 accumulation steps, optimizer sharding over the DP
  group) equals it. That
  reference is what DP=2 on 2 workers equals (tests/train/test_msrun.py), so TP=2 x DP=2 equals DP=2
  without a third msrun launch here (the suite's time);
- a tensor_parallel that does not divide the heads is refused in one line before any worker starts.
``optimizer.lr`` is 1e-4: AdamW divides by sqrt(v), so a float32 rounding difference in a small
gradient moves a weight by up to about lr; at 1e-4 the 1e-5 bound is still ten times tighter than
what 3 steps move the weights (checked).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.train.conftest import ROOT, TINY, error_line, free_port, metrics, port

pytestmark = [pytest.mark.msrun, pytest.mark.slow]

STORIES = ROOT / "model_zoo" / "assets" / "stories260k"
LAYERS = 1


def _settings(model_dir, *extra: str) -> list[str]:
    return [f"model.source={model_dir}", "data.max_seq_length=64", "batching.bucketing.enabled=false",
            "optimizer.lr=1e-4", "checkpointing.every_steps=0", *extra]


def _args(settings: list[str]) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """stories260K's real weights, its first of 5 layers (a faster graph; 8 heads, 4 KV heads)."""
    from safetensors.numpy import load_file, save_file

    out = tmp_path_factory.mktemp("stories2")
    cfg = json.loads((STORIES / "config.json").read_text())
    cfg["num_hidden_layers"] = LAYERS
    (out / "config.json").write_text(json.dumps(cfg))
    keep = {k: v for k, v in load_file(str(STORIES / "model.safetensors")).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < LAYERS}
    save_file(keep, str(out / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(STORIES / name, out / name)
    return out


@pytest.fixture(scope="module")
def one_device(model_dir, tmp_path_factory):
    """The reference: 1 device in-process, micro-batch 2 x 2 accumulation steps, 3 steps."""
    from porting.train.loop import train
    from porting.train.recipe import load_recipe

    run = tmp_path_factory.mktemp("tp1") / "run"
    train(load_recipe(TINY, _settings(model_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2",
                                      "schedule.max_steps=3")), run, echo=False)
    return run


@pytest.fixture(scope="module")
def tp2_resumed(model_dir, tmp_path_factory):
    """TP=2 on 2 msrun workers, the same global batch in one micro-batch of 4 (one compiled graph per
    launch): 2 steps (checkpoint), then --resume to step 3."""
    run = tmp_path_factory.mktemp("tp2") / "run"
    base = _settings(model_dir, "batching.micro_batch_size=4", "cluster.devices_per_node=2",
                     "parallel.tensor_parallel=2")
    port("train", str(TINY), "--run-dir", str(run), *_args(base + ["schedule.max_steps=2",
         f"cluster.master_port={free_port()}"]), check=True, timeout=400)
    step2 = {p.name for p in (run / "checkpoints" / "step_2").iterdir()}
    port("train", str(TINY), "--run-dir", str(run), "--resume",
         *_args(base + ["schedule.max_steps=3", f"cluster.master_port={free_port()}"]), check=True, timeout=400)
    return run, step2


@pytest.fixture(scope="module")
def tp2_dp2(model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("tp2dp2") / "run"
    port("train", str(TINY), "--run-dir", str(run), *_args(_settings(
        model_dir, "cluster.devices_per_node=4", "parallel.tensor_parallel=2", "parallel.optimizer_sharding=true",
        "batching.micro_batch_size=1", "batching.grad_accum_steps=2",
        "schedule.max_steps=3", f"cluster.master_port={free_port()}")), check=True, timeout=600)
    return run


def _weights(run):
    from safetensors.numpy import load_file

    return load_file(str(run / "hf" / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    assert all(a[k].shape == b[k].shape for k in a)
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _compare(run, ref, model_dir) -> None:
    from safetensors.numpy import load_file

    sa, sb = metrics(run)[0], metrics(ref)[0]
    assert [s["step"] for s in sa] == [1, 2, 3] == [s["step"] for s in sb]
    assert np.allclose([s["loss"] for s in sa], [s["loss"] for s in sb], rtol=0, atol=1e-5), (sa, sb)
    assert np.allclose([s["grad_norm"] for s in sa], [s["grad_norm"] for s in sb], rtol=1e-5, atol=0)
    wa, wb = _weights(run), _weights(ref)
    assert _max_diff(wa, wb) < 1e-5
    start = load_file(str(model_dir / "model.safetensors"))
    assert _max_diff(wb, {k: start[k] for k in wb}) > 1e-4   # the runs trained: the bound above can fail


def test_tp2_with_resume_equals_one_device(tp2_resumed, one_device, model_dir):
    run, step2 = tp2_resumed
    # rank 0 merged both ranks' shards into the one full file a single device writes
    assert step2 == {"state.json", "train_state.ckpt"}
    _compare(run, one_device, model_dir)
    log0 = (run / "logs" / "rank_0.log").read_text()
    assert "tensor parallel 2" in log0 and "resumed from" in log0
    assert "row max by AllReduce SUM" in log0   # the CPU's emulation of AllReduce MAX ran


def test_tp2_dp2_on_four_workers_equals_dp2(tp2_dp2, one_device, model_dir):
    _compare(tp2_dp2, one_device, model_dir)
    assert {p.name for p in (tp2_dp2 / "logs").glob("rank_*.log")} == {f"rank_{i}.log" for i in range(4)}
    assert "data parallel 2 x tensor parallel 2" in (tp2_dp2 / "logs" / "rank_3.log").read_text()


def test_tensor_parallel_not_dividing_the_heads_is_refused_in_one_line(tmp_path):
    run = tmp_path / "bad"
    p = port("train", str(TINY), "--run-dir", str(run), "--set", "cluster.devices_per_node=3",
             "--set", "parallel.tensor_parallel=3")
    assert p.returncode != 0
    line = error_line(p)
    assert line.startswith("error: parallel.tensor_parallel: 3 does not divide the model's num_attention_heads 8")
    assert "Traceback" not in p.stderr and not run.exists()


def test_split_and_merge_are_inverse():
    from model_zoo.parallel import merge_shards, split_shard

    x = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    for axis in (0, 1, None):
        parts = [split_shard(x, axis, r, 2) for r in range(2)]
        assert np.array_equal(merge_shards(parts, axis), x)
    assert split_shard(x, 1, 1, 2).shape == (4, 3) and np.array_equal(split_shard(x, 0, 1, 2), x[2:])


def test_grid_partitions_the_ranks_into_tensor_and_data_groups():
    from porting.train.grid import Grid, dp_ranks, tp_ranks

    world, tp = 8, 4
    tp_groups = {tuple(tp_ranks(r, tp)) for r in range(world)}
    dp_groups = {tuple(dp_ranks(r, world, tp)) for r in range(world)}
    assert tp_groups == {(0, 1, 2, 3), (4, 5, 6, 7)} and dp_groups == {(0, 4), (1, 5), (2, 6), (3, 7)}
    g = Grid(rank=6, world=world, tp=tp)
    assert (g.dp, g.dp_rank, g.tp_rank) == (2, 1, 2)
