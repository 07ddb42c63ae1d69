"""Real fine-tunes of the real stories260K on MindSpore (CPU, graph mode): loss, run directory,
accumulation exactness, kill -9 + resume, NaN stop, full disk at a checkpoint, graphs per shape."""

from __future__ import annotations

import json
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from porting.rundir import ranklog
from tests.train.conftest import FAST, ROOT, TINY, error_line, metrics
from tests.helpers import port, port_process



@pytest.fixture(scope="module")
def tiny_run(tiny_cpu_run) -> Path:
    """The shipped tiny recipe, as a user runs it (tests/conftest.py; also used by the help examples)."""
    return tiny_cpu_run


def test_loss_falls_and_run_directory_contract(tiny_run):
    steps, summary = metrics(tiny_run)
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) == 20
    for key in ("loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_time_s", "padding_fraction", "compile"):
        assert key in steps[0], key
    first, last = np.mean([s["loss"] for s in steps[:4]]), np.mean([s["loss"] for s in steps[-4:]])
    assert last < 0.6 * first, (first, last)
    # every shape compiled before step 1 (porting/train/run/step/precompile.py): no step compiles, the time is kept apart
    assert not any(s["compile"] for s in steps) and summary["precompile_s"] > 0
    assert summary["compile_time_s"] >= summary["precompile_s"] and summary["steady_tokens_per_s"] > 0
    assert summary["compiled_graphs"] == summary["shapes_seen"] <= summary["bucket_shapes"]
    manifest = json.loads((tiny_run / "manifest.json").read_text())
    import mindspore

    v = manifest["versions"]
    assert v["packages"]["mindspore"] == mindspore.__version__ and v["python"] and "cann" in v
    assert manifest["command"] and manifest["recipe"]["model"]["source"] == "stories260k"
    assert manifest["doctor"]["checks"] and "env" in manifest["doctor"]     # port doctor's report
    pairing = manifest["doctor"]["pairing"]     # the MindSpore/CANN/HDK row this run used, and if it is known-good
    assert pairing["mindspore"] == mindspore.__version__ and pairing["row"]["cann"] and pairing["supported"]
    assert pairing["known_good"] is (pairing["row"] is not None and pairing["cann_ok"] is not False)
    assert manifest["model"]["config"]["hidden_size"] == 64   # architecture from the checkpoint's config.json
    assert manifest["data"]["sha256"] and manifest["data"]["examples"] == 16 and manifest["world_size"] == 1
    assert manifest["bucketing"]["boundaries"] and manifest["seed"] == 0
    plan = json.loads((tiny_run / "plan.json").read_text())
    assert plan["memory_gib_by_phase"]["total"] > 0 and plan["global_batch"] == 4
    lines = (tiny_run / "logs" / "rank_0.log").read_text().splitlines()
    assert lines and all(ranklog.LINE.match(l) and ranklog.LINE.match(l)[1] == "0" for l in lines)
    assert sorted(p.name for p in (tiny_run / "checkpoints").iterdir()) == ["step_10", "step_20"]
    # The HF export is a real HF checkpoint: transformers loads it, and it fits the data better than the
    # model it started from.
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    text = (ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt").read_text().split("<|endoftext|>")[0]
    tok = AutoTokenizer.from_pretrained(str(tiny_run / "hf"), local_files_only=True)
    ids = torch.tensor([tok(text.strip())["input_ids"][:128]])

    def loss(d):
        m = LlamaForCausalLM.from_pretrained(str(d), local_files_only=True, torch_dtype=torch.float32)
        with torch.no_grad():
            return float(m(ids, labels=ids).loss)

    before, after = loss(ROOT / "model_zoo" / "assets" / "stories260k"), loss(tiny_run / "hf")
    assert after < before - 0.1, (before, after)


def _weights(run: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(run / "hf" / "model.safetensors"))


def test_micro_1_x_accum_4_equals_micro_4_x_accum_1(tmp_path, model_dir):
    from porting.train.run.loop import train
    from porting.train.recipe.schema import load_recipe

    # optimizer.lr 1e-4: AdamW divides by sqrt(v), so a float32 rounding difference in a near-zero gradient
    # (micro-batch 1 sums in another order than micro-batch 4) can move a weight by up to about lr; at 1e-3 one
    # CI run measured 2.6e-5. The gradient norms below catch a scaling error AdamW's invariance would hide.
    common = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "schedule.max_steps=3",
              "checkpointing.every_steps=0", "optimizer.lr=1e-4", f"model.source={model_dir}"]   # 1 layer
    a = train(load_recipe(TINY, common + ["batching.micro_batch_size=1", "batching.grad_accum_steps=4"]),
              tmp_path / "a", echo=False)
    b = train(load_recipe(TINY, common + ["batching.micro_batch_size=4", "batching.grad_accum_steps=1"]),
              tmp_path / "b", echo=False)
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    w0 = _weights_from(model_dir)
    moved = max(float(np.abs(wa[k] - w0[k]).max()) for k in wa)
    diff = max(float(np.abs(wa[k] - wb[k]).max()) for k in wa)
    assert moved > 1e-4 and diff < 1e-5, (moved, diff)
    assert abs(a.last_loss - b.last_loss) < 1e-5
    la, lb = metrics(tmp_path / "a")[0], metrics(tmp_path / "b")[0]
    assert np.allclose([s["loss"] for s in la], [s["loss"] for s in lb], rtol=0, atol=1e-5)
    assert np.allclose([s["grad_norm"] for s in la], [s["grad_norm"] for s in lb], rtol=1e-5, atol=0)


