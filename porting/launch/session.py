"""`port train --supervise`: this node's launches (msrun, or one process for a one-device recipe) under the
supervisor's watch (porting/launch/supervise.py). A :class:`Session` holds what every launch of the run shares
and what a shrink changes: the recipe and its overrides, the devices, the environment on top of the child's."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import click

from model_zoo.errors import RecipeError
from porting.launch.children import child_env
from porting.launch.msrun import launch_devices, msrun_argv_env, node_ranks
from porting.launch.outcome import after_finished
from porting.launch.nodes import Peers
from porting.launch.shrink import check_plan, confirm_bad, derive
from porting.launch.supervise import Diagnose, Incident, launch_dir, supervise
from porting.launch.watch import derive_limits
from porting.rundir.paths import RunDir
from porting.train.data import token_cache
from porting.train.plan.launch import msrun_commands
from porting.train.plan.make import TrainPlan
from porting.train.recipe.schema import Recipe


@dataclasses.dataclass
class Session:
    """One node's supervised launches of one run."""

    rec: Recipe                       # the recipe the next launch runs (a shrink replaces it)
    recipe_path: str
    out: Path
    node: int
    plan_env: dict[str, str]          # the plan's HCCL timeouts (the user's own values win)
    overrides: list[str]              # --set values, a shrink's appended
    env: dict[str, str] = dataclasses.field(default_factory=dict)   # on top of the child's (a shrink's devices)
    tokens: dict[str, str] | None = None   # the data tokenised once for every launch (a shrink keeps the data)
    devices: list[int] = dataclasses.field(default_factory=list)    # this node's devices a launch uses

    def launch(self, again: bool, windows: list[tuple[int, int]]) -> subprocess.Popen:
        """Start the next launch (``again``: with --resume), skipping the data of ``windows`` too."""
        rec = self.rec
        # a non-finite rollback's data windows join the recipe's own (porting/train/run/step/nonfinite.py)
        skip = [list(w) for w in rec.nonfinite.skip_steps] + [list(w) for w in windows]
        sets = [*self.overrides, *([f"nonfinite.skip_steps={json.dumps(skip)}"] if windows else [])]
        if rec.world_size == 1:   # one process: `port train` itself, without --supervise
            argv = [sys.executable, "-m", "porting", "train", self.recipe_path, "--run-dir", str(self.out),
                    "--no-preflight", *[a for o in sets for a in ("--set", o)], *(["--resume"] if again else [])]
            env = child_env(overrides=self.env, parent=True)   # the child exits once this supervisor is gone
        else:
            if self.tokens is None:
                self.tokens = token_cache.for_workers(rec, self.out, self.node)
            cmds = msrun_commands(rec, self.recipe_path, str(self.out), sets, again)
            argv, env = msrun_argv_env(rec, cmds, self.node, self.plan_env, {**self.tokens, **self.env})
            if "--join=False" in argv:   # node k on the master's machine: msrun returns once its workers run
                argv = [sys.executable, "-m", "porting.launch.detached", *argv]
        logs = launch_dir(self.out, self.node)
        n = len(list(logs.glob("launch_*.log"))) + 1
        sink = open(logs / f"launch_{n}.log", "w", encoding="utf-8")
        click.echo(f"supervise: launch {n}{' (--resume)' if again else ''}: {' '.join(argv[:3])} ...", err=True)
        try:
            return subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            sink.close()

    def latest_step(self) -> int | None:
        """The step of the last complete checkpoint (None: none yet)."""
        from porting.train.run.checkpoint import save as ckpt   # deferred: the checkpoint readers (NumPy, the recipe schema), only on a restart

        last = ckpt.latest(RunDir(self.out).checkpoints)
        return last[0] if last else None

    def shrink(self, inc: Incident) -> tuple[list[int], int, str] | None:
        """The supervisor's shrink hook (porting/launch/shrink.py): the next launch's ranks, world size and what
        was done when the suspect's device fails its probe, else None (relaunch on the same devices)."""
        from porting import train as T   # deferred: a supervised run without --shrink never loads the planner

        rec = self.rec
        bad = confirm_bad(rec, self.devices, inc.suspect - self.node * rec.cluster.devices_per_node)
        if not bad:
            click.echo(f"supervise: the device of rank {inc.suspect} passed its probe: relaunching on the same devices",
                       err=True)
            return None
        s = derive(rec, self.devices, set(bad))
        overrides = self.overrides + s.overrides
        check_plan(rec, self.recipe_path, self.out, overrides)
        self.rec, self.overrides, self.devices = T.load_recipe(self.recipe_path, overrides), overrides, s.devices
        if rec.cluster.device == "ascend":
            self.env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(map(str, s.devices))
        return list(range(self.rec.world_size)), self.rec.world_size, f"{'; '.join(bad.values())}: {s.text}"


def run_supervised(rec: Recipe, recipe_path: str, overrides: list[str], out: Path, resume: bool,
                   launch_node: int | None, plan: TrainPlan, stall_timeout: float | None, max_restarts: int,
                   preflight: Callable[[Recipe], None] | None, diagnose: Diagnose, shrink: bool = False) -> None:
    """``preflight(recipe)`` runs before every relaunch (with the shrunk recipe after a shrink); ``diagnose(logs,
    world)`` is `port diagnose`, the caller's (it sits above this package)."""
    if rec.cluster.nodes > 1 and launch_node is None:
        raise RecipeError(f"--supervise watches one node's launch; a {rec.cluster.nodes}-node recipe needs "
                          "--launch-node N on each node (each node's supervisor watches its own ranks)")
    node = launch_node or 0
    s = Session(rec, recipe_path, out, node, plan.launch.env if plan.launch else {}, list(overrides),
                devices=launch_devices(rec) or list(range(rec.cluster.devices_per_node)))
    ranks = node_ranks(rec, node)
    launch_dir(out, node).mkdir(parents=True, exist_ok=True)   # what each launch printed (msrun's own output)
    limits = derive_limits(plan.allowances, stall_timeout, max_restarts)
    click.echo(f"supervise: ranks {ranks[0]}..{ranks[-1]} of {rec.world_size}; stall after {limits.stall_s:.0f} s "
               f"without a heartbeat ({limits.compile_s:.0f} s before the first step, {limits.restore_s:.0f} s "
               f"restoring, {limits.save_s:.0f} s while saving); at most {limits.max_restarts} restart(s)", err=True)
    peers = Peers(out, node, rec.cluster.nodes, answer_s=limits.stall_s + 60) if rec.cluster.nodes > 1 else None
    restarts = supervise(s.launch, out, ranks, rec.world_size, limits, s.latest_step, diagnose=diagnose,
                         preflight=None if preflight is None else lambda: preflight(s.rec), resume=resume,
                         extra={"rank_table": rec.cluster.rank_table_file, "recipe": recipe_path},
                         echo=lambda m: click.echo(m, err=True), shrink=s.shrink if shrink else None, peers=peers)
    click.echo(f"done: {s.rec.world_size} worker(s), {restarts} restart(s); run directory {out}")
    after_finished(s.rec, out, node, click.echo)
