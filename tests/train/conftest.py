"""Helpers for the `port train` tests: free ports, small run settings, reading a run (the CLI itself:
tests/helpers.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from porting.cluster.preflight import free_port  # noqa: F401 (the train tests import it from here)
from tests.conftest import SHARED, built_once
from tests.fixtures import alpaca_written

if TYPE_CHECKING:
    from porting.train.plan.make import TrainPlan

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny-cpu.yaml"
# Small and fast: one padded shape (one compiled graph), few steps, no HF export unless asked.
FAST = ["--set", "data.max_seq_length=64", "--set", "batching.bucketing.enabled=false",
        "--set", "checkpointing.export_hf=false"]


def tiny_plan(*sets: str) -> "TrainPlan":
    """The dry-run plan of recipes/tiny-cpu.yaml with ``sets`` (--set values), as `port train` writes plan.json
    from it: the real planner, no MindSpore, a few ms."""
    from porting.train import load_recipe, make_plan, plan_config

    rec = load_recipe(str(TINY), list(sets), check_files=False)
    return make_plan(rec, plan_config(rec)[0], "runs/x")


def error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert lines, f"no error line in stderr:\n{p.stderr[-2000:]}"
    return lines[-1]


_GROUP = re.compile(r"resume (step_\d+) (\w+): (.+?): \d+ tensor\(s\), (\d+) bytes in")
_SUMMARY = re.compile(r"resume read (\d+) bytes of \S+ \((.+?); (\d+) of them file headers; this rank's shard "
                      r"(\d+) bytes, ratio ([\d.]+)\)")


def resume_reads(log: str) -> dict:
    """What one resume read, from a rank log's lines (porting/train/run/checkpoint/read.py): every parameter group's
    bytes by (kind, group), and the summary's total, header and shard bytes. Checks that the rank read its
    shard once: the total less the headers is the shard exactly, every group was read once, and the groups'
    bytes add up to the total (no read outside a logged group)."""
    groups: dict[tuple[str, str], int] = {}
    for _, kind, group, nbytes in _GROUP.findall(log):
        assert (kind, group) not in groups, f"{kind} of {group} read twice"
        groups[kind, group] = int(nbytes)
    (summary,) = _SUMMARY.findall(log)   # one resume in this log
    total, headers, shard = int(summary[0]), int(summary[2]), int(summary[3])
    assert total - headers == shard, (total, headers, shard)
    assert sum(groups.values()) == total, (sum(groups.values()), total)
    assert ("param" in {k for k, _ in groups}) != ("weights" in {k for k, _ in groups}), "weights read twice"
    return {"groups": groups, "total": total, "headers": headers, "shard": shard, "how": summary[1],
            "ratio": float(summary[4])}


def metrics(run_dir: Path) -> tuple[list[dict], dict | None]:
    """The run's step records and summary, read by the product's one reader (porting.rundir), as the
    dicts they are written as. A test run must not leave a malformed line."""
    from porting.rundir import read_metrics

    m = read_metrics(run_dir / "metrics.jsonl")
    assert m.warning is None, m.warning
    return [r.to_dict() for r in m.steps], (m.summary.to_dict() if m.summary else None)


STORIES = ROOT / "model_zoo" / "assets" / "stories260k"


def small_settings(model_dir, *extra: str) -> list[str]:
    """--set values of the small exact runs on ``model_dir`` (tensor parallel, checkpoint layouts)."""
    return [f"model.source={model_dir}", "data.max_seq_length=64", "batching.bucketing.enabled=false",
            "optimizer.lr=1e-4", "checkpointing.every_steps=0", *extra]


@pytest.fixture(scope="session")   # the one-device reference of the layout tests, read only, built once (built_once)
def one_device(model_dir, tmp_path_factory):
    """The reference of those runs: 1 device in-process, micro-batch 2 x 2 accumulation steps, 3 steps."""
    from porting.train import train
    from porting.train import load_recipe

    def build(folder: Path) -> None:
        train(load_recipe(TINY, small_settings(model_dir, "batching.micro_batch_size=2", "batching.grad_accum_steps=2",
                                               "schedule.max_steps=3")), folder / "run", echo=False)

    return built_once(tmp_path_factory, "tp1", build) / "run"


# ZeRO-1 over 2 msrun workers, micro-batch 1 x 2 accumulation steps (global batch 4), a checkpoint at step 2 of 2
# and the HF export on: the first leg of tests/train/test_msrun.py's sharded-optimizer resume, whose export (made by
# the launcher after the workers exit) is tests/train/test_export_after_exit.py's subject. One launch for both.
DP2_ZERO1 = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.every_steps=2",
             "checkpointing.export_hf=true", "cluster.devices_per_node=2", "batching.micro_batch_size=1",
             "batching.grad_accum_steps=2", "parallel.optimizer_sharding=true"]


@pytest.fixture(scope="session")   # read only, built once (built_once): a test that resumes it copies it first
def dp2_zero1_step2(model_dir, tmp_path_factory) -> Path:
    """FOLDER/run: that run after its 2 steps (``DP2_ZERO1``); FOLDER/stdout.txt: what `port train` printed."""
    return shared_dp2_zero1_step2(model_dir, tmp_path_factory)


def shared_dp2_zero1_step2(model_dir, tmp_path_factory) -> Path:
    """``dp2_zero1_step2``'s folder, for a fixture of the same name outside tests/train (the same build)."""
    from tests.helpers import port_process

    def build(folder: Path) -> None:
        sets = DP2_ZERO1 + [f"model.source={model_dir}", "schedule.max_steps=2", f"cluster.master_port={free_port()}"]
        p = port_process("train", str(TINY), "--run-dir", str(folder / "run"), *[a for s in sets for a in ("--set", s)],
                         check=True, timeout=400)
        (folder / "stdout.txt").write_text(p.stdout)

    return built_once(tmp_path_factory, "dp2-zero1-step2", build)


