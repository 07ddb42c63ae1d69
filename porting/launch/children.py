"""The processes `port` starts: the one builder of their environment and the one teardown of their group.

Every process port starts (msrun, the one-device `port train` under a supervisor, the device probe, a
rehearsal's rungs, the preflight's smoke jobs) gets its environment from :func:`child_env`, and every process
group port started is stopped by :func:`stop_group` (one signal to a group: :func:`signal_group`).
tests/test_house_rules.py finds a second builder (``dict(os.environ ...)``, ``os.environ.copy()``) or a second
``os.killpg`` anywhere else in ``porting/``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from porting.launch.proctable import alive, descendants
from porting.train.run import lifeline as worker_side

ROOT = Path(__file__).resolve().parents[2]   # the checkout that holds porting/, converters/, model_zoo/


def find_msrun() -> str | None:
    """msrun as a child started with :func:`child_env` finds it: this interpreter's directory first, then ``PATH``
    (a virtual environment used without activating it has msrun beside its python); None where there is none."""
    return shutil.which("msrun", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))


def child_env(defaults: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None, *,
              parent: bool = False) -> dict[str, str]:
    """The user's environment for a child, with:

    - ``defaults`` where the user set nothing (the plan's HCCL timeouts: the user's own values win);
    - this checkout first on ``PYTHONPATH``, the user's ``PYTHONPATH`` after it (a plugin, a site package);
    - this interpreter's directory first on ``PATH`` (msrun starts the ``python`` it finds there);
    - ``overrides`` on top (the data's token file, ``ASCEND_RT_VISIBLE_DEVICES`` after a shrink);
    - with ``parent``, ``PORT_PARENT``: the child exits once this process is gone (porting/train/run/lifeline.py).
    """
    env = dict(os.environ)
    env.update({k: v for k, v in (defaults or {}).items() if k not in os.environ})
    user = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + user if user else "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    env.update(overrides or {})
    if parent:
        env[worker_side.ENV] = worker_side.token()
    return env


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid`` (one port started in a session of its own); False when it is gone
    or not this user's."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_group(proc: subprocess.Popen, grace_s: float, *, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL),
               descendants_too: bool = True) -> None:
    """Stop what this process started as ``proc`` (``start_new_session=True``): its process group and, with
    ``descendants_too``, every descendant of it that left the group (msrun puts each worker in a session of its
    own), with ``signals`` in turn, each followed by up to ``grace_s`` for them to go. Nothing else is signalled."""
    pids = descendants(proc.pid) if descendants_too else []
    for sig in signals:
        signal_group(proc.pid, sig)
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=grace_s)
            if not any(alive(p) for p in pids):
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.2)
