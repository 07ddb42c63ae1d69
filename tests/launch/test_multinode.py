"""Two msrun node ranks on this machine (loopback master, 2 workers each) equal one node of 4 workers.

Both nodes are started with `port train --launch-node N`, the command a user runs on each node; they
share one run directory (the shared filesystem of a real cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.train.conftest import ROOT, TINY, free_port, metrics
from tests.helpers import port, port_process

pytestmark = [pytest.mark.msrun, pytest.mark.slow]

COMMON = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "batching.micro_batch_size=1",
          "schedule.max_steps=2", "checkpointing.every_steps=0", "cluster.master_addr=127.0.0.1"]


def _args(extra: list[str]) -> list[str]:
    return [a for s in COMMON + extra for a in ("--set", s)]


def test_two_node_ranks_equal_one_node_of_four_workers(tmp_path):
    from safetensors.numpy import load_file

    single = tmp_path / "one_node"
    port_process("train", str(TINY), "--run-dir", str(single),
                 *_args(["cluster.devices_per_node=4", f"cluster.master_port={free_port()}"]), check=True, timeout=900)

    two = tmp_path / "two_nodes"
    args = _args(["cluster.nodes=2", "cluster.devices_per_node=2", f"cluster.master_port={free_port()}"])
    plan = json.loads(port("train", str(TINY), "--dry-run", "--json", *args, check=True).stdout)
    assert [f"--node_rank={n}" in c for n, c in enumerate(plan["msrun_commands"])] == [True, True]
    env = plan["launch"]["env"]
    assert int(env["HCCL_EXEC_TIMEOUT"]) >= 1836 and int(env["HCCL_CONNECT_TIMEOUT"]) >= 600
    assert "HCCL_EXEC_TIMEOUT" in plan["launch"]["same_on_every_node"]

    penv = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    # Node 1 on node 0's machine waits for node 0's scheduler and runs msrun with --join=False
    # (porting.launch.msrun.same_host_node_argv), so its workers outlive its launcher: wait for node 0.
    nodes = [subprocess.Popen([sys.executable, "-m", "porting", "train", str(TINY), "--run-dir", str(two), *args,
                               "--launch-node", str(n)], cwd=ROOT, env=penv, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outs = []
    try:
        for p in reversed(nodes):
            outs.insert(0, p.communicate(timeout=900))
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    for n, (p, (_, err)) in enumerate(zip(nodes, outs)):
        assert p.returncode == 0, f"node {n} failed:\n{err[-3000:]}"
        assert f"--node_rank={n}" in err   # each launched its own node's command

    deadline = time.monotonic() + 120   # node 1's workers end with node 0's last collective
    while time.monotonic() < deadline and len(list((two / "logs").glob("rank_*.log"))) < 4:
        time.sleep(1)
    la = [s["loss"] for s in metrics(two)[0]]
    lb = [s["loss"] for s in metrics(single)[0]]
    assert len(la) == 2 and np.allclose(la, lb, rtol=0, atol=1e-6), (la, lb)
    wa, wb = load_file(str(two / "hf" / "model.safetensors")), load_file(str(single / "hf" / "model.safetensors"))
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) < 1e-6
    logs = {p.name for p in (two / "logs" / "msrun").glob("worker_*.log")}
    assert logs == {f"worker_{i}.log" for i in range(4)}, logs
    assert {p.name for p in (two / "logs").glob("rank_*.log")} == {f"rank_{i}.log" for i in range(4)}
