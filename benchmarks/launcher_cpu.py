"""CPU seconds of `port train`'s launcher on more than one device, and whether it loads MindSpore.

The launcher of a multi-device run only checks the run directory, writes the plan and waits for msrun's
workers; MindSpore is loaded by the workers. Two measurements, each in fresh processes:

* ``launcher``: a fresh interpreter imports the launch wing (porting.launch.start, msrun, session) and runs
  ``prepare`` (the run-directory and resume checks, plan.json) on a fresh run directory; its own CPU seconds
  (``getrusage``) and whether ``mindspore`` is in ``sys.modules`` afterwards;
* ``--full N``: the whole 2-worker command (the launcher, msrun and both workers: 3 optimizer steps of the tiny
  recipe) under ``/usr/bin/time -f "%e s %U user %S sys"``, N times, with the load average before each.

``--token-cache``: each ``--full`` round runs the command twice, interleaved, without ``PORT_TOKEN_CACHE`` and
with a warm one (porting/train/data/token_cache.py: the launcher then takes the tokens from the cache and
never loads transformers and torch), so the two compare side by side at the same load.

``--tree DIR`` measures another checkout (an earlier commit in a ``git worktree``) with this interpreter,
so a before/after pair runs on the same machine, interleaved. Each run picks a free msrun port (the recipe's
8118 may be taken by another job on a shared machine); nothing else differs from the command in BENCHMARKS.md.

Usage: python benchmarks/launcher_cpu.py [--tree DIR] [--repeat 3] [--full 3] [--token-cache]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FULL = ["train", "recipes/tiny-cpu.yaml", "--set", "cluster.devices_per_node=2", "--set", "data.max_seq_length=64",
        "--set", "batching.bucketing.enabled=false", "--set", "checkpointing.export_hf=false",
        "--set", "schedule.max_steps=3"]
LAUNCHER = """
import resource, sys, tempfile
from pathlib import Path
import porting.launch.start as start, porting.launch.msrun, porting.launch.session
from model_zoo.config import LlamaConfig
from porting.job import Hooks, Job
from porting.launch.options import Launch
from porting.model_paths import resolve_hf
from porting.train.plan.make import make_plan
from porting.train.recipe.schema import load_recipe
rec = load_recipe("recipes/tiny-cpu.yaml", ["cluster.devices_per_node=2"])
cfg = LlamaConfig.from_hf(resolve_hf(rec.model.source)).to_hf()
hooks = Hooks(doctor=dict, diagnose=lambda logs, world: {}, explain=lambda logs, workers: "")
start.prepare(Job.of(rec, Path(tempfile.mkdtemp()) / "fresh"), Launch(), hooks)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(f"{ru.ru_utime + ru.ru_stime:.2f} CPU-s, mindspore loaded: {'mindspore' in sys.modules}")
"""


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--full", type=int, default=0, help="also run the whole 2-worker command this many times")
    ap.add_argument("--token-cache", action="store_true",
                    help="each --full round also with a warm PORT_TOKEN_CACHE, side by side")
    args = ap.parse_args()
    tree = args.tree.resolve()
    env = dict(os.environ, PYTHONPATH=str(tree), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for i in range(args.repeat):
        out = subprocess.run([sys.executable, "-c", LAUNCHER], cwd=tree, env=env, capture_output=True, text=True)
        print(f"launcher {i + 1}: {(out.stdout or out.stderr).strip().splitlines()[-1]} (load {_load()})")
    cache = Path(tempfile.mkdtemp(prefix="port-token-cache-")) if args.token_cache else None
    try:
        if cache is not None:   # warm it: one run that tokenises and keeps the tokens
            _full(tree, env, {"PORT_TOKEN_CACHE": str(cache)}, "warm-up (fills the cache)")
        for i in range(args.full):
            _full(tree, {k: v for k, v in env.items() if k != "PORT_TOKEN_CACHE"}, {}, f"full {i + 1}")
            if cache is not None:
                _full(tree, env, {"PORT_TOKEN_CACHE": str(cache)}, f"full {i + 1}, token cache")
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)


def _full(tree: Path, env: dict, extra: dict, label: str) -> None:
    run = Path(tempfile.mkdtemp(prefix="port-launcher-cpu-")) / "run"
    load = _load()
    cmd = ["/usr/bin/time", "-f", "%e s %U user %S sys", sys.executable, "-m", "porting", *FULL,
           "--set", f"cluster.master_port={_free_port()}", "--run-dir", str(run)]
    p = subprocess.run(cmd, cwd=tree, env={**env, **extra}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    print(f"{label}: exit {p.returncode}, {p.stderr.strip().splitlines()[-1]} (load before {load})")
    shutil.rmtree(run.parent, ignore_errors=True)

if __name__ == "__main__":
    main()