def _weights_from(d: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(d / "model.safetensors"))


def _curve(run: Path) -> dict[int, float]:
    return {s["step"]: s["loss"] for s in metrics(run)[0]}


@pytest.mark.slow
def test_kill_9_then_resume_continues_the_same_curve(tmp_path):
    sets = FAST + ["--set", "schedule.max_steps=30", "--set", "checkpointing.every_steps=10"]
    ref = tmp_path / "ref"
    port("train", str(TINY), "--run-dir", str(ref), *sets, check=True)
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "porting", "train", str(TINY), "--run-dir", str(run), *sets],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline:
        m = run / "metrics.jsonl"
        if m.exists() and sum(1 for _ in m.open()) >= 15:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = max(_curve(run))
    assert done < 30, "the run finished before it was killed; nothing to resume"
    refused = port("train", str(TINY), "--run-dir", str(run), *sets)
    assert refused.returncode == 2 and "--resume" in error_line(refused)
    # resumed from the user's recipe file, edited since the first launch (a key a resume may change): the difference
    # is printed and written as the job's next revision, which the resumed ranks run (porting/job/)
    edited = _edited_copy(TINY, tmp_path / "edited.yaml", checkpointing={"keep_last": 3})
    resumed = port("train", str(edited), "--run-dir", str(run), *sets, "--resume", check=True)
    assert ("the recipe differs from the run's job document (1 change(s): checkpointing.keep_last: 2 -> 3); "
            "written as revision 2") in resumed.stderr, resumed.stderr[-3000:]
    job2 = json.loads((run / "job.2.json").read_text())
    assert job2["start"]["changes"] == ["checkpointing.keep_last: 2 -> 3"] and job2["recipe"]["checkpointing"]["keep_last"] == 3
    assert json.loads((run / "job.json").read_text())["recipe"]["checkpointing"]["keep_last"] == 2   # never over it
    a, b = _curve(ref), _curve(run)
    assert sorted(b) == sorted(a) == list(range(1, 31))
    assert max(abs(a[k] - b[k]) for k in a) == 0.0, "resume must be bit-exact"
    from porting.train.run.checkpoint.read import full_state

    ca, cb = (full_state(r / "checkpoints" / "step_30") for r in (ref, run))
    assert set(ca) == set(cb) and any(k.startswith("adam_m.") for k in ca)   # weights and AdamW states
    assert all(np.array_equal(ca[k], cb[k]) for k in ca)
    resumed_manifest = json.loads((run / f"manifest_resume_{(done // 10) * 10}.json").read_text())
    assert resumed_manifest["job"] == f"{run / 'job.json'} revision 2"
    assert len(list((run / "checkpoints").glob("step_*"))) == 3   # the revision's keep_last ran, not the first one's


