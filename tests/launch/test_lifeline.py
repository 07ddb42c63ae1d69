"""The processes `port train` starts die with it (porting/launch/lifeline.py, the worker's side in
porting/train/run/lifeline.py).

Fast tests: the start-time token, a watcher that exits its process once the watched one is gone (also
after ``kill -9``), a parent-death signal. Under real msrun (slow): ``kill -9`` of a 2-worker `port train`,
``kill -9`` of its whole process group, and SIGTERM, each leave no process of that run alive within a few
seconds; SIGTERM signals nothing port did not start (a bystander in port's own process group lives on).
Slow too: ``kill -9`` of `port train --supervise` ends its one-device child.
A process "of the run" is found by its environment (``PORT_PARENT`` with port's token), so a worker that
msrun moved to a session of its own, or that was re-parented, is still counted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porting.rundir import ranklog
from porting.train.run import lifeline
from tests.train.conftest import TINY, free_port

ROOT = Path(__file__).resolve().parents[2]
PY = [sys.executable, "-c"]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", **extra}


def _proc_state(pid: int) -> str:
    """What /proc says of ``pid`` (its state and the signals it ignores), for a failure message."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return f"{pid}: gone"
    return f"{pid}: " + "; ".join(ln for ln in lines if ln.startswith(("State:", "SigIgn:", "PPid:")))


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still running (not zombies) after waiting up to ``seconds`` (generous: the suite runs four
    workers on 2 cores; a pass returns at once)."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in pids if lifeline.start_time(p) is not None]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------- fast
def test_token_names_a_live_process_and_not_a_reused_pid():
    tok = lifeline.token()
    assert lifeline.alive(tok)
    pid, _, start = tok.partition(":")
    assert not lifeline.alive(f"{pid}:{int(start) + 1}")      # same pid, another start time: another process
    p = subprocess.Popen(["true"])
    p.wait()
    assert not lifeline.alive(lifeline.token(p.pid))          # reaped: gone
    assert not lifeline.alive("garbage") and not lifeline.alive(":")


def test_watcher_exits_its_process_when_the_watched_one_is_killed_9(tmp_path):
    """A "port" process starts a child that watches it; kill -9 of the port process ends the child."""
    child = ("import time; from porting.train.run.lifeline import watch_parent; watch_parent(poll_s=0.1); "
             "print('watching', flush=True); time.sleep(120)")
    parent_code = ("import os, subprocess, sys, time; from porting.train.run import lifeline; "
                   f"c = subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True, "
                   "env=dict(os.environ, PORT_PARENT=lifeline.token()), stderr=open(sys.argv[1], 'w'), "
                   # not the parent's stdout: on a loaded machine the child's line came first (a CI run's failure)
                   "stdout=subprocess.DEVNULL); "
                   "print(c.pid, flush=True); time.sleep(120)")
    parent = subprocess.Popen(PY + [parent_code, str(tmp_path / "child.err")], stdout=subprocess.PIPE, text=True,
                              env=_env())
    child_pid = int(parent.stdout.readline())
    time.sleep(0.5)
    assert lifeline.start_time(child_pid) is not None
    parent.kill()
    parent.wait()
    assert _gone_within([child_pid], 30) == []
    assert f"port (pid {parent.pid}) is gone" in (tmp_path / "child.err").read_text()


