"""Starting a multi-device run: this node's `msrun` command (the one ``--dry-run`` prints,
:func:`porting.train.plan.launch.msrun_commands`) in a subprocess with the plan's HCCL environment, or every
node's command printed for a multi-node recipe."""

from __future__ import annotations

import ipaddress
import os
import shlex
import socket
import time
from pathlib import Path

import click
import yaml

from model_zoo.errors import PortingError, RecipeError
from model_zoo.files import write_atomic
from porting.launch import lifeline
from porting.launch.children import child_env, find_msrun
from porting.launch.outcome import after_finished, launch_outcome, mark
from porting.train.data import token_cache
from porting.train.plan.launch import msrun_commands
from porting.train.recipe.schema import Recipe, recipe_dict


def launch_msrun(rec: Recipe, recipe_path: str, overrides: list[str], out: Path, resume: bool,
                 launch_node: int | None, plan_env: dict | None = None) -> None:
    """Run this node's msrun (or print every node's command when a multi-node recipe names no node).
    msrun and its workers die with this process (porting/launch/lifeline.py)."""
    if find_msrun() is None:   # where the launched msrun is looked for: its environment's PATH (child_env)
        raise PortingError("msrun not found on PATH or beside this python; it comes with MindSpore (pip install "
                           "mindspore) - activate the environment that has it")
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
    env.update(token_cache.for_workers(rec, out, node))   # tokenised here once, not once per worker
    click.echo(f"launching: {cmds[node]}", err=True)
    before = mark(out)
    rc = lifeline.run_msrun(argv, env)
    done = launch_outcome(out, before, rc, node_ranks(rec, node), clean=node == 0)
    if done.crashed_at_exit:
        click.echo(f"warning: msrun exited with {rc} after every rank of this node had logged the end of its run "
                   f"(a worker crashed at exit, in MindSpore's teardown; {out}/logs/msrun/worker_*.log); the run's "
                   "files are complete", err=True)
    if not done.finished:
        if done.stop is not None:   # the workers' own reason, when they stopped past the non-finite caps
            raise PortingError(f"msrun exited with {rc}: {done.stop[0]}")
        raise PortingError(f"msrun exited with {rc}; see {out}/logs/rank_*.log and {out}/logs/msrun/worker_*.log "
                           "(scheduler.log names ranks that timed out)")
    click.echo(f"done: {rec.world_size} workers; run directory {out}")
    after_finished(rec, out, node, click.echo)


def node_ranks(rec: Recipe, node: int) -> list[int]:
    """The global ranks node ``node`` runs."""
    per = rec.cluster.devices_per_node
    return list(range(node * per, (node + 1) * per))


def launch_devices(recipe: Recipe) -> list[int] | None:
    """The NPUs this node's job opens: ASCEND_RT_VISIBLE_DEVICES, else 0..devices_per_node-1 (Ascend)."""
    if recipe.cluster.device != "ascend":
        return None
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
    ids = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return ids or list(range(recipe.cluster.devices_per_node))


def msrun_argv_env(rec: Recipe, cmds: list[str], node: int, plan_env: dict | None,
                   extra: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of node ``node``'s msrun command (``cmds``: the plan's commands; ``plan_env``:
    the plan's HCCL timeouts, where the user set none; ``extra``: the data's token file)."""
    if not 0 <= node < len(cmds):
        raise RecipeError(f"--launch-node {node}: the recipe has nodes 0..{len(cmds) - 1}")
    argv = same_host_node_argv(shlex.split(cmds[node]), node, rec.cluster)
    # the workers exit by themselves once this process is gone (PORT_PARENT)
    return argv, child_env(plan_env, extra, parent=True)


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
