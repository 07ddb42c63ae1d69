"""Starting a multi-device run: this node's `msrun` command (the one ``--dry-run`` prints,
:func:`porting.train.plan.launch.msrun_commands`) in a subprocess with the plan's HCCL environment, or every
node's command printed for a multi-node recipe."""

from __future__ import annotations

import ipaddress
import os
import shlex
import signal
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import click
import yaml

from model_zoo.errors import PortingError, RecipeError
from model_zoo.files import write_atomic
from porting.train.data import token_file
from porting.train.plan.launch import msrun_commands
from porting.train.run import lifeline
from porting.train.run.checkpoint import interrupted_saves
from porting.train.run.nonfinite import log_sizes, stop_line
from porting.train.recipe.schema import Recipe, recipe_dict


def launch_msrun(rec: Recipe, recipe_path: str, overrides: list[str], out: Path, resume: bool,
                 launch_node: int | None, plan_env: dict | None = None,
                 stop: Callable[[subprocess.Popen, float], None] | None = None) -> None:
    """Run this node's msrun (or print every node's command when a multi-node recipe names no node).
    msrun and its workers die with this process (porting/train/run/lifeline.py); ``stop`` tears them down
    on SIGINT/SIGTERM."""
    if shutil.which("msrun") is None:
        raise PortingError("msrun not found on PATH; it comes with MindSpore (pip install mindspore) - "
                           "activate the environment that has it")
    # The launched command is exactly the one --dry-run prints; the resolved recipe is kept for the record.
    write_atomic(out / "recipe.yaml", yaml.safe_dump(recipe_dict(rec), sort_keys=False), error=RecipeError)
    cmds = msrun_commands(rec, recipe_path, str(out), overrides, resume)
    if rec.cluster.nodes > 1 and launch_node is None:
        click.echo(f"{rec.cluster.nodes} nodes: run on each node (same paths on every node):")
        for i, c in enumerate(cmds):
            click.echo(f"node {i}: {c}")
        return
    node = launch_node or 0
    argv, env = msrun_argv_env(rec, cmds, node, plan_env)
    env.update(token_file.for_workers(rec, out, node))   # tokenised here once, not once per worker
    click.echo(f"launching: {cmds[node]}", err=True)
    before = log_sizes(out / "logs")
    saves = set(interrupted_saves(out / "checkpoints"))
    rc = lifeline.run_msrun(argv, env, stop or _stop_group)
    per = rec.cluster.devices_per_node
    if rc != 0 and lifeline.all_finished(out / "logs", before, range(node * per, (node + 1) * per)):
        click.echo(f"warning: msrun exited with {rc} after every rank of this node had logged the end of its run "
                   f"(a worker crashed at exit, in MindSpore's teardown; {out}/logs/msrun/worker_*.log); the run's "
                   "files are complete", err=True)
        rc = 0
    if rc != 0:
        if node == 0:   # this launch's own half-written saves (a disk that filled, a rank msrun killed mid-save);
            # never an .old_step_* one: that is the previous copy of a step, moved aside by files.swap_in
            for p in set(interrupted_saves(out / "checkpoints")) - saves:
                if p.name.startswith(".tmp_step_"):
                    shutil.rmtree(p, ignore_errors=True)
        stopped = stop_line(out / "logs", before)   # the workers' own reason, when they stopped past the non-finite caps
        if stopped is not None:
            raise PortingError(f"msrun exited with {rc}: {stopped[0]}")
        raise PortingError(f"msrun exited with {rc}; see {out}/logs/rank_*.log and {out}/logs/msrun/worker_*.log "
                           "(scheduler.log names ranks that timed out)")
    click.echo(f"done: {rec.world_size} workers; run directory {out}")
    if node == 0:   # the HF export, now that no worker holds memory or waits in a collective
        from porting.train.run.export import export_after_exit  # deferred: loads MindSpore's readers

        export_after_exit(rec, out, log=click.echo)


def msrun_argv_env(rec: Recipe, cmds: list[str], node: int, plan_env: dict | None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of node ``node``'s msrun command (``cmds``: the plan's commands)."""
    if not 0 <= node < len(cmds):
        raise RecipeError(f"--launch-node {node}: the recipe has nodes 0..{len(cmds) - 1}")
    argv = same_host_node_argv(shlex.split(cmds[node]), node, rec.cluster)
    env = dict(os.environ)
    env.update({k: v for k, v in (plan_env or {}).items() if k not in os.environ})   # the plan's HCCL timeouts; the user's win
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # msrun starts the `python` found on PATH: put this interpreter's directory first.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env[lifeline.ENV] = lifeline.token()   # the workers exit by themselves once this process is gone
    return argv, env


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """Without the caller's teardown: msrun's own process group, SIGTERM then SIGKILL (the workers, in
    sessions of their own, then exit through their lifeline)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace_s)
            return
        except (ProcessLookupError, PermissionError):
            return
        except subprocess.TimeoutExpired:
            continue


def same_host_node_argv(argv: list[str], node: int, cluster) -> list[str]:
    """Node ranks > 0 started on the master's own machine (a loopback master_addr: a one-machine test
    of a multi-node plan). msrun starts a scheduler on every node whose master_addr is local, so the
    second one cannot bind the port and, with --join=True, takes its node down. Here node N waits for
    node 0's scheduler to listen and runs with --join=False, which leaves the failed extra scheduler
    unwatched; its workers join node 0's scheduler. Other launches are returned unchanged."""
    try:
        loopback = ipaddress.ip_address(cluster.master_addr).is_loopback
    except ValueError:
        loopback = cluster.master_addr == "localhost"
    if node == 0 or not loopback:
        return argv
    deadline = time.monotonic() + cluster.cluster_time_out
    while time.monotonic() < deadline:
        try:
            socket.create_connection((cluster.master_addr, cluster.master_port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    return ["--join=False" if a == "--join=True" else a for a in argv]
