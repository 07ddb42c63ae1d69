"""The one builder of a child's environment and the one teardown of a process group
(porting/launch/children.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from porting.launch.children import ROOT, child_env, stop_group
from porting.launch.proctable import alive, descendants
from porting.train.run import lifeline


def test_the_child_keeps_the_users_pythonpath_after_this_checkout(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/plugins")
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "999")
    env = child_env({"HCCL_EXEC_TIMEOUT": "1836", "HCCL_CONNECT_TIMEOUT": "600"}, {"PORT_DATA_TOKENS": "x"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/opt/plugins"]
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)   # msrun starts this python
    assert env["HCCL_EXEC_TIMEOUT"] == "999" and env["HCCL_CONNECT_TIMEOUT"] == "600"   # the user's value wins
    assert env["PORT_DATA_TOKENS"] == "x" and lifeline.ENV not in env
    monkeypatch.delenv("PYTHONPATH")
    env = child_env(parent=True)
    assert env["PYTHONPATH"] == str(ROOT) and lifeline.alive(env[lifeline.ENV])   # PORT_PARENT names this process
    assert "PYTHONPATH" not in os.environ                                          # the parent's own is untouched


def test_a_child_started_with_it_imports_port_and_a_users_module(tmp_path, monkeypatch):
    (tmp_path / "users_plugin.py").write_text("VALUE = 41\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "import porting.launch, users_plugin; print(users_plugin.VALUE + 1)"],
                         cwd="/", env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr[-2000:]


def test_stop_group_stops_the_group_and_a_descendant_in_its_own_session_and_nothing_else():
    """The shape of msrun: a leader and a worker that left its group (setsid); a bystander is not signalled."""
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)
    leader = subprocess.Popen(["sh", "-c", "setsid sleep 120 & sleep 120 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not _left_the_group(leader.pid):   # one left the group, as msrun's workers do
            assert time.monotonic() < deadline, descendants(leader.pid)
            time.sleep(0.05)
        kids = descendants(leader.pid)
        stop_group(leader, 5.0)
        assert leader.returncode is not None and not any(alive(k) for k in kids)
        assert bystander.poll() is None
    finally:
        for p in (bystander, leader):
            if p.poll() is None:
                p.kill()
            p.wait()


def _left_the_group(pid: int) -> bool:
    """Two descendants of ``pid`` run, and one of them is in a process group of its own."""
    kids = descendants(pid)
    try:
        return len(kids) >= 2 and any(os.getpgid(k) != pid for k in kids)
    except ProcessLookupError:
        return False


def test_stop_group_escalates_to_sigkill():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert stubborn.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    stop_group(stubborn, 1.0)
    assert stubborn.returncode == -signal.SIGKILL and time.monotonic() - t0 < 10


def test_msrun_is_found_beside_this_python_when_the_environment_is_not_activated(monkeypatch, tmp_path):
    """A virtual environment used as `.venv/bin/port` without `activate`: msrun sits beside its python, not on
    PATH. The launch looks where the launched child will (child_env puts this interpreter's folder first)."""
    import shutil
    from pathlib import Path

    from porting.launch.children import find_msrun

    beside = Path(sys.executable).parent / "msrun"
    if not beside.is_file():
        pytest.skip(f"no msrun beside {sys.executable} (MindSpore installed elsewhere)")
    monkeypatch.setenv("PATH", str(tmp_path))   # nothing there
    assert shutil.which("msrun") is None and find_msrun() == str(beside)
    assert child_env()["PATH"].split(os.pathsep)[0] == str(beside.parent)
