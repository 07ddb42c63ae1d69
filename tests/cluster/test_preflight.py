"""`port doctor --cluster RECIPE`: each check catches its fault on real resources
(a socket really bound, a real process, a real rank table, two real fingerprints) and the smoke
all-reduce runs under msrun on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porting.cluster import generate, preflight
from porting.cluster.preflight import free_port

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "porting", "doctor", "--cluster", str(RECIPE), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, env=env)


def train(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "porting", "train", str(RECIPE), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


def test_busy_master_port_fails(tmp_path):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        assert preflight.check_port_free(port)["status"] == "fail"
        r = doctor("--set", f"cluster.master_port={port}", "--no-smoke", "--json")
    assert r.returncode == 1 and r.stderr.startswith("error: ")
    rows = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert rows["master port"]["status"] == "fail" and f"port {port} is in use" in rows["master port"]["detail"]
    assert preflight.check_port_free(port)["status"] == "ok"   # released: free again


def test_unreachable_master_fails():
    row = preflight.check_master_reachable("node0.invalid", 8118)
    assert row["status"] == "fail" and "does not resolve" in row["detail"]
    # nothing listens on this port yet, but the host answers: before node 0's job starts that is a warning
    closed = free_port()
    assert preflight.check_master_reachable("127.0.0.1", closed)["status"] == "warn"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert preflight.check_master_reachable("127.0.0.1", s.getsockname()[1])["status"] == "ok"
    r = doctor("--set", "cluster.master_addr=node0.invalid", "--no-smoke", "--json")
    rows = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert r.returncode == 1 and rows["master address"]["status"] == "fail"


def test_master_that_resolves_but_does_not_answer_fails_within_the_bound():
    # a closed loopback port: the host is there, nothing listens for the whole wait (node 0 not started)
    closed = free_port()
    t0 = time.monotonic()
    row = preflight.check_master_reachable("127.0.0.1", closed, timeout_s=0.5, wait_s=1.0)
    assert time.monotonic() - t0 < 3.0
    assert row["status"] == "fail" and f"127.0.0.1:{closed}" in row["detail"]
    assert "refused connections for 1 s" in row["detail"] and "start node 0 first" in row["detail"]
    # a documentation address (RFC 5737) that no host answers: a dropped SYN times out, a filtering
    # network refuses or has no route; either way a failure naming it, within the connect timeout (+ wait)
    t0 = time.monotonic()
    row = preflight.check_master_reachable("192.0.2.1", 8118, timeout_s=0.5, wait_s=0.5)
    assert time.monotonic() - t0 < 3.0
    assert row["status"] == "fail" and "192.0.2.1:8118" in row["detail"]
    assert "cluster.master_addr" in row["detail"]


def test_port_train_on_node_1_waits_a_bounded_time_for_node_0_then_stops(tmp_path):
    closed = free_port()
    t0 = time.monotonic()
    r = train("--run-dir", str(tmp_path / "run"), "--launch-node", "1", "--set", "cluster.nodes=2",
              "--set", "cluster.devices_per_node=2", "--set", f"cluster.master_port={closed}",
              "--set", "cluster.cluster_time_out=2")
    assert time.monotonic() - t0 < 30
    assert r.returncode != 0 and r.stderr.startswith("error: preflight: master address: ")
    assert f"127.0.0.1:{closed}" in r.stderr and "start node 0 first" in r.stderr and "--no-preflight" in r.stderr
    assert not (tmp_path / "run").exists() and len(r.stderr.strip().splitlines()) == 1


def test_port_train_refuses_a_busy_master_port(tmp_path):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        r = train("--run-dir", str(tmp_path / "run"), "--set", "cluster.devices_per_node=2",
                  "--set", f"cluster.master_port={port}")
    assert r.returncode != 0 and r.stderr.startswith("error: preflight: master port: ")
    assert f"port {port} is in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "launching" not in r.stderr and not (tmp_path / "run").exists()   # nothing launched, nothing written


def stale_job(run: Path, *extra: str) -> subprocess.Popen:
    """A left-over launcher of an earlier job on ``run`` (by its argv, as /proc shows it)."""
    code = "import time; time.sleep(60)"
    cmd = f"exec -a msrun {sys.executable} -c '{code}' --log_dir={run}/logs/msrun " + " ".join(extra)
    proc = subprocess.Popen(["bash", "-c", cmd])
    for _ in range(50):
        if any(pid == proc.pid for pid, _ in preflight.stale_processes()):
            break
        time.sleep(0.1)
    return proc


def test_port_train_refuses_a_stale_process_on_its_run_directory(tmp_path):
    run = tmp_path / "run"
    proc = stale_job(run)
    try:
        r = train("--run-dir", str(run))
        assert r.returncode != 0 and r.stderr.startswith("error: preflight: stale processes: ")
        assert f"pid {proc.pid}: msrun" in r.stderr and "kill PID" in r.stderr
        assert not run.exists()
        # another run directory does not collide with it
        assert preflight.check_stale_for_run(tmp_path / "other", 0)["status"] == "ok"
    finally:
        proc.kill()
        proc.wait()
    assert preflight.check_stale_for_run(run, 0)["status"] == "ok"


def test_other_node_ranks_of_the_same_job_on_this_machine_are_not_stale(tmp_path):
    run = tmp_path / "run"
    proc = stale_job(run, "--node_rank=1")   # node 1's msrun of this job, started on the same machine
    try:
        assert preflight.check_stale_for_run(run, 0)["status"] == "ok"
        row = preflight.check_stale_for_run(run, 1)   # from node 1's own view it is a second node 1
        assert row["status"] == "fail" and f"pid {proc.pid}" in row["detail"]
    finally:
        proc.kill()
        proc.wait()


def test_rank_table_that_disagrees_with_the_recipe_fails(tmp_path):
    table = generate.generate([{"server_id": "node_0", "devices": [{"device_id": i} for i in range(8)]}])
    rt = tmp_path / "rank_table.json"
    generate.write_table(table, rt)
    ok = preflight.check_rank_table(str(rt), nodes=1, per_node=8)
    assert ok["status"] == "ok"
    bad = preflight.check_rank_table(str(rt), nodes=2, per_node=8)
    assert bad["status"] == "fail" and "nodes=2" in bad["detail"]
    r = doctor("--set", "cluster.nodes=2", "--set", "cluster.devices_per_node=8", "--rank-table", str(rt),
               "--no-smoke", "--json")
    rows = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert r.returncode == 1 and rows["rank table"]["status"] == "fail" and "nodes=2" in rows["rank table"]["detail"]


def test_env_knob_that_differs_between_nodes_fails(tmp_path):
    fp_dir = tmp_path / "fingerprints"
    base = {k: v for k, v in os.environ.items() if not k.startswith(preflight.FINGERPRINT_PREFIXES)}
    for node, timeout in ((1, "600"), (0, "120")):
        env = dict(base, HCCL_CONNECT_TIMEOUT=timeout, PYTHONPATH=str(ROOT))
        r = doctor("--node-rank", str(node), "--fingerprint-dir", str(fp_dir), "--set", "cluster.nodes=2",
                   "--set", "cluster.master_addr=127.0.0.1", "--no-smoke", "--json", env=env)
        rows = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert sorted(p.name for p in fp_dir.iterdir()) == ["node_0.json", "node_1.json"]
    row = rows["env fingerprint"]
    assert row["status"] == "fail" and "HCCL_CONNECT_TIMEOUT: node 0 '120', node 1 '600'" in row["detail"]
    # the same knobs everywhere: no difference
    for node in (0, 1):
        preflight.write_fingerprint(fp_dir, node, preflight.fingerprint(dict(base, HCCL_CONNECT_TIMEOUT="120")))
    assert preflight.compare_fingerprints(fp_dir, 2)["status"] == "ok"


def test_stale_training_process_is_found():
    proc = subprocess.Popen(["bash", "-c", "exec -a msrun sleep 60"])   # a left-over launcher, by its argv
    try:
        for _ in range(50):
            if any(pid == proc.pid for pid, _ in preflight.stale_processes()):
                break
            time.sleep(0.1)
        found = dict(preflight.stale_processes())
        assert proc.pid in found and found[proc.pid].startswith("msrun")
        row = preflight.check_stale()
        # the listing shows four (other jobs on a shared machine may come first)
        assert row["status"] == "fail" and "EJ0001" in row["detail"]
        assert f"pid {proc.pid}" in row["detail"] or row["detail"].count("; pid ") == 3
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in dict(preflight.stale_processes())


@pytest.mark.slow
@pytest.mark.msrun
def test_smoke_allreduce_under_msrun_passes_and_a_failure_is_diagnosed():
    ok = preflight.smoke_allreduce(2, free_port(), timeout_s=60)
    assert ok["status"] == "ok", ok["detail"]
    from porting.diagnostics.diagnose import explain_failure   # the caller's diagnosis, as `port doctor` passes it

    bad = preflight.smoke_allreduce(2, free_port(), timeout_s=10, device="Ascend",   # no NPU on this machine
                                    explain=explain_failure)
    assert bad["status"] == "fail" and "diagnosis: rank" in bad["detail"]
