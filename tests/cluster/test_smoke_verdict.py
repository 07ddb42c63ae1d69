"""The smoke test's verdict from its workers' logs (porting/cluster/smoke_shape.py ``verdict``), on the lines two
real msrun workers wrote (smoke_collectives.py on the CPU, 4 MiB per rank; the suite under load, 2026-12-05):
both workers ran every collective and logged their end, then msrun exited 1 because its scheduler saw worker
1's exit 30 s late (MS_NODE_TIMEOUT: "The node: 1 is timed out"). The collectives answered, so the row is ok
and says how msrun exited, as a training launch whose every rank finished is (porting/launch/outcome.py);
a worker that did not log its end, or a collective that failed, still fails it."""

from __future__ import annotations

from pathlib import Path

from porting.cluster.smoke_shape import verdict
from porting.train.recipe.schema import load_recipe
from tests.train.conftest import TINY

MIB4 = 4 << 20


def _worker(rank: int, ms: tuple[float, float, float], end: bool = True) -> str:
    lines = []
    for op, t in zip(("AllReduce", "ReduceScatter (AllReduce + slice)", "AllGather"), ms):
        lines += [f"smoke rank {rank} node 0 group world ranks 0,1 op {op} start",
                  f"smoke rank {rank} node 0 group world op {op} ok {t} ms {MIB4} bytes"]
    if end:
        lines.append(f"rank {rank}/2 step 1 loss 0.0 smoke collectives ok")
    return "\n".join(lines) + "\n"


def _logs(tmp_path: Path, end1: bool = True, failed: bool = False) -> Path:
    d = tmp_path / "smoke"
    d.mkdir()
    (d / "worker_0.log").write_text(_worker(0, (75.01, 76.2, 61.986)))
    text = _worker(1, (76.942, 77.137, 69.672), end=end1)
    if failed:
        text = text.replace("op AllGather ok 69.672 ms 4194304 bytes",
                            "op AllGather FAILED: RuntimeError: Launch kernel failed, name:Default/AllGather-op3")
    (d / "worker_1.log").write_text(text)
    return d


def _recipe():
    return load_recipe(TINY, ["cluster.devices_per_node=2"], check_files=False)


def test_every_worker_finished_is_ok_whatever_msrun_exited_with(tmp_path):
    logs = _logs(tmp_path)
    row = verdict(_recipe(), 0, 1, logs, (MIB4 // 4,))
    assert row["status"] == "ok", row
    assert row["collectives"] == {"world AllReduce": 76.942, "world ReduceScatter (AllReduce + slice)": 77.137,
                                  "world AllGather": 69.672}
    assert "msrun exited 1 after every worker had finished" in row["detail"] and str(logs) in row["detail"]
    assert logs.is_dir()   # kept: the late exit is in the scheduler's log
    clean = verdict(_recipe(), 0, 0, logs, (MIB4 // 4,))
    assert clean["status"] == "ok" and "msrun exited" not in clean["detail"] and not logs.exists()


def test_a_worker_that_did_not_log_its_end_fails_the_row_and_is_explained(tmp_path):
    seen = []
    row = verdict(_recipe(), 0, 1, _logs(tmp_path, end1=False), (MIB4 // 4,),
                  explain=lambda d, n: seen.append((d.name, n)) or "rank 1: killed")
    assert row["status"] == "fail" and row["detail"].startswith("node 0: 1 of 2 worker(s) did not finish (rank 1: killed)")
    assert seen == [("smoke", 2)]


def test_a_failed_collective_fails_the_row_naming_it_even_when_msrun_exited_0(tmp_path):
    row = verdict(_recipe(), 0, 0, _logs(tmp_path, end1=False, failed=True), (MIB4 // 4,), explain=lambda d, n: "unused")
    assert row["status"] == "fail", row
    assert row["detail"].startswith("node 0, rank 1: group world (ranks 0,1, node(s) 0) AllGather: RuntimeError"), row
    assert "unused" not in row["detail"]


def _allreduce_logs(tmp_path: Path, agreed: tuple[int, ...]) -> Path:
    d = tmp_path / "allreduce"
    d.mkdir()
    for r in (0, 1):   # porting/launch/workers/smoke_allreduce.py's last line, as its workers print it
        (d / f"worker_{r}.log").write_text("[WARNING] DISTRIBUTED ... BuildCluster] Cluster is successfully initialized.\n"
                                           + (f"rank {r}/2 step 1 loss 0.0 smoke all-reduce ok (3.0)\n" if r in agreed else ""))
    return d


def test_the_one_node_all_reduce_follows_the_same_rule(tmp_path):
    from porting.cluster.preflight import allreduce_verdict

    logs = _allreduce_logs(tmp_path, (0, 1))
    late = allreduce_verdict(logs, 2, 1)
    assert late["status"] == "ok" and "msrun exited 1 after every worker had finished" in late["detail"], late
    assert allreduce_verdict(logs, 2, 0)["detail"] == "2 worker(s) under msrun agreed on one AllReduce"
    assert not logs.exists()
    one = allreduce_verdict(_allreduce_logs(tmp_path, (0,)), 2, 0, explain=lambda d, n: "rank 1: never agreed")
    assert one["status"] == "fail" and "diagnosis: rank 1: never agreed" in one["detail"], one
    (tmp_path / "none").mkdir()
    assert allreduce_verdict(tmp_path / "none", 2, 0)["status"] == "fail"   # no worker log at all is no agreement
