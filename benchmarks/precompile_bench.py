"""Compiles before step 1, side by side in one run: `port train` of an older checkout
(``--before``: lazy compiles in the steps, a host sync per micro-batch) against this checkout (every shape
compiled before step 1, sums kept on the device), and this checkout again with the compile cache a first
run left (a rerun or a resume of the same recipe).

Two runs of recipes/tiny-cpu.yaml (real stories260K, TinyStories windows), 12 steps, no checkpoints, each
variant a fresh `python -m porting train` process, variants interleaved per round so a burst of load from
other jobs hits each alike:
- ``bucketed``: 4 bucket lengths, micro-batch 1 x 2 accumulation steps (the steps change shape; after the
  change both micro-batches of a step have the step's longest length);
- ``one shape``: bucketing off (128 tokens), micro-batch 1 x 4 accumulation steps: the same shapes and
  padding on both sides, so the steady step differs only by the host syncs per micro-batch.

    git archive BASE | tar -x -C /tmp/base     # the checkout to compare with
    python benchmarks/precompile_bench.py --before /tmp/base --rounds 2

Per variant (medians over rounds): compile seconds (the steps' time beyond the steady median, plus the
compiles before step 1), seconds until step 1 is done (process start to the end of step 1), the steady
step time (steps that compiled nothing), the slowest step after step 1 (a compile inside the run: the
stall that made the other ranks time out), the padding fraction, and the largest relative difference of
a step's loss from ``before``.
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
COMMON = ["batching.micro_batch_size=1", "schedule.max_steps=12", "checkpointing.every_steps=0",
          "checkpointing.export_hf=false"]
CONFIGS = {"bucketed": COMMON + ["batching.grad_accum_steps=2"],
           "one shape": COMMON + ["batching.grad_accum_steps=4", "batching.bucketing.enabled=false"]}


def run(tree: Path, run_dir: Path, settings: list[str]) -> dict:
    """One `port train` process of ``tree``'s code; its metrics and its wall time to the end of step 1."""
    args = [a for s in settings for a in ("--set", s)]
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
            "steady_s": statistics.median(steady), "worst_after_1_s": max(s["step_time_s"] for s in steps[1:]),
            "padding": summary["padding_fraction"], "losses": [s["loss"] for s in steps]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    res: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for cfg, settings in CONFIGS.items():
                tag = f"{r}{cfg.replace(' ', '')}"
                res.setdefault((cfg, "before"), []).append(run(a.before, Path(d) / f"b{tag}", settings))
                res.setdefault((cfg, "after"), []).append(run(ROOT, Path(d) / f"a{tag}", settings))
                if cfg == "bucketed":   # the same run again with the first one's compile cache
                    (Path(d) / f"c{tag}").mkdir()
                    shutil.copytree(Path(d) / f"a{tag}" / "compile_cache", Path(d) / f"c{tag}" / "compile_cache")
                    res.setdefault((cfg, "after, cache hit"), []).append(run(ROOT, Path(d) / f"c{tag}", settings))
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; {a.rounds} rounds; medians")
    print("| run | variant | compile (s) | start to end of step 1 (s) | steady step (s) | slowest step after 1 (s) "
          "| padding | loss vs before (max rel) |")
    print("|---|---|---|---|---|---|---|---|")
    keys = ("compile_s", "to_step1_s", "steady_s", "worst_after_1_s", "padding")
    for (cfg, name), rows in res.items():
        med = {k: statistics.median(x[k] for x in rows) for k in keys}
        ref = res[(cfg, "before")][0]["losses"]
        rel = max(abs(x - y) / abs(y) for row in rows for x, y in zip(row["losses"], ref))
        print(f"| {cfg} | {name} | {med['compile_s']:.1f} | {med['to_step1_s']:.1f} | {med['steady_s']:.3f} | "
              f"{med['worst_after_1_s']:.2f} | {med['padding']:.3f} | {'identical' if rel == 0 else f'{rel:.1e}'} |")
        for x in rows:   # each round, to see the spread
            print(f"|  | (round) | {x['compile_s']:.1f} | {x['to_step1_s']:.1f} | {x['steady_s']:.3f} | "
                  f"{x['worst_after_1_s']:.2f} | {x['padding']:.3f} | |")


if __name__ == "__main__":
    main()
