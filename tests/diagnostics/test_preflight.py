"""`port doctor --cluster RECIPE` (issue 12 item 4): each check catches its fault on real resources
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

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "porting", "doctor", "--cluster", str(RECIPE), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, env=env)


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
    # nothing listens on this port yet, but the host answers: that is a reachable master
    assert preflight.check_master_reachable("127.0.0.1", free_port())["status"] == "ok"
    r = doctor("--set", "cluster.master_addr=node0.invalid", "--no-smoke", "--json")
    rows = {c["check"]: c for c in json.loads(r.stdout)["checks"]}
    assert r.returncode == 1 and rows["master address"]["status"] == "fail"


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
        assert row["status"] == "fail" and f"pid {proc.pid}" in row["detail"] and "EJ0001" in row["detail"]
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in dict(preflight.stale_processes())


@pytest.mark.slow
@pytest.mark.msrun
def test_smoke_allreduce_under_msrun_passes_and_a_failure_is_diagnosed():
    ok = preflight.smoke_allreduce(2, free_port(), timeout_s=60)
    assert ok["status"] == "ok", ok["detail"]
    bad = preflight.smoke_allreduce(2, free_port(), timeout_s=10, device="Ascend")   # no NPU on this machine
    assert bad["status"] == "fail" and "diagnosis: rank" in bad["detail"]
