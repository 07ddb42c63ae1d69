"""msrun's scheduler failing while its workers wait (porting/launch/scheduler.py): msrun itself looks at the scheduler
only once every worker has ended, so the workers would wait out the cluster timeout (600 s) in silence."""

from __future__ import annotations

import os
import socket
import time

import pytest

from porting.launch.proctable import process_table
from porting.launch.scheduler import SchedulerWatch, exit_status, reason
from tests.helpers import port_process
from tests.train.conftest import TINY


def test_an_uncollected_exit_is_read_with_its_code_and_a_live_or_collected_process_is_not(tmp_path):
    pid = os.fork()
    if pid == 0:   # the child: exits at once with 3; the parent does not collect it yet (a zombie, as under msrun)
        os._exit(3)
    try:
        deadline = time.monotonic() + 10
        while exit_status(pid) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert exit_status(pid) == 3
        assert exit_status(os.getpid()) is None        # running
    finally:
        os.waitpid(pid, 0)
    assert exit_status(pid) is None                     # collected: gone
    assert SchedulerWatch(os.getpid(), []).failed() is None   # this process has no msrun scheduler among its children


def test_the_reason_is_the_bind_failure_line_else_the_first_error(tmp_path):
    log = tmp_path / "scheduler.log"
    # the lines of a real scheduler.log (MindSpore 2.10.0, this machine, 2026-12-07), the pid and times as they were
    log.write_text(
        "[WARNING] DISTRIBUTED(739,7f0cb8a85b80,python):2026-12-07-19:43:03.390.157 [mindspore/ccsrc/cluster/rpc/tcp/"
        "socket_operation.cc:454] Listen] Failed to call bind, url: 127.0.0.1:8118 Address already in use\n"
        "[ERROR] DISTRIBUTED(739,7f0cb8a85b80,python):2026-12-07-19:43:03.390.208 [mindspore/ccsrc/cluster/topology/"
        "meta_server_node.cc:133] InitTCPServer] Failed to init the tcp server.\n")
    assert reason(log) == "Failed to call bind, url: 127.0.0.1:8118 Address already in use"
    log.write_text(log.read_text().splitlines()[1] + "\n")
    assert reason(log) == "Failed to init the tcp server."
    assert reason(tmp_path / "absent.log") == ""


@pytest.mark.msrun
@pytest.mark.slow
def test_a_scheduler_that_cannot_bind_its_port_ends_the_launch_in_seconds_not_at_the_cluster_timeout(tmp_path):
    # the master port taken after the preflight looked (here: before, with the check skipped), as another job on the
    # node can: msrun's scheduler fails to bind it and exits, and both workers would wait 600 s to join it
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    run = tmp_path / "run"
    try:
        t0 = time.monotonic()
        r = port_process("train", str(TINY), "--no-preflight", "--run-dir", str(run), "--set",
                         "cluster.devices_per_node=2", "--set", f"cluster.master_port={port}", timeout=300)
        took = time.monotonic() - t0
    finally:
        held.close()
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and last.startswith("error: msrun's scheduler"), r.stderr[-3000:]
    assert f"the master port {port} is in use on this host" in last and "set cluster.master_port" in last, last
    assert str(run / "logs" / "msrun" / "scheduler.log") in last
    assert took < 240, took    # the cluster timeout is 600 s: stopped by the watch, not by the timeout
    left = [pid for pid, (_, argv, _) in process_table().items() if any(str(run) in a for a in argv)]
    assert not left, f"processes of the launch outlived it: {left}"
