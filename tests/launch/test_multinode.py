"""Two node ranks: the plan of `port train --launch-node N` for two nodes of 2 workers each.

The run itself (two `port train --launch-node N` on this machine, loopback master, one shared run
directory, every step equal to one node of the same layout) is the two-nodes rung of
tests/test_rehearse.py::test_13b_shape_tp2_dp2_zero_two_node_ranks_pass_and_agree, which launches each node
with that command."""

from __future__ import annotations

import json

from tests.helpers import port
from tests.train.conftest import TINY, free_port

COMMON = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "batching.micro_batch_size=1",
          "schedule.max_steps=2", "checkpointing.every_steps=0", "cluster.master_addr=127.0.0.1"]


def _args(extra: list[str]) -> list[str]:
    return [a for s in COMMON + extra for a in ("--set", s)]


def test_two_node_plan_has_one_msrun_command_per_node_and_the_same_hccl_timeouts():
    args = _args(["cluster.nodes=2", "cluster.devices_per_node=2", f"cluster.master_port={free_port()}"])
    plan = json.loads(port("train", str(TINY), "--dry-run", "--json", *args, check=True).stdout)
    cmds = plan["msrun_commands"]
    assert [f"--node_rank={n}" in c for n, c in enumerate(cmds)] == [True, True]
    assert all("--worker_num=4" in c and "--local_worker_num=2" in c for c in cmds), cmds
    env = plan["launch"]["env"]
    assert int(env["HCCL_EXEC_TIMEOUT"]) >= 1836 and int(env["HCCL_CONNECT_TIMEOUT"]) >= 600
    assert "HCCL_EXEC_TIMEOUT" in plan["launch"]["same_on_every_node"]
