"""Compiles before step 1 (issue 22, part 4), side by side in one run: `port train` of an older checkout
(``--before``: lazy compiles in the steps, a host sync per micro-batch) against this checkout (every shape
compiled before step 1, sums kept on the device), and this checkout again with the compile cache a first
run left (a rerun or a resume of the same recipe).

The run: recipes/tiny-cpu.yaml (real stories260K, TinyStories windows in 4 buckets), micro-batch 1 x 2
accumulation steps, 8 steps, no checkpoints; each variant a fresh `python -m porting train` process,
variants interleaved per round so a burst of load from other jobs hits each alike.

    git archive BASE | tar -x -C /tmp/base     # the checkout to compare with
    python benchmarks/precompile_bench.py --before /tmp/base --rounds 2

Per variant (medians over rounds): compile seconds (the steps' time beyond the steady median, plus the
compiles before step 1), seconds until step 1 is done (process start to the end of step 1), the steady
step time (steps that compiled nothing), and the losses (equal across variants, or the line says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ["batching.micro_batch_size=1", "batching.grad_accum_steps=2", "schedule.max_steps=8",
            "checkpointing.every_steps=0", "checkpointing.export_hf=false"]


def run(tree: Path, run_dir: Path) -> dict:
    """One `port train` process of ``tree``'s code; its metrics and its wall time to the end of step 1."""
    args = [a for s in SETTINGS for a in ("--set", s)]
    env = dict(os.environ, PYTHONPATH=str(tree), GLOG_v="3")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "porting", "train", str(tree / "recipes" / "tiny-cpu.yaml"),
                        "--run-dir", str(run_dir), *args], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: port train failed:\n{p.stderr[-2000:]}")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "step" in x and x.get("event") != "summary"]
    summary = next(x for x in lines if x.get("event") == "summary")
    step1_end = None
    for line in (run_dir / "logs" / "rank_0.log").read_text().splitlines():
        if " INFO step 1/" in line:   # the log's own clock (local time, ms) at the end of step 1
            stamp = line.split(" ")[0]
            step1_end = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + int(stamp[20:23]) / 1000
            break
    if step1_end is None:
        raise SystemExit(f"{run_dir}: no step 1 line in logs/rank_0.log")
    steady = [s["step_time_s"] for s in steps if not s["compile"]]
    return {"compile_s": summary["compile_time_s"], "to_step1_s": step1_end - t0,
            "steady_s": statistics.median(steady), "losses": [s["loss"] for s in steps]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    res: dict[str, list[dict]] = {"before": [], "after": [], "after, cache hit": []}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            res["before"].append(run(a.before, Path(d) / f"b{r}"))
            res["after"].append(run(ROOT, Path(d) / f"a{r}"))
            hit = Path(d) / f"c{r}"
            hit.mkdir()
            shutil.copytree(Path(d) / f"a{r}" / "compile_cache", hit / "compile_cache")
            res["after, cache hit"].append(run(ROOT, hit))
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; {a.rounds} rounds; medians")
    print("| variant | compile (s) | process start to end of step 1 (s) | steady step (s) | losses |")
    print("|---|---|---|---|---|")
    ref = res["before"][0]["losses"]
    for name, rows in res.items():
        med = {k: statistics.median(x[k] for x in rows) for k in ("compile_s", "to_step1_s", "steady_s")}
        same = all(x["losses"] == ref for x in rows)
        print(f"| {name} | {med['compile_s']:.1f} | {med['to_step1_s']:.1f} | {med['steady_s']:.3f} | "
              f"{'bit-identical to before' if same else 'DIFFER'} |")


if __name__ == "__main__":
    main()
