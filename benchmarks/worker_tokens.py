"""The data phase of an msrun launch, side by side: every worker loads the HF tokenizer and tokenises the
whole dataset (port before the token file) against the launcher tokenising once into RUN/data_tokens.npz
and every worker reading it by digest (porting/train/data/token_file.py). Each worker is a real process
that imports MindSpore first, as porting/launch/workers/train.py does, then builds its batch schedule; the
workers of one launch run at the same time. Reported: CPU seconds of the whole launch (launcher + workers),
the peak RSS of one worker (VmHWM), and the wall time until the last worker has its schedule.

Data: the packaged TinyStories sample (porting/train/assets, CDLA-Sharing-1.0), repeated to the sizes asked
(the rows are real text; only their count changes).

    python benchmarks/worker_tokens.py                      # markdown table (BENCHMARKS.md, "Worker start-up")
    python benchmarks/worker_tokens.py --workers 2,4 --copies 1,200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"
MODEL = ROOT / "model_zoo" / "assets" / "stories260k"

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, {root!r})
mode, run, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode != "launcher":   # a worker imports MindSpore before anything else; `port train` itself does not
    import mindspore  # noqa: F401
from porting.train.recipe.schema import validate_recipe
from porting.train.data.batching import build_plan
recipe = validate_recipe(json.loads({recipe!r}))
if mode == "launcher":
    from porting.train.data import token_cache
    print(json.dumps(token_cache.for_workers(recipe, __import__("pathlib").Path(run))), file=sys.stderr)
elif mode == "each":
    from porting.tokenizer import load_tokenizer
    plan = build_plan(recipe, load_tokenizer({model!r}), world)
else:
    from porting.train.data import token_file
    data = token_file.read(os.environ[token_file.ENV], __import__("pathlib").Path(run),
                           token_file.identity(recipe, {model!r}))
    plan = build_plan(recipe, None, world, data=data)
ru = resource.getrusage(resource.RUSAGE_SELF)
hwm = int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
print(json.dumps({{"cpu_s": ru.ru_utime + ru.ru_stime, "hwm": hwm,
                  "torch": "torch" in sys.modules}}))
"""


def _spawn(script: str, mode: str, run: Path, world: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, mode, str(run), str(world)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen) -> tuple[dict, str]:
    out, err = p.communicate(timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"a benchmark process failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1]), err


def launch(mode: str, data: Path, workers: int) -> dict:
    recipe = json.dumps({"model": {"source": str(MODEL)},
                         "data": {"path": str(data), "max_seq_length": 256, "format": "text"}})
    script = CHILD.format(root=str(ROOT), recipe=recipe, model=str(MODEL))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        t0 = time.perf_counter()
        cpu = 0.0
        if mode == "once":
            rec, err = _finish(_spawn(script, "launcher", run, workers, env))
            cpu += rec["cpu_s"]
            env.update(json.loads(err.strip().splitlines()[-1]))
        recs = [_finish(p)[0] for p in [_spawn(script, "each" if mode == "each" else "read", run, workers, env)
                                        for _ in range(workers)]]
        wall = time.perf_counter() - t0
    return {"cpu_s": cpu + sum(r["cpu_s"] for r in recs), "wall_s": wall,
            "worker_hwm_mb": max(r["hwm"] for r in recs) / 2**20, "worker_torch": any(r["torch"] for r in recs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--copies", default="1,200", help="how many times the sample's rows are repeated")
    a = ap.parse_args()
    rows = SAMPLE.read_text()
    print("| sample copies | workers | data phase | launch CPU s | wall s | worker peak RSS MB | worker imports torch |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for copies in [int(c) for c in a.copies.split(",")]:
            data = Path(d) / f"sample_x{copies}.txt"
            data.write_text(rows * copies)
            for w in [int(x) for x in a.workers.split(",")]:
                for mode, name in (("each", "each worker tokenises"), ("once", "launcher once, workers read")):
                    r = launch(mode, data, w)
                    print(f"| {copies} | {w} | {name} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | "
                          f"{r['worker_hwm_mb']:.0f} | {'yes' if r['worker_torch'] else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
