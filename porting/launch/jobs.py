"""The one launcher of every msrun job port starts: :class:`MsrunJob`.

Four kinds run under msrun: a training run (porting/train/run/worker.py), the preflight's smoke all-reduce and
smoke collectives, and the rehearsal's collective timing (porting/launch/workers/). Each is an
:class:`~porting.train.plan.launch.MsrunSpec` (its argv built by the one builder, ``msrun_argv``) run here the same
way: the child environment from :func:`porting.launch.children.child_env` (the workers exit once port is gone,
``PORT_PARENT``), msrun under the lifeline (its own session, a parent-death signal, SIGINT/SIGTERM tear the group
down: porting/launch/lifeline.py), a deadline after which the group is stopped, and one result, :class:`Ended`.
What a training launch came to is then decided by ``porting.launch.outcome.launch_outcome`` (its rank logs), a
smoke's by its worker logs (porting/cluster/).

A node rank > 0 on the loopback master's own machine (a one-machine test of a multi-node shape): msrun starts a
scheduler on every node whose master address is local, so the second one cannot bind the port and, with
``--join=True``, takes its node down. That node waits for node 0's scheduler to listen and runs with
``--join=False``; the lifeline then adopts its workers and waits for them (``run_msrun``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from model_zoo.errors import PortingError
from porting.launch import lifeline
from porting.launch.children import child_env, find_msrun
from porting.train.plan.launch import MsrunSpec, msrun_argv

KINDS = ("training", "smoke all-reduce", "smoke collectives", "rehearsal collectives")
WORKERS = Path(__file__).with_name("workers")   # the entry scripts of the non-training kinds (and the training one)


class MsrunNotFound(PortingError):
    """No msrun where a launched child would look for it."""


@dataclass(frozen=True)
class Ended:
    """How an msrun job ended: its exit code (None: stopped at its deadline), and the seconds it ran."""

    code: int | None
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.code is None


@dataclass(frozen=True)
class MsrunJob:
    kind: str
    spec: MsrunSpec
    env: Mapping[str, str]

    @classmethod
    def make(cls, kind: str, spec: MsrunSpec, defaults: Mapping[str, str] | None = None,
             overrides: Mapping[str, str] | None = None) -> MsrunJob:
        """A job of ``kind`` with the child environment: ``defaults`` where the user set nothing (the plan's HCCL
        timeouts), ``overrides`` on top (a token file, a smoke's short timeouts, a shrink's devices)."""
        if kind not in KINDS:
            raise ValueError(f"unknown msrun job kind {kind!r}")
        return cls(kind, spec, child_env(defaults, overrides, parent=True))

    def with_env(self, extra: Mapping[str, str]) -> MsrunJob:
        return dataclasses.replace(self, env={**self.env, **extra})

    def argv(self) -> list[str]:
        """The argv msrun is started with (its full path; ``--join=False`` for a same-host node rank > 0)."""
        msrun = find_msrun()   # where the launched child looks: its environment's PATH (child_env)
        if msrun is None:
            raise MsrunNotFound("msrun not found on PATH or beside this python; it comes with MindSpore (pip install "
                                "mindspore) - activate the environment that has it")
        return same_host_node_argv(msrun_argv(self.spec, msrun), self.spec)

    def run(self, timeout_s: float | None = None, output: Path | None = None) -> Ended:
        """Run the job to its end under the lifeline (``output``: where msrun's own output goes, else the terminal);
        stopped with everything it started at ``timeout_s``, on SIGINT/SIGTERM (``lifeline.Interrupted``)."""
        argv, t0 = self.argv(), time.monotonic()
        if output is None:
            return Ended(lifeline.run_msrun(argv, self.env, timeout_s=timeout_s), round(time.monotonic() - t0, 3))
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "ab") as sink:
            code = lifeline.run_msrun(argv, self.env, timeout_s=timeout_s, output=sink)
        return Ended(code, round(time.monotonic() - t0, 3))

    def popen(self, output: Path) -> subprocess.Popen:
        """Start the job for a watcher that polls it (`port train --supervise`): in a session of its own, dying with
        this process; a same-host node rank > 0 through ``porting.launch.detached``, one process that ends when
        the node's workers end. The caller stops it with ``children.stop_group``."""
        argv = self.argv()
        if "--join=False" in argv:
            argv = [sys.executable, "-m", "porting.launch.detached", *argv]
        with open(output, "ab") as sink:
            return lifeline.start(argv, self.env, sink)


def same_host_node_argv(argv: list[str], spec: MsrunSpec) -> list[str]:
    """``argv`` for node ``spec.node_rank`` > 0 started on a loopback master's machine (module docstring): wait for
    node 0's scheduler to listen, then ``--join=False``; other launches unchanged."""
    addr = spec.master_addr or "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(addr).is_loopback
    except ValueError:
        loopback = addr == "localhost"
    if not spec.node_rank or not loopback:
        return argv
    deadline = time.monotonic() + (spec.cluster_time_out or 600)
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, spec.master_port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    return ["--join=False" if a == "--join=True" else a for a in argv]