def test_a_worker_whose_port_is_already_gone_does_not_start():
    dead = subprocess.Popen(["true"])
    dead.wait()
    p = subprocess.run(PY + ["from porting.train.run.lifeline import watch_parent; watch_parent(); print('ran')"],
                       env=_env(PORT_PARENT=f"{dead.pid}:1"), capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "ran" not in p.stdout and "is gone" in p.stderr


def test_without_port_parent_nothing_is_watched():
    env = _env()
    env.pop("PORT_PARENT", None)
    p = subprocess.run(PY + ["from porting.train.run.lifeline import watch_parent; print(watch_parent())"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == "None"


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_parent_death_signal_reaches_a_grandchild_in_its_own_session(sigint):
    """The shape of port -> msrun: msrun in a new session with PDEATHSIG; its parent killed with -9. "ignored": port
    started as `nohup port train ... &` is (a background job ignores SIGINT), which its children inherit (found when
    CI was started that way: the sleeper outlived its parent with SigIgn 7)."""
    code = ("import signal, subprocess, sys, time; from porting.launch import lifeline; import os; "
            "c = subprocess.Popen(['sleep', '120'], start_new_session=True, preexec_fn=lifeline._die_with(os.getpid())); "
            "print(c.pid, flush=True); time.sleep(120)")
    ign = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" else None
    parent = subprocess.Popen(PY + [code], stdout=subprocess.PIPE, text=True, env=_env(), preexec_fn=ign)
    sleeper = int(parent.stdout.readline())
    assert lifeline.start_time(sleeper) is not None
    parent.kill()
    parent.wait()
    assert _gone_within([sleeper], 30) == [], _proc_state(sleeper)   # dies of the SIGINT the kernel sent


def test_ctrl_c_stops_the_launched_group_and_exits_130(tmp_path):
    """run_msrun's teardown on SIGINT, on a stand-in launch (``sleep`` and its child in one session)."""
    code = ("import subprocess, sys; from model_zoo.errors import PortingError; "
            "from porting.launch.children import stop_group; from porting.launch import lifeline\n"
            "try:\n    lifeline.run_msrun(['sh', '-c', 'sleep 300 & echo $! > ' + sys.argv[1] + '; wait'], {}, stop_group)\n"
            "except PortingError as e:\n    print('error:', e, file=sys.stderr); sys.exit(e.exit_code)")
    pidfile = tmp_path / "sleep.pid"
    p = subprocess.Popen(PY + [code, str(pidfile)], env=_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (pidfile.is_file() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = int(pidfile.read_text())
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=30)[1]
    assert p.returncode == 130 and "stopped by SIGINT" in err and "Traceback" not in err, err
    assert _gone_within([child], 30) == []


def test_ctrl_c_while_msrun_is_being_started_still_stops_what_started(tmp_path):
    """A SIGINT that lands inside ``subprocess.Popen`` (its child already forked, Popen not yet returned: one CI run
    sent it there under load) is noted and acted on once msrun has a pid: the stand-in's child is stopped and the
    launch exits 130. The signal is sent from Popen's own ``_execute_child``, right after the child exists."""
    code = ("import os, signal, subprocess, sys; from model_zoo.errors import PortingError; "
            "from porting.launch.children import stop_group; from porting.launch import lifeline\n"
            "class Started(subprocess.Popen):\n"
            "    def _execute_child(self, *a, **k):\n"
            "        super()._execute_child(*a, **k)\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "subprocess.Popen = Started\n"
            "try:\n    lifeline.run_msrun(['sh', '-c', 'sleep 300 & echo $! > ' + sys.argv[1] + '; wait'], {}, stop_group)\n"
            "except PortingError as e:\n    print('error:', e, file=sys.stderr); sys.exit(e.exit_code)")
    pidfile = tmp_path / "sleep.pid"
    p = subprocess.Popen(PY + [code, str(pidfile)], env=_env(), stderr=subprocess.PIPE, text=True)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 130 and "stopped by SIGINT" in err and "Traceback" not in err, err
    deadline = time.monotonic() + 5   # the shell may have been stopped before it wrote its child's pid
    while not (pidfile.is_file() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pidfile.is_file() and pidfile.read_text().strip():
        assert _gone_within([int(pidfile.read_text())], 30) == []


# ------------------------------------------------------------------------------------------- msrun
def _of_run(tok: str) -> list[int]:
    """Every live process whose environment carries this port's token (msrun, scheduler, workers)."""
    needle = f"{lifeline.ENV}={tok}".encode() + b"\0"
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes() + b"\0" and lifeline.start_time(int(d.name)):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def _start_training(run: Path, model_dir: Path, **popen) -> tuple[subprocess.Popen, str, list[int]]:
    """A 2-worker `port train` in a process group of its own, returned once both workers are training (on one
    layer of stories260K, tests/conftest.py model_dir: the launch is the subject, not the depth; each of the five
    layers' graphs compiled on both workers before step 2, and a killed run's CPU is not in the suite's CPU log)."""
    args = ["--set", "cluster.devices_per_node=2", "--set", f"model.source={model_dir}",
            "--set", "schedule.max_steps=400", "--set", "logging.every_steps=1",
            "--set", f"cluster.master_port={free_port()}", "--set", "checkpointing.export_hf=false"]
    p = subprocess.Popen([sys.executable, "-m", "porting", "train", str(TINY), "--run-dir", str(run), *args],
                         cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         process_group=0, **popen)
    tok = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        tok = tok or (lifeline.token(p.pid) if lifeline.start_time(p.pid) else None)
        log = run / "logs" / "rank_0.log"
        if log.is_file() and any(s.step >= 2 for s in ranklog.read_steps(log.read_text(errors="replace"))):
            break
        assert p.poll() is None, f"port train ended early ({p.returncode}): {p.stderr.read()[-2000:]}"
        time.sleep(0.5)
    else:
        raise AssertionError("the workers did not reach step 2 within 240 s")
    procs = _of_run(tok)
    assert len(procs) >= 4, f"expected msrun, its scheduler and 2 workers, found {procs}"   # the check can fail
    return p, tok, procs


@pytest.mark.slow
@pytest.mark.msrun
@pytest.mark.parametrize("how", ["kill -9 port", "kill -9 its process group"])
def test_kill_9_of_a_2_worker_train_leaves_no_process_of_the_run(tmp_path, how, model_dir):
    p, tok, procs = _start_training(tmp_path / "run", model_dir)
    if how == "kill -9 port":
        p.kill()
    else:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert _gone_within(procs, 10) == [], f"{how}: still running: {_of_run(tok)}"
    assert _of_run(tok) == []
    steps = (tmp_path / "run" / "metrics.jsonl").read_text().count('"step"')
    time.sleep(2)
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count('"step"') == steps   # nothing trains on


@pytest.mark.slow
@pytest.mark.msrun
def test_sigterm_stops_the_run_in_one_line_and_signals_nothing_else(tmp_path, model_dir):
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        p, tok, procs = _start_training(tmp_path / "run", model_dir)
        # a process port did not start, in port's own process group: port must not signal it
        other = subprocess.Popen(["sleep", "300"], process_group=p.pid)
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=60)[1]
        assert p.returncode == 143, err[-2000:]
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "stopped by SIGTERM" in errors[0] and "--resume" in errors[0], err[-2000:]
        assert "Traceback" not in err
        assert _gone_within(procs, 10) == [] and _of_run(tok) == []
        assert other.poll() is None and bystander.poll() is None
    finally:
        for q in (bystander, locals().get("other")):
            if q is not None:
                q.kill()
                q.wait()


@pytest.mark.slow
def test_kill_9_of_a_supervisor_ends_its_one_device_run(tmp_path, model_dir):
    """`port train --supervise` on one device runs `port train` as a child: it ends with its supervisor."""
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "porting", "train", str(TINY), "--run-dir", str(run), "--supervise",
                          "--no-preflight", "--set", "schedule.max_steps=400", "--set", "logging.every_steps=1",
                          "--set", "checkpointing.export_hf=false", "--set", f"model.source={model_dir}"],
                         cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    tok = lifeline.token(p.pid)
    deadline = time.monotonic() + 180
    log = run / "logs" / "rank_0.log"
    while not (log.is_file() and any(s.step >= 2 for s in ranklog.read_steps(log.read_text(errors="replace")))):
        assert time.monotonic() < deadline and p.poll() is None, "the supervised run did not reach step 2"
        time.sleep(0.5)
    procs = _of_run(tok)
    assert procs, "the supervised child carries the supervisor's token"
    p.kill()
    p.wait()
    assert _gone_within(procs, 10) == [], _of_run(tok)


@pytest.mark.slow
@pytest.mark.msrun
def test_a_worker_that_crashes_after_its_run_ended_does_not_fail_the_launch(tmp_path, model_dir):
    """MindSpore's teardown at exit sometimes segfaults a worker whose run has ended (seen twice in the suite);
    msrun then exits 1. A real SIGSEGV of rank 1 after its run (the worker's test hook): `port train` says so
    in one warning and exits 0, and the run's files are complete."""
    run = tmp_path / "run"
    sets = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
            "cluster.devices_per_node=2", "schedule.max_steps=2", "checkpointing.every_steps=2", f"model.source={model_dir}",
            f"cluster.master_port={free_port()}"]
    p = subprocess.run([sys.executable, "-m", "porting", "train", str(TINY), "--run-dir", str(run),
                        *[a for s in sets for a in ("--set", s)]], cwd=ROOT, env=_env(PORT_TEST_CRASH_AT_EXIT="1"),
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Error code: -11" in p.stdout + p.stderr   # msrun saw the crash
    warn = [ln for ln in p.stderr.splitlines() if ln.startswith("warning: msrun exited with")]
    assert len(warn) == 1 and "after every rank of this node had logged the end of its run" in warn[0], p.stderr[-2000:]
    assert (run / "checkpoints" / "step_2" / "state.json").is_file()
    assert '"event": "summary"' in (run / "metrics.jsonl").read_text()
