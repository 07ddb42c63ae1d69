"""A LoRA run on every layout a full fine-tune has, against one device (stories260K cut to its first layer, fp32,
r 8 on every linear layer, biases none, lr 1e-3 so the adapters move; micro-batch 2 x 2 accumulation, global
batch 4, 3 steps, a checkpoint at step 2):

- one msrun launch of 4 workers, TP 2 x DP 2 with ZeRO-1 (lora_B of q/k/v/gate/up split by rows, lora_A of o/down
  by columns, the optimizer states of the adapters sharded), equals one device: every step's loss within 1e-6
  relative (a few float32 ULPs of the summed loss: the TP loss and the all-reduced totals add in another order),
  the exported adapter within 1e-6 absolute;
- its step-2 checkpoint (adapters and their AdamW state only, written as 4 ranks' ZeRO shards) resumed on one
  device in PyNative (another DP and TP size, another execution mode) ends within 1e-6 of the reference;
- the reference resumed from its own step-2 checkpoint ends bitwise equal to it (graph mode);
- a checkpoint of a LoRA run holds the trainable parameters only: no base weight is written again.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.helpers import port_process
from tests.train.conftest import TINY, free_port, metrics
from tests.train.conftest import small_settings as _settings

pytestmark = pytest.mark.slow
LORA = ["lora.r=8", "lora.target_modules=all-linear", "optimizer.lr=1e-3", "checkpointing.every_steps=2",
        "schedule.max_steps=3"]


def _adapter(run) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(run / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    from porting.train import load_recipe, train

    run = tmp_path_factory.mktemp("lora1") / "run"
    train(load_recipe(TINY, _settings(model_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2",
                                      *LORA)), run, echo=False)
    return run


@pytest.fixture(scope="module")
def tp2dp2(model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("lora4") / "run"
    sets = _settings(model_dir, "batching.micro_batch_size=1", "batching.grad_accum_steps=2",
                     "cluster.devices_per_node=4", "parallel.tensor_parallel=2", "parallel.optimizer_sharding=true",
                     f"cluster.master_port={free_port()}", *LORA)
    port_process("train", str(TINY), "--run-dir", str(run), *[a for s in sets for a in ("--set", s)], check=True,
                 timeout=600)
    return run


def _same(run, ref, rel: float, atol: float) -> None:
    a, b = metrics(run)[0], metrics(ref)[0]
    assert [s["step"] for s in a] == [1, 2, 3] == [s["step"] for s in b]
    for x, y in zip(a, b):
        assert abs(x["loss"] - y["loss"]) <= rel * abs(y["loss"]), (x["loss"], y["loss"])
        assert abs(x["grad_norm"] - y["grad_norm"]) <= 1e-5 * y["grad_norm"]
    wa, wb = _adapter(run), _adapter(ref)
    assert wa.keys() == wb.keys()
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) <= atol
    init = json.loads((ref / "adapter" / "adapter_config.json").read_text())
    assert init["r"] == 8 and max(float(np.abs(wb[k]).max()) for k in wb if "lora_B" in k) > 1e-4


@pytest.mark.msrun
def test_tp2_dp2_zero1_equals_one_device_and_resumes_on_one_device_in_pynative(tp2dp2, reference, model_dir,
                                                                               tmp_path):
    from porting.train import load_recipe, train

    _same(tp2dp2, reference, 1e-6, 1e-6)
    layout = json.loads((tp2dp2 / "checkpoints" / "step_2" / "layout.json").read_text())
    assert layout["layout"]["zero"] == 1 and layout["layout"]["tp"] == 2
    names = [p["name"] for p in layout["layout"]["params"]]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    axes = {p["name"]: p["axis"] for p in layout["layout"]["params"]}
    assert axes["model.layers.0.attention.wq.lora_B.weight"] == 0 and axes["model.layers.0.attention.wq.lora_A.weight"] is None
    assert axes["model.layers.0.attention.wo.lora_A.weight"] == 1 and axes["model.layers.0.attention.wo.lora_B.weight"] is None
    moved = tmp_path / "run"
    shutil.copytree(tp2dp2, moved, ignore=shutil.ignore_patterns("step_3", "hf", "adapter", "compile_cache"))
    train(load_recipe(TINY, _settings(model_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2",
                                      "execution=pynative", *LORA)), moved, resume=True, echo=False)
    _same(moved, reference, 1e-6, 1e-6)


def test_a_lora_run_resumes_bitwise_and_its_checkpoints_hold_the_adapters_only(reference, model_dir, tmp_path):
    from porting.train import load_recipe, train

    ck = reference / "checkpoints" / "step_3"
    rank_bytes = (ck / "rank_00000.safetensors").stat().st_size
    assert rank_bytes < 0.5 * (model_dir / "model.safetensors").stat().st_size   # adapters + AdamW, not the base
    resumed = tmp_path / "run"
    shutil.copytree(reference, resumed, ignore=shutil.ignore_patterns("step_3", "hf", "adapter"))
    train(load_recipe(TINY, _settings(model_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2",
                                      *LORA)), resumed, resume=True, echo=False)
    a, b = metrics(resumed)[0], metrics(reference)[0]
    assert [s["loss"] for s in a] == [s["loss"] for s in b]
    wa, wb = _adapter(resumed), _adapter(reference)
    assert all(np.array_equal(wa[k], wb[k]) for k in wb)
    assert (resumed / "hf" / "model.safetensors").read_bytes() == (reference / "hf" / "model.safetensors").read_bytes()


def test_a_non_finite_lora_step_leaves_the_adapters_and_their_state(model_dir, tmp_path, monkeypatch):
    """PORT_TEST_NONFINITE at step 2 (porting/train/run/faults.py): the step's update is skipped and counted, the
    adapters and their AdamW state stay as after step 1 (the caps and the stop are the full fine-tune's path,
    tests/train/test_nonfinite.py)."""
    from porting.train import load_recipe, train
    from porting.train.run.checkpoint.read import full_state

    monkeypatch.setenv("PORT_TEST_NONFINITE", "2")
    sets = _settings(model_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2", *LORA)
    train(load_recipe(TINY, [*sets, "schedule.max_steps=2", "checkpointing.every_steps=1"]), tmp_path / "skip",
          echo=False)
    assert [s.get("skipped", False) for s in metrics(tmp_path / "skip")[0]] == [False, True]
    one, two = (full_state(tmp_path / "skip" / "checkpoints" / f"step_{k}") for k in (1, 2))
    assert one.keys() == two.keys() and all(np.array_equal(one[k], two[k]) for k in one)
    assert all(".lora_" in k for k in one)


def test_a_run_starts_from_a_peft_adapter_a_cuda_job_saved(model_dir, tmp_path):
    """lora.init_from: an adapter PEFT itself saved (save_pretrained, lora_B non-zero) is the run's starting point:
    RUN/adapter_init holds its tensors bit for bit, and the run trains on from them."""
    import peft
    import torch
    from safetensors.numpy import load_file

    from porting.train import load_recipe, train
    from porting.verify.pair import load_reference

    pm = peft.get_peft_model(load_reference(model_dir, "float32"), peft.LoraConfig(
        r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    pm.save_pretrained(tmp_path / "cuda_adapter")
    sets = _settings(model_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2", *LORA,
                     "schedule.max_steps=2", f"lora.init_from={tmp_path / 'cuda_adapter'}")
    train(load_recipe(TINY, sets), tmp_path / "run", echo=False)
    theirs = load_file(str(tmp_path / "cuda_adapter" / "adapter_model.safetensors"))
    ours = load_file(str(tmp_path / "run" / "adapter_init" / "adapter_model.safetensors"))
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)
    trained = _adapter(tmp_path / "run")
    assert max(float(np.abs(trained[k] - theirs[k]).max()) for k in ours) > 1e-5   # and it trained from there
