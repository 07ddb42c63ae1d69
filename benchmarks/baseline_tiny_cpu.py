"""Baseline vs port, side by side in one run: `port baseline` (torch eager, CPU) and `port train`
(MindSpore graph mode, CPU) on the same recipe, steps and batches, then `port compare`.

Prints the loss agreement, probe difference, steady tokens/s of both and their ratio, peak host memory,
and the machine's load average (CPU timings on a shared machine are only comparable within one run).

Usage: python benchmarks/baseline_tiny_cpu.py [--steps 12] [--recipe recipes/tiny-cpu.yaml] [--threads 2]
                                             [--set KEY=VALUE ...]   # recipe overrides for both sides
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def port(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "porting", *args], cwd=ROOT, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"port {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="recipe override for both runs (repeatable)")
    args = ap.parse_args()
    sets = ["--set", f"schedule.max_steps={args.steps}"]
    for kv in args.sets:
        sets += ["--set", kv]
    with tempfile.TemporaryDirectory() as d:
        base, run = Path(d) / "base.json", Path(d) / "run"
        load0 = os.getloadavg()
        port("baseline", "run", "--recipe", args.recipe, *sets, "--out", str(base), "--threads", str(args.threads))
        port("train", args.recipe, *sets, "--run-dir", str(run))
        rep = json.loads(port("compare", str(base), str(run), "--json").stdout)
        load1 = os.getloadavg()
    t, m, loss, pr = rep["throughput"], rep["memory"], rep["loss"], rep["probe"]
    print(f"recipe {args.recipe} {' '.join(args.sets)}, {args.steps} steps, torch threads {args.threads}; load average before/after "
          f"{load0[0]:.1f}/{load1[0]:.1f} on {os.cpu_count()} cores")
    print(f"loss: {loss['steps_compared']} steps, max abs diff {loss['max_abs_diff']:.2e}, max rel {loss['max_rel_diff']:.2e}, "
          f"grad-norm max rel {loss['max_grad_norm_rel_diff']:.2e}")
    if pr["available"]:
        print(f"probe after step {pr['after_step']}: max abs {pr['max_abs_diff']:.2e}, argmax agreement {pr['argmax_agreement']:.0%}")
    print(f"steady tokens/s: torch {t['baseline_tokens_per_s']:.1f}, port {t['run_tokens_per_s']:.1f}, "
          f"ratio port/torch {t['ratio_run_over_baseline']:.2f}")
    print(f"peak host RSS: torch {m['baseline_peak_gib']:.3f} GiB, port {m['run_peak_gib']:.3f} GiB, "
          f"ratio {m['ratio_run_over_baseline']:.2f}")
    print("verdict:", "PASS" if rep["ok"] else "FAIL " + "; ".join(rep["failures"]))


if __name__ == "__main__":
    main()
