"""MindSpore's PyNative pipeline, asynchronous (its default) against synchronous (``MS_DEV_LAUNCH_BLOCKING=1``),
side by side in one run, through `port verify --generate` (forward parity, then greedy decoding with the KV cache,
op by op in PyNative) at two sizes: stories260K's real weights and a random-weight Llama 2048 wide x 2 layers.

By default a PyNative op is queued to a worker thread and the Python thread that waits for it spins on the queue
(mindspore/ccsrc/runtime/pipeline/async_rqueue.cc, ``AsyncRQueue::Wait``: ``while (!tasks_queue_.IsEmpty()) {}``)
while the worker yields in a loop between ops. On a host with few cores that spinning takes the cores the ops
need; the test suite (4 xdist workers on 2 cores) runs synchronously for that reason (tests/conftest.py).
MindSpore reads the variable when it is imported, so each measurement is a fresh `port` process. Rounds
alternate the two modes, so a change in the machine's load hits both; every run's JSON result, its timings
left out, must be the same in both modes (the same kernels in the same order).

    python benchmarks/pynative_pipeline.py                 # 3 rounds at both sizes
    python benchmarks/pynative_pipeline.py --rounds 1 --sizes stories260k
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = {"asynchronous (default)": "0", "synchronous (MS_DEV_LAUNCH_BLOCKING=1)": "1"}
SIZES = ("stories260k", "2048x2")


def _cpu() -> str:
    names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
             if ln.startswith("model name")]
    return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} logical cores"


def _model(size: str, work: Path) -> str:
    """The ``--hf`` argument of ``size``: stories260K by its zoo name, or a random-weight checkpoint written once."""
    if size == "stories260k":
        return size
    import transformers

    from benchmarks.model_cards import write_random

    out = work / size
    if not (out / "config.json").is_file():
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                                       num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=256,
                                       tie_word_embeddings=False)
        write_random(cfg, out, 0)
    return str(out)


def run_once(hf: str, blocking: str) -> tuple[float, float, dict]:
    """(wall s, CPU-s of the `port` process, its JSON result without timings)."""
    env = dict(os.environ, MS_DEV_LAUNCH_BLOCKING=blocking, GLOG_v="3", PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "porting", "verify", "--hf", hf, "--seq", "8", "--generate", "40",
                        "--cache", "dynamic", "--json"], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"port verify --hf {hf} failed (MS_DEV_LAUNCH_BLOCKING={blocking}):\n{p.stderr[-2000:]}")
    doc = json.loads(p.stdout)
    doc.pop("seconds", None)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    args = ap.parse_args()
    print(f"CPU: {_cpu()}; load average at the start: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    with tempfile.TemporaryDirectory(prefix="pynative_pipeline.") as tmp:
        for size in args.sizes:
            hf = _model(size, Path(tmp))
            runs: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
            results = {}
            for _ in range(args.rounds):
                for mode, value in MODES.items():
                    wall, cpu, doc = run_once(hf, value)
                    runs[mode].append((wall, cpu))
                    results.setdefault(mode, doc)
                    if doc != results[mode]:
                        raise SystemExit(f"{size}: two runs in {mode} mode gave different results")
            same = len({json.dumps(d, sort_keys=True) for d in results.values()}) == 1
            print(f"\n`port verify --hf {size} --seq 8 --generate 40 --cache dynamic --json`, {args.rounds} round(s); "
                  f"results identical in both modes: {same}")
            print(f"{'mode':42} {'wall s (median)':>16} {'CPU-s (median)':>15}  each run (wall/CPU)")
            for mode, rows in runs.items():
                each = ", ".join(f"{w:.1f}/{c:.1f}" for w, c in rows)
                print(f"{mode:42} {statistics.median(w for w, _ in rows):16.2f} "
                      f"{statistics.median(c for _, c in rows):15.2f}  {each}")
            if not same:
                raise SystemExit(f"{size}: the two modes gave different results")


if __name__ == "__main__":
    main()