def _edited_copy(recipe: Path, dest: Path, **sections: dict) -> Path:
    """``recipe`` with ``sections`` changed, its data path made absolute (the copy lives elsewhere)."""
    raw = yaml.safe_load(recipe.read_text())
    raw["data"]["path"] = str((recipe.parent / raw["data"]["path"]).resolve())
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    dest.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dest


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_a_kill_during_the_first_save_leaves_a_run_that_starts_over(tmp_path):
    """A kill mid-save of the first checkpoint leaves only its temporary directory. Before, that run could
    be neither resumed ("no complete checkpoint") nor restarted ("holds checkpoints ... pass --resume")."""
    run = tmp_path / "run"
    sets = FAST + ["--set", "schedule.max_steps=1", "--set", "schedule.warmup_steps=0", "--set",
                   "checkpointing.every_steps=1"]
    port("train", str(TINY), "--run-dir", str(run), *sets, check=True)
    ck = run / "checkpoints"
    half = ck / ".tmp_step_1_4242"   # what the save looks like before state.json and the rename
    (ck / "step_1").rename(half)
    (half / "state.json").unlink()
    kept = sorted(p.name for p in half.iterdir())
    refused = port("train", str(TINY), "--run-dir", str(run), *sets, "--resume")
    assert refused.returncode == 2
    assert error_line(refused) == (f"error: {ck}: --resume but no complete checkpoint there; run without --resume")
    again = port("train", str(TINY), "--run-dir", str(run), *sets, check=True)
    assert f"{half}: left by an interrupted checkpoint save, never loaded" in again.stderr
    assert sorted(p.name for p in half.iterdir()) == kept   # named, not deleted
    assert (ck / "step_1" / "state.json").is_file() and [s["step"] for s in metrics(run)[0]] == [1]


