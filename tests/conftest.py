"""Shared fixtures. The real model and text come from what port ships (model_zoo/assets, porting/*/assets),
so a plain clone runs the whole real-model tier. Ascend test material from ../shared whose licence lets port
ship it is copied in tests/fixtures/ascend (README there: source and licence of each file); `shared_file` and
`shared` read ../shared where it is beside the clone and that copy otherwise. Rank-table templates port may
not ship (CANN Open Software License) have equivalents written for the tests in tests/fixtures/ascend_written
(`rank_table_params`), the CC BY-NC Alpaca data a set written for them (tests/train/conftest.py `alpaca`).
`shared_file` skips, naming the file, only for material that is in neither place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# MindSpore's PyNative ops run synchronously in the suite (and in every `port` and msrun process it starts, which
# inherit the variable), unless the caller chose: by default an op is queued to a worker thread and the Python
# thread waits for the queue in a busy loop (mindspore/ccsrc/runtime/pipeline/async_rqueue.cc, AsyncRQueue::Wait:
# `while (!tasks_queue_.IsEmpty()) {}`), the worker yielding in a loop between ops: two threads busy for one
# op's work. Four xdist workers on 2 cores turned that into a third of the suite's CPU seconds in the PyNative
# files (BENCHMARKS.md "Test suite", 2026-12-05: 253 -> 142 CPU-s for tests/verify, model_zoo, bisect and the
# model cards; the same numbers bit for bit). MindSpore reads the variable when it is imported, so it is set
# before any test module imports it. The compatibility tiers (scripts/compat.sh, compat312.sh) set it to 0 and
# run MindSpore's default pipeline, as a user's `port` does.
os.environ.setdefault("MS_DEV_LAUNCH_BLOCKING", "1")
# The static-graph distributed parallel API MindSpore retires after 2.11 raises in every test, in this process and in
# every `port` and msrun process it starts (they inherit the variable): the suite is the proof that port runs without
# it (porting/train/run/step/probes.py; issue 48).
os.environ.setdefault("PORT_TEST_REFUSE_STATIC_PARALLEL", "1")
SHARED = Path(os.environ.get("PORT_SHARED", ROOT.parent / "shared"))
EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
GOLDEN_TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
               "One day, she saw a big, red ball. She wanted to play with it, but it was too high")
GOLDEN_FIRST_IDS = [403, 407, 261, 378, 432, 383, 286, 261, 376, 298]


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)`` run once for the whole suite, not once per xdist worker: in the session's shared temporary
    folder (the workers' own are inside it), under a lock, the other workers waiting for it and then reading the
    same folder (read only: a test that changes it copies it first). A build that raised leaves nothing marked
    built, and the next worker that asks builds it again (and fails the same way, in its own tests)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, done = root / f"shared-{name}", root / f"shared-{name}.built"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)   # what a failed build of this session left
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")   # shared by every file and every xdist worker: built once (built_once)
def model_dir(tmp_path_factory):
    """stories260K's real weights, its first of 5 layers (8 heads, 4 KV heads): the model of the msrun tests whose
    subject is a layout, a launch or a fault, not the depth. A graph of one layer compiles in about a third of the
    time of all five (a TP 2 step graph: 3.3-4.3 s against 11.8-13.5 s on 4 workers, BENCHMARKS.md "Test suite")."""
    return built_once(tmp_path_factory, "stories1", _first_layer)


def _first_layer(out: Path) -> None:
    import json

    from safetensors.numpy import load_file, save_file

    cfg = json.loads((EMBEDDED / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg))
    keep = {k: v for k, v in load_file(str(EMBEDDED / "model.safetensors")).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < 1}
    save_file(keep, str(out / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(EMBEDDED / name, out / name)


# MindSpore's cluster nodes send a heartbeat every MS_RETRY_INTERVAL_LOWER..UPPER seconds (3..5 by default,
# MindSpore's mindspore/ccsrc/distributed/cluster/topology/compute_graph_node.cc ComputeGraphNode::Heartbeat;
# the table of https://www.mindspore.cn/tutorials/zh-CN/r2.6.0rc1/parallel/dynamic_cluster.html), and a worker
# learns that the cluster is built from a heartbeat's reply: every msrun job of the suite waited up to 5 s
# before its first step. On one machine a heartbeat every 0-1 s costs nothing; a 2-worker tiny run here:
# 14.9-15.8 s -> 9.8 s, the same CPU seconds (BENCHMARKS.md "Test suite"). A caller's own values are kept.
os.environ.setdefault("MS_RETRY_INTERVAL_LOWER", "0")
os.environ.setdefault("MS_RETRY_INTERVAL_UPPER", "1")


def _has_npu() -> bool:
    return shutil.which("npu-smi") is not None or Path("/dev/davinci0").exists()


# scripts/test.sh runs the suite on four pytest-xdist workers (--dist loadgroup --no-loadscope-reorder).
# Every file is a group of its own: its module-scoped fixtures (a training run, a conversion) are built once,
# on one worker. The machine-wide checks (`port doctor`, the preflight checks, the help example that runs
# `port doctor`: free ports, running training processes) share one group ("machine") and run one after
# another. The longest files come first (LONG_FIRST below), then the other files that start msrun jobs;
# at most four msrun jobs run at a time (one per xdist worker), each on a master port of its own
# (tests/train/conftest.py free_port). pytest-xdist 3.8 reads the groups into the node ids through
# `item._nodeid`, which pytest 9.2 no longer uses (every file's tests were spread over both workers and its
# module fixtures built twice): pyproject.toml keeps pytest below 9.2, and this hook runs before xdist's.
MACHINE_WIDE = {"tests/diagnostics/test_doctor.py", "tests/cluster/test_preflight.py",
                "tests/test_cli.py::test_every_help_example_runs"}


def _machine_wide(item, rel: str) -> bool:
    return rel in MACHINE_WIDE or f"{rel}::{item.originalname}" in MACHINE_WIDE


# The longest groups start first, in pairs of one that keeps a core busy and one that mostly waits (a killed or
# frozen rank's timeouts, msrun's scheduler, deadlines polled: 0.16-0.35 of a core over their wall time in a
# clean-clone run against 0.56-0.67 for the busy ones, with four workers on two cores). The msrun-first order
# started the waiting files together and test_train.py last, alone for its last 50 s (the timeline of
# PORT_TEST_CPU_LOG's end times). The suite is CPU-bound (vmstat: the cores 0-4% idle), so the gain is small:
# 908.5 -> 893.9 s like for like in .ci/run (BENCHMARKS.md "Test suite", 2026-12-05 06:45). Only the order
# changes: a file missing here runs after these.
BUSY_LONG = ("tests/test_rehearse.py", "tests/train/test_tensor_parallel.py", "tests/train/test_ckpt_layouts.py",
             "tests/train/test_train.py", "tests/train/test_host_rss_measured.py", "tests/train/test_precompile.py",
             "tests/test_model_cards.py", "tests/train/test_msrun.py")
WAITING_LONG = ("tests/launch/test_supervise.py", "machine", "tests/launch/test_lifeline.py", "tests/attacks/test_kill9.py",
                "tests/diagnostics/test_diagnose_msrun.py", "tests/launch/test_shrink.py", "tests/launch/test_nodes.py",
                "tests/cluster/test_preflight_shape.py")
LONG_FIRST = [g for pair in zip(BUSY_LONG, WAITING_LONG) for g in pair]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    rel = {item.nodeid: Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix() for item in items}
    group, first = {}, set()
    for item in items:
        wide = _machine_wide(item, rel[item.nodeid])
        group[item.nodeid] = "machine" if wide else rel[item.nodeid]
        item.add_marker(pytest.mark.xdist_group(group[item.nodeid]))
        if "msrun" in item.keywords or wide:
            first.add(group[item.nodeid])

    def order(item) -> tuple[int, int]:
        g = group[item.nodeid]
        return (LONG_FIRST.index(g), 0) if g in LONG_FIRST else (len(LONG_FIRST), g not in first)

    items.sort(key=order)   # stable: files of equal key keep their order
    if _has_npu():
        return
    skip = pytest.mark.skip(reason="needs a real Ascend NPU")
    for item in items:
        if "npu" in item.keywords:
            item.add_marker(skip)


# PORT_TEST_CPU_LOG=FILE: one JSON line per test with its CPU seconds and end time (this process plus every child it
# waited for: a `port train` and the msrun workers under it), appended by each xdist worker. CPU seconds hold
# whatever else the machine runs, where wall seconds do not (benchmarks/suite_cpu.py sums them by file).
_CPU_LOG = os.environ.get("PORT_TEST_CPU_LOG")


def _cpu_now() -> float:
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_LOG:
        yield
        return
    import json
    import time

    t0, c0 = time.monotonic(), _cpu_now()
    yield
    rec = {"test": item.nodeid.split("@")[0], "cpu_s": round(_cpu_now() - c0, 3),
           "wall_s": round(time.monotonic() - t0, 3), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
           "end": round(time.time(), 3)}
    with open(_CPU_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


FIXTURES = ROOT / "tests" / "fixtures"
SHIPPED_ASCEND = FIXTURES / "ascend"  # shipped copies of files of ../shared/data/ascend, same layout
WRITTEN_TABLES = FIXTURES / "ascend_written" / "rank_tables"
# ../shared's rank tables that port may not ship (CANN Open Software License 2.0 templates of the HCCL guide),
# each with the table written for the tests from the documented format that exercises the same rules
# (tests/fixtures/ascend_written/README.md): the tests check the written one always, the real one as well
# where ../shared is present.
WRITTEN_FOR = {
    "hccl_cann85_guide_A3_v1.2_2servers_2dev.json": "v1.2_a3_2servers_2dev_1pod.json",
    "hiascend_hcclug_A2_v1.0_2servers_2dev.json": "v1.0_a2_2servers_2dev_device_port.json",
    "rank_table_config_300i_duo_0_v1.0.json": "v1.0_2servers_2dev.json",
    "rank_table_config_910_0_v1.0.json": "v1.0_2servers_2dev.json",
    "rank_table_config_910_1_v?.json": "legacy_group_list.json",
    "rank_table_config_a2_0_v1.0.json": "v1.0_a2_2servers_2dev_device_port.json",
    "rank_table_config_a3_0_v1.2.json": "v1.2_a3_4servers_4dev_2pods_backup.json",
    "rank_table_config_a3_1_v1.0.json": "v1.0_a3_2servers_2dev_host_ports.json",
    "rank_table_config_a5_0_v2.0.json": "v2.0_peer_edge_list.json",
    "rank_table_config_a5_1_v2.0.json": "v2.0_rank_list_ipv4.json",
    "rank_table_config_a5_2_v2.0.json": "v2.0_rank_list_eid.json",
}


def shipped_copy(relpath: str) -> Path | None:
    """The copy port ships of ``../shared/<relpath>`` (tests/fixtures/ascend), or None where it ships none."""
    prefix = "data/ascend/"
    if not relpath.startswith(prefix):
        return None
    path = SHIPPED_ASCEND / relpath[len(prefix):]
    return path if path.exists() else None


def shared_file(relpath: str) -> Path:
    """``../shared/<relpath>``, or the copy port ships of it; skips, naming it, where there is neither."""
    path = SHARED / relpath
    if path.exists():
        return path
    shipped = shipped_copy(relpath)
    if shipped is not None:
        return shipped
    pytest.skip(f"needs ../shared/{relpath} (test material port does not ship), not found at {path}")


def rank_table_params(name: str) -> list:
    """pytest params (one path each) for ``../shared/data/ascend/rank_tables/<name>``: the real table, from
    ../shared or the shipped copy, where one is here; and, for a table port may not ship, its written
    equivalent (`WRITTEN_FOR`), id ``<name>~written``, so a plain clone checks what the real one checks."""
    params = []
    real = SHARED / "data/ascend/rank_tables" / name
    real = real if real.exists() else shipped_copy(f"data/ascend/rank_tables/{name}")
    if real is not None:
        params.append(pytest.param(real, id=name))
    if name in WRITTEN_FOR:
        params.append(pytest.param(WRITTEN_TABLES / WRITTEN_FOR[name], id=f"{name}~written"))
    assert params, f"no rank table {name} in ../shared, tests/fixtures/ascend or WRITTEN_FOR"
    return params


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> Path:
    """The ../shared folder itself, for tests that read several files of it (see `shared_file`). In a clone
    without it: a folder laid out like it, holding the copies port ships (tests/fixtures/ascend), so a test
    that reads a file port does not ship fails there (give it a written equivalent) instead of skipping."""
    if SHARED.is_dir():
        return SHARED
    mirror = tmp_path_factory.mktemp("shared")
    shutil.copytree(SHIPPED_ASCEND, mirror / "data" / "ascend",
                    ignore=shutil.ignore_patterns("README.md", "LICENSES", "SHA256SUMS"))
    return mirror


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    """The real stories260K as port ships it (tests/model_zoo/test_real_model.py checks it is shared's)."""
    return EMBEDDED


@pytest.fixture(scope="session")
def tiny_cpu_run(tmp_path_factory) -> Path:
    """The run directory of `port train recipes/tiny-cpu.yaml`, run once for the suite as a user runs it (the command
    as written, in a directory of its own; in the process of the worker that asks first, tests/helpers.py), for the
    tests that read a finished run: copy it to change it."""
    return built_once(tmp_path_factory, "tiny-cpu", _tiny_cpu) / "runs" / "tiny-cpu"


def _tiny_cpu(work: Path) -> None:
    from tests.helpers import port

    (work / "recipes").symlink_to(ROOT / "recipes")
    p = port("train", "recipes/tiny-cpu.yaml", cwd=work)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "done: 20 steps" in p.stdout + p.stderr, p.stderr[-3000:]


@pytest.fixture(scope="module")
def graph_mode_module():
    """GRAPH_MODE while a module's module-scoped fixtures compile and train (request it with
    ``pytest.mark.usefixtures("graph_mode_module")`` beside ``pytest.mark.graph_mode``)."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.fixture(autouse=True)
def _mindspore_mode(request):
    """Tests share one process: each test starts in PyNative (an in-process `port train` switches to
    graph mode and must not leave it on for the next one), or in GRAPH_MODE when marked ``graph_mode``.
    Set per test, after any module-scoped fixture, so a test body runs in the mode its marker says."""
    import mindspore as ms

    graph = request.node.get_closest_marker("graph_mode") is not None
    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)
