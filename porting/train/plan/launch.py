"""The launch of a multi-device run as data: the exact `msrun` command of every node (node_rank 0 hosts
the scheduler at master_addr). ``porting.launch.msrun`` starts it; ``--dry-run`` prints it."""

from __future__ import annotations

import shlex
from pathlib import Path

from porting.train.recipe.schema import Recipe

# The script msrun starts on every worker (porting/train/run/worker.py), named here as a path, not imported:
# planning never loads the run side (MindSpore).
WORKER_SCRIPT = Path(__file__).parents[1] / "run" / "worker.py"


def worker_script() -> Path:
    return WORKER_SCRIPT


def msrun_commands(recipe: Recipe, recipe_path: str, run_dir: str, overrides: list[str] | None = None,
                   resume: bool = False, python_path_hint: bool = False) -> list[str]:
    """The exact command of every node (node_rank 0 hosts the scheduler at master_addr)."""
    c = recipe.cluster
    base = ["msrun", f"--worker_num={recipe.world_size}", f"--local_worker_num={c.devices_per_node}",
            f"--master_addr={c.master_addr}", f"--master_port={c.master_port}"]
    tail = [f"--log_dir={Path(run_dir) / 'logs' / 'msrun'}", "--join=True", f"--cluster_time_out={c.cluster_time_out}"]
    if c.rank_table_file:
        tail.append(f"--rank_table_file={c.rank_table_file}")
    script = [str(worker_script()), "--recipe", str(recipe_path), "--run-dir", str(run_dir)]
    for o in overrides or []:
        script += ["--set", o]
    if resume:
        script.append("--resume")
    cmds = []
    for node in range(c.nodes):
        argv = base + [f"--node_rank={node}"] + tail + script
        cmds.append(" ".join(shlex.quote(a) for a in argv))
    return cmds
