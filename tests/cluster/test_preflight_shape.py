"""The preflight at the run's real shape: two node ranks on loopback, 2 workers each,
TP 2 x DP 2; every node joins one msrun job of 4 workers that creates the TP and DP groups and runs
and times the collectives on each (porting/cluster/smoke_shape.py). A recipe that differs between the
nodes (node 1 without tensor parallel) is stopped before step 1, naming the node, group and collective."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from porting.cluster.preflight import free_port, run_train_preflight
from porting.train.recipe.schema import load_recipe
from tests.train.conftest import ROOT

pytestmark = [pytest.mark.msrun, pytest.mark.slow]


def _both_nodes(tmp_path: Path, node1_extra: list[str]) -> dict[int, dict]:
    port = free_port()
    sets = ["cluster.nodes=2", "cluster.devices_per_node=2", "parallel.tensor_parallel=2",
            "cluster.master_addr=127.0.0.1", f"cluster.master_port={port}", "cluster.cluster_time_out=60"]
    recipes = {0: load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", sets, check_files=False),
               1: load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", sets + node1_extra, check_files=False)}
    out: dict[int, dict] = {}

    def node(n: int) -> None:   # what `port train --launch-node n` runs first on node n
        out[n] = run_train_preflight(recipes[n], tmp_path / "run", n, smoke=True)

    threads = [threading.Thread(target=node, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=400)
    return out


def _smoke(rep: dict) -> dict:
    return next(r for r in rep["checks"] if r["check"] == "smoke collectives")


def test_every_node_runs_each_groups_collectives_at_the_real_shape(tmp_path):
    reps = _both_nodes(tmp_path, [])
    for node in (0, 1):
        assert reps[node]["ok"], reps[node]
        row = _smoke(reps[node])
        assert f"node {node} of 4 worker(s), 2 node(s), TP 2 x DP 2" in row["detail"]
        times = row["collectives"]
        # the CPU runs AllReduce everywhere, AllGather natively on the world group, and zero.py's emulations
        for group in ("world", "tp", "dp"):
            assert times[f"{group} AllReduce"] > 0
            assert times[f"{group} ReduceScatter (AllReduce + slice)"] > 0
        assert times["world AllGather"] > 0
        assert times["tp AllGather (AllReduce of zero-padded)"] > 0 and times["dp AllGather (AllReduce of zero-padded)"] > 0


def test_a_node_that_does_not_join_the_groups_is_named_before_step_1(tmp_path):
    reps = _both_nodes(tmp_path, ["parallel.tensor_parallel=1"])
    assert not reps[0]["ok"]
    detail = _smoke(reps[0])["detail"]
    # rank 0's data-parallel group spans both nodes; node 1 never joined it
    assert "node 0, rank 0: group dp_0 (ranks 0,2, node(s) 0, 1) AllReduce" in detail, detail
