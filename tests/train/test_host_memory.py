"""The dry run's host-RAM plan (porting/train/plan/host_memory.py) and the save-time inputs (porting/train/plan/comm.py):
the numbers shown, the refusal past ``cluster.host_memory_gib``, and the bytes the plan says the busiest
rank writes equal what the per-rank checkpoint layout (porting/train/run/checkpoint/format.py) makes it write."""

from __future__ import annotations

import dataclasses

import pytest

from model_zoo.errors import RecipeError
from tests.train.conftest import ROOT


def _plan(name: str, *sets: str):
    from porting.train import make_plan, plan_config
    from porting.train import load_recipe

    rec = load_recipe(ROOT / "recipes" / name, list(sets), check_files=False)
    cfg, _ = plan_config(rec)
    return rec, cfg, make_plan(rec, cfg, "runs/x")


def test_the_plan_shows_host_ram_per_worker_and_node_and_the_save_inputs():
    from porting.train import format_plan

    rec, cfg, plan = _plan("13b-32card.yaml", "checkpointing.fs_gib_per_s=0.25")
    hm = plan.host_memory
    assert hm.node_gib == pytest.approx(hm.worker_gib * rec.cluster.devices_per_node, rel=1e-3)
    assert hm.worker_gib > hm.terms_gib.base
    text = format_plan(plan)
    assert f"{hm.worker_gib:.2f} GiB per worker, {hm.node_gib:.2f} GiB per node" in text
    launch = plan.launch
    # the filesystem's bandwidth is shared: the whole checkpoint (every rank's bytes) goes through it
    assert launch.predicted_save_s == pytest.approx(launch.checkpoint_bytes / (0.25 * 2**30), abs=0.1)
    assert launch.checkpoint_bytes == pytest.approx(182e9, rel=0.05)   # 13B: 2 + 4 + 4 + 4 bytes a parameter
    assert "0.25 GiB/s the filesystem's aggregate write bandwidth (checkpointing.fs_gib_per_s)" in text


def test_a_node_over_host_memory_gib_is_refused_with_the_fix():
    from porting.train import check_fits

    _, _, plan = _plan("13b-32card.yaml")
    need = plan.host_memory.node_gib
    _, _, ok = _plan("13b-32card.yaml", f"cluster.host_memory_gib={need * 1.01:.3f}")
    check_fits(ok, "r.yaml")
    _, _, tight = _plan("13b-32card.yaml", f"cluster.host_memory_gib={need / 2:.3f}")
    with pytest.raises(RecipeError) as e:
        check_fits(tight, "r.yaml")
    msg = str(e.value)
    assert msg.startswith("r.yaml: cluster.host_memory_gib:") and "optimizer_sharding" in msg and "\n" not in msg


def test_zero_start_up_holds_nothing_on_the_host_and_resume_one_bucket_at_a_time():
    """ZeRO's masters, m and v are made on the device (no host transient at start-up); a resume restores one
    bucket's shard at a time: the transient stays far below the rank's whole fp32 shard of the model."""
    from porting.train.plan.comm import parameter_numels

    rec, cfg, plan = _plan("7b-8card.yaml", "parallel.optimizer_sharding=true")
    tp = rec.parallel.tensor_parallel
    whole_shard_gib = 4 * sum(parameter_numels(cfg, tp)) / rec.data_parallel_size / 2**30
    param_gib = 4 * max(parameter_numels(cfg, tp)) / 2**30   # one fp32 TP-local parameter: the floor of any path
    t = plan.host_memory.transients_gib
    assert {f.name for f in dataclasses.fields(t)} == {"hf_load", "save", "resume"}
    assert 0 < t.resume - 2 * param_gib < whole_shard_gib / 4, (t, whole_shard_gib)


def test_every_resident_term_of_the_13b_and_7b_nodes_is_counted():
    """The Ascend worker: base, the weights' host copies (P_local x 2 bytes for bf16), the largest transient;
    the node: 16 of them."""
    from porting.train.plan.comm import parameter_numels

    for name in ("13b-32card.yaml", "7b-8card.yaml"):
        rec, cfg, plan = _plan(name)
        hm = plan.host_memory
        terms = hm.terms_gib
        assert terms.weights_host == pytest.approx(
            sum(parameter_numels(cfg, rec.parallel.tensor_parallel)) * 2 / 2**30, abs=1e-3)
        assert hm.worker_gib == pytest.approx(sum(dataclasses.astuple(terms)), abs=2e-3)
        assert hm.node_gib == pytest.approx(16 * hm.worker_gib, rel=1e-3)


@pytest.mark.parametrize("sets", [["cluster.devices_per_node=4", "parallel.optimizer_sharding=true"],
                                  ["cluster.devices_per_node=4", "parallel.optimizer_sharding=false"]])
def test_planned_checkpoint_bytes_are_what_the_busiest_rank_writes(sets):
    """stories260K's real parameter list, cut by ckpt_merge.target_layout for the recipe's layout."""
    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build
    from porting.train.plan import comm, sharding
    from porting.train.run.checkpoint.merge import target_layout
    from porting.train.run.checkpoint.format import Layout, ParamSpec, owned, piece_bytes
    from porting.train import load_recipe

    cfg = LlamaConfig.from_hf(ROOT / "model_zoo" / "assets" / "stories260k")
    params = tuple(ParamSpec(p.name, tuple(p.shape), None, "F32") for p in build(cfg).trainable_params())
    rec = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", sets + ["batching.micro_batch_size=1"], check_files=False)
    lay = target_layout(Layout(1, 1, 0, False, params, ()), rec)
    busiest = max(piece_bytes(lay, owned(lay, r)) for r in range(lay.world))
    pad = sum(n - sum(params[i].local_numel(1) for i in idx) for idx, n in lay.buckets) * 12
    planned = comm.checkpoint_bytes(rec, sharding.layout_for(rec, cfg))
    assert planned - pad <= busiest <= planned + pad
