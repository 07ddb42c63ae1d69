"""Resume refuses what it cannot continue exactly, in one line, before any worker starts
(porting/train/run/checkpoint/resume_check.py), on the real run of recipes/tiny-cpu.yaml (stories260K, 20 steps,
per-rank checkpoints at steps 10 and 20; the suite's shared ``tiny_cpu_run``). Each case copies the run and damages, forges or mismatches one thing. A layout change that
the per-rank checkpoint makes exact is said on the terminal; that the losses are then really equal is
tests/train/test_ckpt_layouts.py's (DP 4 + ZeRO -> DP 2, TP 2 x DP 2 -> DP 4, under msrun)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tests.helpers import port
from tests.train.conftest import TINY, error_line, resume_reads


@pytest.fixture()
def trained(tiny_cpu_run) -> Path:
    assert sorted(p.name for p in (tiny_cpu_run / "checkpoints").iterdir()) == ["step_10", "step_20"]
    return tiny_cpu_run


@pytest.fixture()
def run(trained, tmp_path) -> Path:
    shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns("hf"))
    return tmp_path / "run"


def _resume(run: Path, *extra: str, resume: bool = True):
    return port("train", str(TINY), "--run-dir", str(run), *extra, *(["--resume"] if resume else []))


def _edit_state(ck: Path, **changes) -> None:
    st = json.loads((ck / "state.json").read_text())
    st.update(changes)
    (ck / "state.json").write_text(json.dumps(st))


def _refused(r, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    line = error_line(r)
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in line, line
    return line


@pytest.mark.parametrize("key,value,expect", [("world_size", 2, "key 'world_size' is 2, the layout record says 1"),
                                              ("seed", 7, "key 'seed' is 7, the layout record says 0"),
                                              ("shards", 2, "shards 2 > world_size 1")])
def test_a_forged_state_is_caught(run, key, value, expect):
    _edit_state(run / "checkpoints" / "step_20", **{key: value})
    _refused(_resume(run), "step_20/state.json", expect)


@pytest.mark.parametrize("key,value,expect", [
    ("next_step", 10 ** 12, "expected an integer in [0, 1000000000]"),
    ("adam_t", 21, "adam_t 21 > next_step 20"),
    ("loss_scale", {"scale": 1e300, "good": 0}, "loss_scale.scale"),
    ("world_size", 0, "expected an integer in [1, 65536]"),
    ("seed", 2 ** 40, "key 'seed'"),
])
def test_every_state_field_is_range_checked(run, key, value, expect):
    _edit_state(run / "checkpoints" / "step_20", **{key: value})
    _refused(_resume(run), expect)


def test_next_step_beyond_max_steps_is_refused_not_finished_with_nan(run):
    ck = run / "checkpoints"
    (ck / "step_20").rename(ck / "step_99")
    _edit_state(ck / "step_99", step=99, next_step=99, adam_t=99)
    _refused(_resume(run, "--set", "schedule.max_steps=20"), "next_step 99 is beyond schedule.max_steps 20")
    # without max_steps (epochs decide) each rank refuses it once the data plan is known
    _refused(_resume(run), "next_step 99 is beyond this run's 20 steps")


def test_a_renamed_step_directory_is_refused(run):
    ck = run / "checkpoints"
    (ck / "step_10").rename(ck / "step_30")   # e.g. taken from another run's directory under a new name
    _refused(_resume(run), "step_30", "renamed, or taken from another run")


@pytest.mark.parametrize("change,expect", [
    ("seed=5", "cannot continue exactly: recipe.seed (checkpoint 0, this run 5)"),
    ("optimizer.lr=0.5", "cannot continue exactly: recipe.optimizer.lr"),
    ("cluster.devices_per_node=2", "cannot continue exactly: global_batch (checkpoint 4, this run 8)"),
])
def test_another_run_s_checkpoint_is_refused_before_any_worker(run, change, expect):
    r = _refused(_resume(run, "--set", change), expect)
    assert "resume with the recipe and model" in r
    assert not (run / "logs" / "msrun").exists()   # refused in port's process: msrun never started


def test_a_truncated_rank_file_is_one_line_before_msrun(run):
    """The TP/DP case: a 2-worker resume (same global batch) of a checkpoint whose rank file is cut short."""
    f = run / "checkpoints" / "step_20" / "rank_00000.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    r = _resume(run, "--set", "cluster.devices_per_node=2", "--set", "batching.micro_batch_size=2")
    _refused(r, "rank_00000.safetensors", "truncated or replaced", "the checkpoint is damaged")
    assert not (run / "logs" / "msrun").exists()


def test_a_damaged_state_gets_the_same_advice_with_and_without_resume(run):
    (run / "checkpoints" / "step_20" / "state.json").write_text("{not json")
    with_resume, without = _refused(_resume(run)), _refused(_resume(run, resume=False))
    assert with_resume == without
    assert "delete" in with_resume and "step_20" in with_resume and "rerun with --resume" in with_resume


def test_a_layout_change_the_checkpoint_makes_exact_is_said(trained):
    from model_zoo.config import LlamaConfig
    from porting.model_paths import resolve_hf
    from porting.train.recipe.schema import load_recipe
    from porting.train.run.checkpoint.resume_check import check_run_dir

    rec = load_recipe(TINY, ["cluster.devices_per_node=2", "batching.micro_batch_size=2"])
    cfg = LlamaConfig.from_hf(resolve_hf(rec.model.source)).to_hf()
    note = check_run_dir(trained, True, rec, cfg)
    assert note and "written by 1 rank(s)" in note and "this run has 2" in note and "re-cut exactly" in note
    assert check_run_dir(trained, True, load_recipe(TINY), cfg) is None   # same layout: nothing to say


def test_a_directory_without_a_layout_record_is_refused_naming_what_it_is(run):
    """The single-file format of earlier builds (train_state.ckpt, no layout.json) is not read: one line names
    what the directory holds and what a checkpoint is, with and without --resume, before any worker."""
    from model_zoo.errors import CheckpointError
    from porting.train.recipe.schema import load_recipe
    from porting.train.run.checkpoint.save import latest
    from porting.train.run.checkpoint.resume_check import check_run_dir

    ck = run / "checkpoints" / "step_20"
    (ck / "layout.json").unlink()
    (ck / "rank_00000.safetensors").rename(ck / "train_state.ckpt")
    assert latest(run / "checkpoints")[1].name == "step_10"   # never taken for a complete checkpoint
    for resume in (True, False):
        with pytest.raises(CheckpointError) as e:
            check_run_dir(run, resume, load_recipe(TINY))
        line = str(e.value)
        assert "\n" not in line and "step_20: holds train_state.ckpt and no layout.json" in line, line
        assert "expected a per-rank `port train` checkpoint: layout.json" in line, line


def test_resuming_a_finished_run_says_so_and_reads_its_checkpoint_once(run):
    """The resume still restores (then finds nothing to train); it reads its share of the checkpoint once: the
    weights while the model is built, the optimizer state after, each parameter group once, the bytes read less
    the headers equal to the shard (a one-device rank's shard is the whole checkpoint's data)."""
    from porting.train.run.checkpoint.format import CODES

    r = _resume(run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "nothing to train, the run was already complete" in r.stdout and "nan" not in r.stdout
    read = resume_reads((run / "logs" / "rank_0.log").read_text())
    assert read["how"].startswith("the weights while the model was built") and read["ratio"] < 1.01
    layout = json.loads((run / "checkpoints" / "step_20" / "layout.json").read_text())["layout"]
    data = sum(math.prod(p["shape"]) * (CODES[p["dtype"]] + 8) for p in layout["params"])   # the weight, m and v
    assert read["shard"] == data and {k for k, _ in read["groups"]} == {"weights", "adam_m", "adam_v"}
