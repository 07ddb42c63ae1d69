"""`port train --supervise`: the launch of this node (msrun, or one process for a one-device recipe) under
porting/supervise.py's watch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import click

from model_zoo.errors import RecipeError


def run_supervised(rec: Any, recipe_path: str, overrides: list[str], out: Path, resume: bool,
                   launch_node: int | None, plan: dict[str, Any], stall_timeout: float | None, max_restarts: int,
                   preflight: Callable[[Any], None] | None, shrink: bool = False) -> None:
    """``preflight(recipe)`` runs before every relaunch (with the shrunk recipe after a shrink)."""
    from porting.supervise import derive_limits, launch_dir, supervise
    from porting.supervise_nodes import Peers
    from porting.train.data import token_file
    from porting.train.plan.launch import msrun_commands
    from porting.train.run import checkpoint as ckpt   # deferred: the run side imports MindSpore
    from porting.train.run.launch import msrun_argv_env
    from porting.train.run.lifeline import token   # the one-device child exits once this supervisor is gone

    if rec.cluster.nodes > 1 and launch_node is None:
        raise RecipeError(f"--supervise watches one node's launch; a {rec.cluster.nodes}-node recipe needs "
                          "--launch-node N on each node (each node's supervisor watches its own ranks)")
    node = launch_node or 0
    per = rec.cluster.devices_per_node
    state: dict[str, Any] = {"rec": rec, "overrides": list(overrides), "env": {}}
    ranks = list(range(node * per, (node + 1) * per))
    logs = launch_dir(out, node)     # what each launch printed (msrun's own output)
    logs.mkdir(parents=True, exist_ok=True)

    def launch(again: bool, windows: list[tuple[int, int]]) -> subprocess.Popen:
        rec, overrides = state["rec"], state["overrides"]
        # a non-finite rollback's data windows join the recipe's own (porting/train/run/nonfinite.py)
        skip = [list(w) for w in rec.nonfinite.skip_steps] + [list(w) for w in windows]
        sets = [*overrides, *([f"nonfinite.skip_steps={json.dumps(skip)}"] if windows else [])]
        if rec.world_size == 1:   # one process: `port train` itself, without --supervise
            argv = [sys.executable, "-m", "porting", "train", recipe_path, "--run-dir", str(out), "--no-preflight",
                    *[a for o in sets for a in ("--set", o)], *(["--resume"] if again else [])]
            env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PORT_PARENT=token())
        else:
            argv, env = msrun_argv_env(rec, msrun_commands(rec, recipe_path, str(out), sets, again), node,
                                       plan.get("launch", {}).get("env", {}))
            if "tokens" not in state:   # tokenised once for every launch (a shrink keeps the data section)
                state["tokens"] = token_file.for_workers(rec, out, node)
            env.update(state["tokens"])
            if "--join=False" in argv:   # node k on the master's machine: msrun returns once its workers run
                argv = [sys.executable, "-m", "porting.train.run.detached", *argv]
        env.update(state["env"])
        n = len(list(logs.glob("launch_*.log"))) + 1
        sink = open(logs / f"launch_{n}.log", "w", encoding="utf-8")
        click.echo(f"supervise: launch {n}{' (--resume)' if again else ''}: {' '.join(argv[:3])} ...", err=True)
        try:
            return subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            sink.close()

    def latest_step() -> int | None:
        last = ckpt.latest(out / "checkpoints")
        return last[0] if last else None

    limits = derive_limits(plan, stall_timeout, max_restarts)
    click.echo(f"supervise: ranks {ranks[0]}..{ranks[-1]} of {rec.world_size}; stall after {limits.stall_s:.0f} s "
               f"without a log line ({limits.compile_s:.0f} s before the first step, {limits.save_s:.0f} s while "
               f"saving); at most {limits.max_restarts} restart(s)", err=True)
    peers = Peers(out, node, rec.cluster.nodes, answer_s=limits.stall_s + 60) if rec.cluster.nodes > 1 else None
    restarts = supervise(launch, out, ranks, rec.world_size, limits, latest_step,
                         None if preflight is None else lambda: preflight(state["rec"]), resume,
                         extra={"rank_table": rec.cluster.rank_table_file, "recipe": recipe_path},
                         echo=lambda m: click.echo(m, err=True),
                         shrink=_shrinker(state, recipe_path, out, node) if shrink else None, peers=peers)
    click.echo(f"done: {state['rec'].world_size} worker(s), {restarts} restart(s); run directory {out}")
    if state["rec"].world_size > 1 and node == 0:   # the HF export, now that the workers have exited
        from porting.train.run.export import export_after_exit  # deferred: loads MindSpore's readers

        export_after_exit(state["rec"], out, log=click.echo)


def _shrinker(state: dict[str, Any], recipe_path: str, out: Path, node: int) -> Callable[[Any], Any]:
    """The supervisor's shrink hook over the launch ``state`` (porting/shrink.py)."""
    from porting import train as T
    from porting.cluster.preflight import launch_devices
    from porting.shrink import check_plan, confirm_bad, derive

    state["devices"] = launch_devices(state["rec"]) or list(range(state["rec"].cluster.devices_per_node))

    def shrink(inc: Any) -> tuple[list[int], int, str] | None:
        rec = state["rec"]
        bad = confirm_bad(rec, state["devices"], inc.suspect - node * rec.cluster.devices_per_node)
        if not bad:
            click.echo(f"supervise: the device of rank {inc.suspect} passed its probe: relaunching on the same devices",
                       err=True)
            return None
        s = derive(rec, state["devices"], set(bad))
        overrides = state["overrides"] + s.overrides
        check_plan(rec, recipe_path, out, overrides)
        state.update(rec=T.load_recipe(recipe_path, overrides), overrides=overrides, devices=s.devices)
        if rec.cluster.device == "ascend":
            state["env"]["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(map(str, s.devices))
        why = "; ".join(bad.values())
        return list(range(state["rec"].world_size)), state["rec"].world_size, f"{why}: {s.text}"

    return shrink
