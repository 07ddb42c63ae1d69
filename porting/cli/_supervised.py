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
                   preflight: Callable[[], None] | None) -> None:
    from porting.supervise import derive_limits, supervise
    from porting.train.plan.launch import msrun_commands
    from porting.train.run import checkpoint as ckpt   # deferred: the run side imports MindSpore
    from porting.train.run.launch import msrun_argv_env

    if rec.cluster.nodes > 1 and launch_node is None:
        raise RecipeError(f"--supervise watches one node's launch; a {rec.cluster.nodes}-node recipe needs "
                          "--launch-node N on each node (each node's supervisor watches its own ranks)")
    node = launch_node or 0
    per = rec.cluster.devices_per_node
    ranks = list(range(node * per, (node + 1) * per))
    logs = out / "supervise"     # what each launch printed (msrun's own output)
    logs.mkdir(parents=True, exist_ok=True)

    def launch(again: bool, windows: list[tuple[int, int]]) -> subprocess.Popen:
        # a non-finite rollback's data windows join the recipe's own (porting/train/run/nonfinite.py)
        skip = [list(w) for w in rec.nonfinite.skip_steps] + [list(w) for w in windows]
        sets = [*overrides, *([f"nonfinite.skip_steps={json.dumps(skip)}"] if windows else [])]
        if rec.world_size == 1:   # one process: `port train` itself, without --supervise
            argv = [sys.executable, "-m", "porting", "train", recipe_path, "--run-dir", str(out), "--no-preflight",
                    *[a for o in sets for a in ("--set", o)], *(["--resume"] if again else [])]
            env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        else:
            argv, env = msrun_argv_env(rec, msrun_commands(rec, recipe_path, str(out), sets, again), node,
                                       plan.get("launch", {}).get("env", {}))
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
    restarts = supervise(launch, out, ranks, rec.world_size, limits, latest_step, preflight, resume,
                         extra={"rank_table": rec.cluster.rank_table_file, "recipe": recipe_path},
                         echo=lambda m: click.echo(m, err=True))
    click.echo(f"done: {rec.world_size} worker(s), {restarts} restart(s); run directory {out}")
