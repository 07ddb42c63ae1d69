"""`port train --supervise`: this node's launches (msrun, or one process for a one-device recipe) under the
supervisor's watch (porting/launch/supervise.py). A :class:`Session` holds what every launch of the run shares and
what changes between launches: the job revision the next launch runs (a shrink, a rollback that skips data, each
writes the next revision of ``RUN/job.json``: the user's recipe file is never read again), the devices, the
environment on top of the child's."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import click

from model_zoo.errors import RecipeError
from porting.job import Hooks, Job
from porting.launch import lifeline
from porting.launch.children import child_env
from porting.launch.msrun import launch_devices, node_ranks, training_job
from porting.launch.nodes import Peers
from porting.launch.shrink import check_plan, confirm_bad, derive
from porting.launch.options import Launch
from porting.launch.supervise import Incident, Supervised, launch_dir, supervise
from porting.launch.watch import derive_limits
from porting.train.data import token_cache
from porting.train.plan.launch import WORKER_SCRIPT, worker_args


@dataclasses.dataclass
class Session:
    """One node's supervised launches of one run."""

    job: Job                          # the revision the next launch runs (a shrink or a rollback writes the next)
    node: int
    skips: list[list[int]]            # the recipe's own nonfinite.skip_steps, before any rollback's windows
    env: dict[str, str] = dataclasses.field(default_factory=dict)   # on top of the child's (a shrink's devices)
    tokens: dict[str, str] | None = None   # the data tokenised once for every launch (a shrink keeps the data)
    devices: list[int] = dataclasses.field(default_factory=list)    # this node's devices a launch uses

    def launch(self, again: bool, windows: list[tuple[int, int]]) -> subprocess.Popen:
        """Start the next launch (``again``: with --resume), skipping the data of ``windows`` too: a window not in
        the job yet makes its next revision (porting/train/run/step/nonfinite.py)."""
        skip = self.skips + [list(w) for w in windows]
        if skip != [list(w) for w in self.job.recipe.nonfinite.skip_steps]:
            self.job = self.job.revise({"nonfinite.skip_steps": skip},
                                       f"rollback: skipping the data of steps {', '.join(f'{a}..{b}' for a, b in windows)}")
            self.job.write()
        logs = launch_dir(self.job.run.path, self.node)
        n = len(list(logs.glob("launch_*.log"))) + 1
        output = logs / f"launch_{n}.log"
        if self.job.recipe.world_size == 1:   # one process: the worker itself, reading the job document
            argv = [sys.executable, str(WORKER_SCRIPT), *worker_args(self.job.run.path, again, self.job.revision)]
            with open(output, "ab") as sink:
                proc = lifeline.start(argv, child_env(overrides=self.env, parent=True), sink)
        else:
            if self.tokens is None:
                self.tokens = token_cache.for_workers(self.job.recipe, self.job.run.path, self.node)
            proc = training_job(self.job, self.node, again, {**self.tokens, **self.env}).popen(output)
        click.echo(f"supervise: launch {n}{' (--resume)' if again else ''} of job revision {self.job.revision} "
                   f"(pid {proc.pid})", err=True)
        return proc

    def latest_step(self) -> int | None:
        """The step of the last complete checkpoint (None: none yet)."""
        from porting.train.run.checkpoint import save as ckpt   # deferred: the checkpoint readers (NumPy, the recipe schema), only on a restart

        last = ckpt.latest(self.job.run.checkpoints)
        return last[0] if last else None

    def shrink(self, inc: Incident) -> tuple[list[int], int, str] | None:
        """The supervisor's shrink hook (porting/launch/shrink.py): the next launch's ranks, world size and what
        was done when the suspect's device fails its probe, else None (relaunch on the same devices)."""
        rec = self.job.recipe
        bad = confirm_bad(rec, self.devices, inc.suspect - self.node * rec.cluster.devices_per_node)
        if not bad:
            click.echo(f"supervise: the device of rank {inc.suspect} passed its probe: relaunching on the same devices",
                       err=True)
            return None
        s = derive(rec, self.devices, set(bad))
        job = self.job.revise(s.values, f"shrink: {s.text}", tuple(s.devices))
        check_plan(job)
        job.write()
        self.job, self.devices = job, s.devices
        if rec.cluster.device == "ascend":
            self.env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(map(str, s.devices))
        return list(range(job.recipe.world_size)), job.recipe.world_size, f"{'; '.join(bad.values())}: {s.text}"


def run_supervised(job: Job, hooks: Hooks, launch: Launch) -> tuple[int, Job]:
    """Supervise this node's launches of ``job`` until it finishes; the restarts made and the job revision the last
    launch ran (a shrink's). ``hooks.preflight`` runs before every relaunch (with the shrunk job after a shrink);
    ``hooks.diagnose`` is `port diagnose`."""
    rec, sup = job.recipe, launch.supervision
    if rec.cluster.nodes > 1 and launch.node is None:
        raise RecipeError(f"--supervise watches one node's launch; a {rec.cluster.nodes}-node recipe needs "
                          "--launch-node N on each node (each node's supervisor watches its own ranks)")
    node = launch.node or 0
    s = Session(job, node, [list(w) for w in rec.nonfinite.skip_steps],
                devices=launch_devices(rec) or list(range(rec.cluster.devices_per_node)))
    ranks = node_ranks(rec, node)
    launch_dir(job.run.path, node).mkdir(parents=True, exist_ok=True)   # what each launch printed (msrun's own output)
    limits = derive_limits(job.plan.allowances, sup.stall_timeout, sup.max_restarts)
    click.echo(f"supervise: ranks {ranks[0]}..{ranks[-1]} of {rec.world_size}; stall after {limits.stall_s:.0f} s "
               f"without a heartbeat ({limits.compile_s:.0f} s before the first step, {limits.restore_s:.0f} s "
               f"restoring, {limits.save_s:.0f} s while saving); at most {limits.max_restarts} restart(s)", err=True)
    peers = Peers(job.run.path, node, rec.cluster.nodes, answer_s=limits.stall_s + 60) if rec.cluster.nodes > 1 else None
    pre = hooks.preflight
    target = Supervised(s.launch, s.latest_step, ranks, rec.world_size, hooks.diagnose,
                        preflight=None if pre is None else lambda: pre(s.job, node),
                        shrink=s.shrink if sup.shrink else None, peers=peers,
                        extra={"rank_table": rec.cluster.rank_table_file, "job": str(job.run.path / "job.json")})
    restarts = supervise(target, job.run.path, limits, resume=launch.resume, echo=lambda m: click.echo(m, err=True))
    return restarts, s.job
