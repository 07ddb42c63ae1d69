"""`port train --launch-node N --supervise` on two node ranks (loopback master, 2 msrun workers each, one shared
run directory): the supervisors agree on an incident and relaunch together (porting/launch/nodes.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from porting.rehearse import LOSS_ATOL
from porting.launch.nodes import Peers, PeersError
from porting.launch.supervise import Incident
from tests.helpers import port
from tests.train.conftest import ROOT, TINY, free_port
from tests.launch.test_supervise import COMMON, _losses, _pid_at_step

NODES = [*[s for s in COMMON if not s.startswith(("cluster.devices_per_node", "schedule.max_steps"))],
         "cluster.nodes=2", "cluster.devices_per_node=2", "cluster.master_addr=127.0.0.1", "schedule.max_steps=6"]


def _node(run: Path, n: int, sets: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3")
    return subprocess.Popen([sys.executable, "-m", "porting", "train", str(TINY), "--run-dir", str(run),
                             *[a for s in sets for a in ("--set", s)], "--launch-node", str(n), "--supervise",
                             "--stall-timeout", "120"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.msrun
@pytest.mark.slow
def test_a_rank_killed_on_node_1_relaunches_both_nodes_from_one_checkpoint(tmp_path, model_dir):
    ref = tmp_path / "one"   # the same global batch on one device: DP 4 x accumulation 2 = accumulation 8
    one = [s for s in NODES if not s.startswith(("cluster.", "batching.grad_accum_steps"))] + [f"model.source={model_dir}"]
    r = port("train", str(TINY), "--run-dir", str(ref), *[a for s in [*one, "batching.grad_accum_steps=8"]
                                                           for a in ("--set", s)])
    assert r.returncode == 0, r.stderr[-3000:]

    run = tmp_path / "two"
    sets = [*NODES, f"model.source={model_dir}", f"cluster.master_port={free_port()}"]
    nodes = [_node(run, n, sets) for n in (0, 1)]
    try:
        os.kill(_pid_at_step(run, 2, 3, time.monotonic() + 600), signal.SIGKILL)   # rank 2 runs on node 1
        outs = [p.communicate(timeout=900) for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    for n, (p, (out, err)) in enumerate(zip(nodes, outs)):
        assert p.returncode == 0, f"node {n}:\n{err[-3000:]}"
        assert "launch 2 (--resume)" in err and "1 restart(s)" in out, (n, out, err[-2000:])

    inc = [json.loads(ln) for ln in (run / "incidents.jsonl").read_text().splitlines()]
    assert len(inc) == 1 and inc[0]["suspect"] == 2 and inc[0]["seen"].startswith("node 1: rank 2"), inc
    assert inc[0]["action"] == "relaunched with --resume from step 2", inc
    mirror = [json.loads(ln) for ln in (run / "supervise" / "incidents_node1.jsonl").read_text().splitlines()]
    assert [(i["suspect"], i["action"], i["resumed_from"]) for i in mirror] == [(2, inc[0]["action"], 2)]
    ev = run / inc[0]["evidence"] / "logs"   # node 1's snapshot: every rank's log (the shared run directory)
    assert {p.name for p in ev.glob("rank_*.log")} == {f"rank_{r}.log" for r in range(4)}
    assert (run / "incidents" / "1").is_dir() and (run / "incidents" / "1-node1").is_dir()
    la, lb = _losses(run), _losses(ref)
    assert len(la) == len(lb) == 6 and np.allclose(la, lb, rtol=0, atol=LOSS_ATOL), (la, lb)


def _incident(**kw) -> Incident:
    base = dict(n=1, at=time.time(), kind="exit", seen="rank 3: its process 1 is gone (after step 4)", step=4,
                verdict=None, observed_rank=3, suspect=3)
    return Incident(**{**base, **kw})


def test_node_0_settles_the_first_fault_for_every_node(tmp_path):
    """Two supervisors in one process: node 1 reports first, node 0 later sees its own ranks fail; node 0's
    decision names node 1's fault, and node 1 adopts it with the same resume step and data windows."""
    p0, p1 = Peers(tmp_path, 0, 2, answer_s=5, poll_s=0.05), Peers(tmp_path, 1, 2, answer_s=5, poll_s=0.05)
    assert p0.peer_fault(0) is None and p1.peer_fault(0) is None
    p1.report(0, _incident(evidence="incidents/1-node1"))
    assert p0.peer_fault(0)["observed_rank"] == 3 and p1.peer_fault(0) is None   # its own is not a peer's
    own = _incident(at=time.time() + 1, kind="stall", seen="rank 0: no log line", observed_rank=0, suspect=0)
    p0.report(0, own)
    mine: list[tuple[int, int]] = []
    node1: dict = {}
    t = threading.Thread(target=lambda: node1.update(got=p1.settle(0, _incident(kind="peer"), lambda i, c: "unused",
                                                                   lambda: None, mine)))
    t.start()   # node 1 says it stopped, then waits for node 0's decision
    windows: list[tuple[int, int]] = [(5, 6)]
    inc, ck = p0.settle(0, own, lambda i, c: f"relaunched with --resume from step {c}", lambda: 4, windows)
    t.join(10)
    assert (inc.kind, inc.suspect, inc.evidence, ck) == ("exit", 3, "incidents/1-node1", 4)
    assert inc.seen.startswith("node 1: rank 3") and inc.action == "relaunched with --resume from step 4"
    got, ck1 = node1["got"]
    assert (got.kind, got.suspect, got.action, ck1, mine) == ("exit", 3, inc.action, 4, [(5, 6)])


def test_a_supervisor_that_does_not_answer_stops_the_run_with_its_node(tmp_path):
    p0 = Peers(tmp_path, 0, 3, answer_s=0.3, poll_s=0.05)
    with pytest.raises(PeersError, match=r"node\(s\) \[1, 2\] did not answer"):
        p0.settle(0, _incident(), lambda i, c: "x", lambda: None, [])
    late = Peers(tmp_path / "none", 1, 2, answer_s=0.2, poll_s=0.05)
    with pytest.raises(PeersError, match="node 0's supervisor has not started"):
        late.report(0, _incident())