# DP 2 under ``determinism: bitwise``, 8 steps (micro-batch 4 x DP 2 of the 16 windows: 4 epochs), one compiled
# shape, no HF export: one of tests/train/test_determinism.py's two launches of the same recipe, and the port side of
# tests/baseline/test_data_parallel.py's comparison with one torch process. One launch for both.
DP2_BITWISE = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
               "checkpointing.every_steps=0", "schedule.max_steps=8", "cluster.devices_per_node=2",
               "determinism=bitwise"]


@pytest.fixture(scope="session")   # read only, built once (built_once)
def dp2_bitwise(model_dir, tmp_path_factory) -> Path:
    """The run folder of ``DP2_BITWISE`` on ``model_dir``."""
    return shared_dp2_bitwise(model_dir, tmp_path_factory)


def shared_dp2_bitwise(model_dir, tmp_path_factory) -> Path:
    """``dp2_bitwise``'s run folder, for a fixture of the same name outside tests/train (the same build)."""
    from tests.helpers import port_process

    def build(folder: Path) -> None:
        sets = DP2_BITWISE + [f"model.source={model_dir}", f"cluster.master_port={free_port()}"]
        port_process("train", str(TINY), "--run-dir", str(folder / "run"), *[a for s in sets for a in ("--set", s)],
                     check=True, timeout=500)

    return built_once(tmp_path_factory, "dp2-bitwise", build) / "run"


ALPACA_REAL = SHARED / "data/instruct/alpaca_en_demo.json"  # CC BY-NC: tests only, port does not ship it


@pytest.fixture(scope="session")
def alpaca(tmp_path_factory) -> Path:
    """Alpaca data: the real demo where ../shared is present, else the set written for the tests
    (tests/fixtures/alpaca_written.py: 999 rows, lengths spread like the real file's). One of the two, so the
    bucketing run is paid once."""
    if ALPACA_REAL.exists():
        return ALPACA_REAL
    return alpaca_written.write(tmp_path_factory.mktemp("alpaca"))


# --------------------------------------------------------------------------- gradient buckets (issue 48)
_SHAPE = re.compile(r": \(<Tensor\[\w+\], \((\d+)\)>\)")


def graph_buckets(ir_dir: Path) -> list[int]:
    """The elements of every AllReduce in the gradient buckets' cell (the step cell's ``reducer``,
    ``GradBuckets``) of rank 0's compiled step graph, in graph order (the graph_build dump with the most of them:
    the step, not the barrier's graph)."""
    found = []
    for f in sorted((ir_dir / "rank_0").glob("graph_build_*.ir")):
        lines, sizes = f.read_text(errors="replace").splitlines(), []
        for n, line in enumerate(lines):
            if "= AllReduce(" in line and any("Fullname with scope: (Default/reducer-GradBuckets/AllReduce" in ln
                                               for ln in lines[n + 1:n + 6]):
                sizes.append(int(_SHAPE.search(lines[n + 1]).group(1)))
        found.append(sizes)
    assert any(found), f"no AllReduce of the gradient buckets in the compiled graphs under {ir_dir}"
    return max(found, key=len)


def traced_steps(trace: Path, buckets: int) -> list[list[tuple]]:
    """Rank 0's PyNative collective trace cut into steps: per step, the gradient buckets' collectives (1-D, more
    than 2 elements) and the scalar loss and token-count sums (shape []), in launch order, as (op, elements)."""
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    kept = [(r["op"], r["shape"][0] if r["shape"] else 0) for r in rows
            if r["shape"] == [] or (len(r["shape"]) == 1 and r["shape"][0] > 2)]
    per_step = buckets + 2
    assert len(kept) % per_step == 0, kept[:20]
    return [kept[i:i + per_step] for i in range(0, len(kept), per_step)]


def plan_of(args: list[str]) -> dict:
    """The plan's gradient buckets (`port train --dry-run --json`) of a run with these arguments."""
    from tests.helpers import port

    return json.loads(port("train", str(TINY), "--dry-run", "--json", *args, check=True).stdout)["gradient_allreduce"]