def test_nan_loss_stops_with_step_and_last_checkpoint(tmp_path):
    run = tmp_path / "nan"
    r = port("train", str(TINY), "--run-dir", str(run), *FAST, "--set", "optimizer.lr=1e30",
             "--set", "optimizer.grad_clip=null", "--set", "schedule.warmup_steps=0",
             "--set", "checkpointing.every_steps=1", "--set", "nonfinite.max_consecutive_skips=0")
    assert r.returncode == 3
    line = error_line(r)
    assert re.search(r"step 2: loss is .*grad norm nan", line), line
    assert f"last good checkpoint: {run / 'checkpoints' / 'step_1'}" in line
    assert not (run / "hf").exists()


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_full_disk_at_checkpoint_keeps_previous_checkpoint(tmp_path):
    """A real ENOSPC on a small tmpfs when we may mount one; otherwise a real EFBIG from RLIMIT_FSIZE."""
    disk = tmp_path / "disk"
    mounted = _mount_tmpfs(disk, "8m")
    run = disk / "run"
    sets = FAST + ["--set", "checkpointing.every_steps=2", "--set", "schedule.max_steps=4"]
    try:
        port("train", str(TINY), "--run-dir", str(run), *sets, check=True)
        before = {p.name: p.read_bytes() for p in (run / "checkpoints" / "step_4").iterdir()}

        def limit():
            if not mounted:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

        more = FAST + ["--set", "checkpointing.every_steps=2", "--set", "schedule.max_steps=6"]
        # a file-size limit (or the tmpfs) for that process alone
        r = port_process("train", str(TINY), "--run-dir", str(run), *more, "--resume", preexec_fn=limit)
        assert r.returncode == 2
        line = error_line(r)
        assert "step_6: could not write the checkpoint" in line and "step_4 is intact" in line, line
        names = sorted(p.name for p in (run / "checkpoints").iterdir())
        assert names == ["step_2", "step_4"], names          # no partial step_6, no temporary left
        assert {p.name: p.read_bytes() for p in (run / "checkpoints" / "step_4").iterdir()} == before
        state = json.loads((run / "checkpoints" / "step_4" / "state.json").read_text())
        assert state["next_step"] == 4
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.slow
def test_bucketed_alpaca_compiles_one_graph_per_shape(tmp_path, alpaca, model_dir):
    from porting.train.run.loop import train
    from porting.train.recipe.schema import load_recipe

    sets = [f"data.path={alpaca}", "data.format=alpaca", "data.long_text=truncate", "data.max_seq_length=128",
            "batching.micro_batch_size=4", "batching.bucketing.max_shapes=3", "schedule.max_steps=24",
            "schedule.epochs=1", "checkpointing.every_steps=0", "checkpointing.export_hf=false",
            f"model.source={model_dir}"]   # one layer: a graph per shape is the subject, not the depth
    res = train(load_recipe(TINY, sets), tmp_path / "run", echo=False)
    steps, summary = metrics(tmp_path / "run")
    shapes = {w for s in steps for w in s["shapes"]}
    assert len(shapes) >= 2 and summary["bucket_shapes"] <= 3
    assert res.compiled_graphs == len(shapes) <= summary["bucket_shapes"]
    assert summary["precompiled_graphs"] == res.compiled_graphs and not any(s["compile"] for s in steps)


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_recompute_gives_the_same_training(tmp_path):
    """Cell.recompute() on every decoder layer (graph mode, CPU) changes memory, not the numbers."""
    from porting.train.run.loop import train
    from porting.train.recipe.schema import load_recipe

    common = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "schedule.max_steps=2",
              "checkpointing.every_steps=0"]
    train(load_recipe(TINY, common + ["memory.recompute=true"]), tmp_path / "rc", echo=False)
    train(load_recipe(TINY, common), tmp_path / "plain", echo=False)
    wa, wb = _weights(tmp_path / "rc"), _weights(tmp_path / "plain")
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) < 1e-6
    assert json.loads((tmp_path / "rc" / "manifest.json").read_text())["recipe"]["memory"]["recompute"] is True
    assert "recompute: 5 of 5 decoder layers" in (tmp_path / "rc" / "logs" / "rank_0.log").read_text()


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_dynamic_loss_scaling_is_exact_then_skips_overflow_and_stops_at_scale_one(tmp_path, model_dir):
    """The Ascend loss-scaling logic, run on the CPU in fp32: a power-of-two scale changes nothing;
    overflowing steps are skipped with the scale halved, and at scale 1 the run stops."""
    from porting.train.run.loop import train
    from porting.train.recipe.schema import load_recipe

    common = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "schedule.max_steps=2",
              "checkpointing.every_steps=0", f"model.source={model_dir}"]   # one layer
    train(load_recipe(TINY, common + ["precision.loss_scale.kind=dynamic", "precision.loss_scale.init=1024"]),
          tmp_path / "scaled", echo=False)
    train(load_recipe(TINY, common), tmp_path / "plain", echo=False)
    wa, wb = _weights(tmp_path / "scaled"), _weights(tmp_path / "plain")
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) < 1e-6

    run = tmp_path / "overflow"
    r = port("train", str(TINY), "--run-dir", str(run), *FAST, "--set", "optimizer.lr=1e30",
             "--set", "optimizer.grad_clip=null", "--set", "schedule.warmup_steps=0",
             "--set", "precision.loss_scale.kind=dynamic", "--set", "precision.loss_scale.init=4",
             "--set", "nonfinite.max_consecutive_skips=0")   # overflows above scale 1 are not counted
    assert r.returncode == 3
    assert re.search(r"step 4: loss is .* at loss scale 1;", error_line(r)), error_line(r)
    steps = metrics(run)[0]
    assert [s["skipped"] for s in steps] == [False, True, True] and [s["loss_scale"] for s in steps] == [4, 2, 1]
