"""Every msrun job kind starts through the one launcher (porting/launch/jobs.py ``MsrunJob``), and a Ctrl-C during
each leaves no process behind.

For each kind (training, the preflight's smoke all-reduce and smoke collectives, the rehearsal's collective timing)
the real entry point that starts it runs in a process of its own, with the kind's real worker script held at its
first line (a ``sitecustomize`` on PYTHONPATH that sleeps in the processes running that script, so the job is
caught while every one of its processes exists, whatever the machine's speed), then gets SIGINT as a Ctrl-C sends
it. Every process of the job (found by the driver's ``PORT_PARENT`` token in its environment: msrun, its scheduler,
the workers, wherever msrun moved them) must be gone within seconds, and the driver must end with 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from porting.launch.jobs import KINDS, WORKERS
from porting.train.run import lifeline
from tests.launch.test_lifeline import _gone_within, _of_run
from tests.train.conftest import TINY, free_port

ROOT = Path(__file__).resolve().parents[2]
HOLD = textwrap.dedent("""\
    import os, sys, time
    if sys.argv and os.path.basename(sys.argv[0]) == os.environ.get("PORT_TEST_HOLD_SCRIPT"):
        time.sleep(600)
""")
# kind -> (the script its workers run, the driver: the code that starts that kind in port)
DRIVERS = {
    "training": ("train.py", ["-m", "porting", "train", str(TINY), "--no-preflight", "--set",
                              "cluster.devices_per_node=2", "--set", "checkpointing.export_hf=false"]),
    "smoke all-reduce": ("smoke_allreduce.py", ["-c", "from porting.cluster.preflight import smoke_allreduce; "
                                                      "smoke_allreduce(2, {port}, timeout_s=300)"]),
    "smoke collectives": ("smoke_collectives.py", [
        "-c", "from porting.cluster.smoke_shape import smoke_at_shape; from porting.train.recipe.schema import "
              f"load_recipe; smoke_at_shape(load_recipe({str(TINY)!r}, ['cluster.devices_per_node=2', "
              "'cluster.master_port={port}']), 0, timeout_s=300)"]),
    "rehearsal collectives": ("collectives.py", [
        "-c", "from pathlib import Path; from porting.rehearse_compute import collectives; from porting.train.recipe"
              f".schema import load_recipe; out = Path({{out!r}}); (out / 'compute').mkdir(parents=True); "
              f"collectives(load_recipe({str(TINY)!r}, ['cluster.devices_per_node=2']), out, 300)"]),
}


def test_every_kind_has_a_driver_and_a_worker_script():
    assert set(DRIVERS) == set(KINDS)
    assert all((WORKERS / script).is_file() for script, _ in DRIVERS.values())


@pytest.mark.slow
@pytest.mark.msrun
@pytest.mark.parametrize("kind", KINDS)
def test_ctrl_c_during_each_kind_of_msrun_job_leaves_no_process(tmp_path, kind):
    script, args = DRIVERS[kind]
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HOLD)
    port = free_port()
    args = [a.format(port=port, out=str(tmp_path / "rehearse")) for a in args]
    if kind == "training":
        args += ["--run-dir", str(tmp_path / "run"), "--set", f"cluster.master_port={port}"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path / 'site'}", "PORT_TEST_HOLD_SCRIPT": script,
           "GLOG_v": "3"}
    p = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, process_group=0)
    tok = None
    try:
        deadline, held = time.monotonic() + 120, []
        while time.monotonic() < deadline:   # msrun, and each worker held in the kind's own script
            tok = tok or (lifeline.token(p.pid) if lifeline.start_time(p.pid) else None)
            held = [pid for pid in (_of_run(tok) if tok else []) if _runs(pid, script)]
            if len(held) >= 2:
                break
            assert p.poll() is None, f"{kind}: the driver ended early ({p.returncode}): {p.stderr.read()[-2000:]}"
            time.sleep(0.3)
        else:
            raise AssertionError(f"{kind}: its 2 workers never started {script}")
        procs = _of_run(tok)
        p.send_signal(signal.SIGINT)   # what a Ctrl-C sends the foreground process
        err = p.communicate(timeout=60)[1]
        # `port train` ends in one line with the shell's 130; a library call in `python -c` on the exception
        assert p.returncode == (130 if kind == "training" else 1), (kind, p.returncode, err[-2000:])
        assert "stopped by SIGINT" in err and "--resume" in err if kind == "training" else "Interrupted" in err, err[-2000:]
        assert _gone_within(procs, 15) == [], f"{kind}: still running: {_of_run(tok)}"
        assert _of_run(tok) == []
    finally:
        if p.poll() is None:
            p.kill()
        for pid in _of_run(tok) if tok else []:
            os.kill(pid, signal.SIGKILL)


def _runs(pid: int, script: str) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"/" + script.encode()) for a in argv[:3])
