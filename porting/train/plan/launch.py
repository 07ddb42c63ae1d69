"""An msrun job as data: :class:`MsrunSpec` and its one command-line builder, :func:`msrun_argv`.

Every msrun job port starts (a training run, the preflight's smoke all-reduce and smoke collectives, the
rehearsal's collective timing) is an :class:`MsrunSpec`, turned into its argv here and nowhere else;
``porting.launch.jobs.MsrunJob`` runs one (child environment, lifeline, teardown, outcome), ``--dry-run`` prints
a training run's with :func:`msrun_commands`. Nothing here starts a process or loads MindSpore.

msrun's flags are MindSpore's (mindspore/parallel/cluster/run.py; docs msrun_launcher.md): ``--worker_num``,
``--local_worker_num``, ``--master_addr``, ``--master_port``, ``--node_rank``, ``--log_dir``, ``--join``,
``--cluster_time_out``, ``--rank_table_file``, then the script and its arguments.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from porting.train.recipe.schema import Recipe

# The script msrun starts on every training worker (porting/launch/workers/train.py), named here as a path, not
# imported: planning never loads the run side (MindSpore).
WORKER_SCRIPT = Path(__file__).parents[2] / "launch" / "workers" / "train.py"


@dataclass(frozen=True)
class MsrunSpec:
    """One node's msrun command: the job's shape, where msrun logs, and the script every worker runs."""

    worker_num: int
    local_worker_num: int
    master_port: int
    log_dir: Path
    script: Path
    args: tuple[str, ...] = ()
    master_addr: str | None = None        # None: msrun's default (127.0.0.1)
    node_rank: int | None = None          # None: msrun's default (-1: one node)
    cluster_time_out: int | None = None   # None: msrun's default (600 s)
    rank_table_file: str | None = None
    join: bool = True                     # msrun waits for its workers and stops them all on the first failure


def msrun_argv(spec: MsrunSpec, msrun: str = "msrun") -> list[str]:
    """The argv of ``spec`` (``msrun``: the executable, a full path when the launcher runs it)."""
    argv = [msrun, f"--worker_num={spec.worker_num}", f"--local_worker_num={spec.local_worker_num}"]
    if spec.master_addr is not None:
        argv.append(f"--master_addr={spec.master_addr}")
    argv.append(f"--master_port={spec.master_port}")
    if spec.node_rank is not None:
        argv.append(f"--node_rank={spec.node_rank}")
    argv += [f"--log_dir={spec.log_dir}", f"--join={spec.join}"]
    if spec.cluster_time_out is not None:
        argv.append(f"--cluster_time_out={spec.cluster_time_out}")
    if spec.rank_table_file:
        argv.append(f"--rank_table_file={spec.rank_table_file}")
    return argv + [str(spec.script), *spec.args]


def worker_args(run_dir: str | Path, resume: bool = False, revision: int | None = None) -> tuple[str, ...]:
    """What a training worker is told: the run directory whose job document it reads (``RUN/job.json``,
    porting/job/), the revision (None: the newest), and whether this launch continues the last checkpoint."""
    return ("--run-dir", str(run_dir), *(("--revision", str(revision)) if revision is not None else ()),
            *(("--resume",) if resume else ()))


def train_spec(recipe: Recipe, run_dir: str | Path, node: int, args: tuple[str, ...]) -> MsrunSpec:
    """Node ``node``'s msrun of a training run (node 0 hosts the scheduler at ``cluster.master_addr``)."""
    c = recipe.cluster
    return MsrunSpec(worker_num=recipe.world_size, local_worker_num=c.devices_per_node, master_port=c.master_port,
                     log_dir=Path(run_dir) / "logs" / "msrun", script=WORKER_SCRIPT, args=args,
                     master_addr=c.master_addr, node_rank=node, cluster_time_out=c.cluster_time_out,
                     rank_table_file=c.rank_table_file)


def msrun_commands(recipe: Recipe, run_dir: str | Path, resume: bool = False) -> list[str]:
    """Every node's training command as the user would type it (what ``--dry-run`` prints and ``plan.json``
    holds); the worker reads the newest revision of the run's job document."""
    args = worker_args(run_dir, resume)
    return [" ".join(shlex.quote(a) for a in msrun_argv(train_spec(recipe, run_dir, node, args)))
            for node in range(recipe.cluster.nodes)]
