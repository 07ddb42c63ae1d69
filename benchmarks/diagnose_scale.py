"""Benchmark: `port diagnose` on 4,096 ranks x 10,000 lines (target: <= 60 s, bounded memory).

Generates `port train`-style rank logs (``logs/rank_<r>.log``, every line
``YYYY-mm-ddTHH:MM:SS.mmm rank=<r> ...``) into /tmp: one rank stalls silently at step 9,000, every
other rank logs steps up to 9,000 then a collective timeout, and the ranks of one host have a clock
300 s ahead. Then it measures, in the same run:
  * reference: reading every byte of every file and counting lines (the I/O floor);
  * diagnose(): wall time, peak RSS of the parent and of the worker processes;
and checks that the diagnosis names the stalled rank and its last step.

    python benchmarks/diagnose_scale.py [--ranks 4096] [--lines 10000] [--dir /tmp/port_diag_bench]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STALL_STEP = 9000


def _write_rank(args: tuple[Path, int, int, int, int, int]) -> int:
    logs, r, lines, stalled, skew_host, per_host = args
    t0 = 1_795_000_000.0
    steps = min(STALL_STEP, lines - lines // 10 - 2)
    skew = 300.0 if r // per_host == skew_host else 0.0
    out = []
    step = 0
    i = 0
    while len(out) < lines - 2:
        if i % 10 == 9:
            t = t0 + step * 0.8 + 0.05 + skew
            out.append(f"{_fmt(t)} rank={r} INFO dataloader queue=8 pinned=True\n")
        elif step < steps:
            step += 1
            t = t0 + step * 0.8 + (r % 7) * 0.001 + skew
            out.append(f"{_fmt(t)} rank={r} step={step} loss={2.0 + 1.0 / step:.4f} lr=1.00e-04 "
                       f"grad_norm=0.8123 tokens_per_s=20345.1 step_time_s=0.800\n")
        else:
            t = t0 + step * 0.8 + 1 + skew
            out.append(f"{_fmt(t)} rank={r} INFO waiting for step {step + 1} batch\n")
        i += 1
    if r != stalled:
        t = t0 + step * 0.8 + 1800 + skew
        out.append(f"{_fmt(t)} rank={r} ERROR collective AllReduce timed out after 1800 s waiting for peers "
                   f"(HCCL_EXEC_TIMEOUT) ERR02200\n")
    (logs / f"rank_{r}.log").write_text("".join(out))
    return len(out)


def generate(root: Path, ranks: int, lines: int, stalled: int, skew_host: int,
             per_host: int = 16) -> tuple[int, int]:
    """Rank logs in parallel (not timed). The ranks of host ``skew_host`` run 300 s ahead."""
    from concurrent.futures import ProcessPoolExecutor

    logs = root / "logs"
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    with ProcessPoolExecutor() as pool:
        total = sum(pool.map(_write_rank, [(logs, r, lines, stalled, skew_host, per_host) for r in range(ranks)],
                             chunksize=64))
    return total, min(STALL_STEP, lines - lines // 10 - 2)


def _fmt(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}"


def _cpu_s() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def read_all(logs: Path) -> tuple[float, int, int]:
    t = time.perf_counter()
    n = 0
    size = 0
    for p in logs.iterdir():
        with open(p, "rb") as f:
            while True:
                b = f.read(4 << 20)
                if not b:
                    break
                n += b.count(b"\n")
                size += len(b)
    return time.perf_counter() - t, n, size


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--lines", type=int, default=10000)
    ap.add_argument("--dir", default="/tmp/port_diag_bench")
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    ap.add_argument("--reuse", action="store_true", help="reuse logs kept by an earlier --keep run")
    args = ap.parse_args()
    root = Path(args.dir)
    stalled = args.ranks * 2 // 3
    t = time.perf_counter()
    logs = root / "logs"
    if args.reuse and logs.is_dir() and len(os.listdir(logs)) == args.ranks:
        total, last_step = -1, min(STALL_STEP, args.lines - args.lines // 10 - 2)
    else:
        total, last_step = generate(root, args.ranks, args.lines, stalled, skew_host=1)
    print(f"generated {args.ranks} ranks x ~{args.lines} lines ({total:,} lines) in {time.perf_counter() - t:.1f} s")
    ref_s, nlines, size = read_all(root / "logs")
    print(f"reference (read + count lines): {ref_s:.2f} s, {nlines:,} lines, {size / 2**30:.2f} GiB", flush=True)

    from porting.diagnostics.diagnose import diagnose

    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # imports (model_zoo pulls MindSpore)
    load0 = os.getloadavg()[0]
    cpu0 = _cpu_s()
    t = time.perf_counter()
    d = diagnose(root / "logs")
    wall = time.perf_counter() - t
    cpu = _cpu_s() - cpu0
    print(f"load average (1 min) before/after: {load0:.1f}/{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"diagnose used {cpu:.1f} CPU-s (parent + workers) = {cpu / min(os.cpu_count() or 1, 8):.1f} s on idle cores")
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"diagnose: {wall:.2f} s wall ({wall / ref_s:.2f}x the read-only reference), "
          f"peak RSS parent {self_rss:.0f} MiB ({self_rss - base_rss:+.0f} MiB over the {base_rss:.0f} MiB after "
          f"imports), largest worker {child_rss:.0f} MiB", flush=True)
    print(f"verdict: rank {d['first_failing_rank']} last step {d['last_step']} ({d['reason_kind']}); "
          f"skew warnings: {sum('clock differs' in w for w in d['warnings'])}")
    ok = d["first_failing_rank"] == stalled and d["last_step"] == last_step and wall <= 60
    print("PASS" if ok else f"FAIL (expected rank {stalled} step {last_step}, <= 60 s)")
    if not args.keep:
        shutil.rmtree(root / "logs", ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
