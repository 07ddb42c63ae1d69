"""Packing (``batching.packing: true``) at scale, side by side: the one-by-one first-fit scan port used
before issue 27 (a scan of every row per example, quadratic in the number of examples) against the
O(n log n) segment-tree first fit of porting/train/data/packing.py; then what ``port train --dry-run``
does with the packed plan after tokenising (``build_plan`` on 1M tokenised examples: slot choice,
packing, the epoch's global batches). Lengths are random in [20, 400) tokens, rows of 2,048.

    python benchmarks/packing_scale.py                 # markdown table (BENCHMARKS.md, "Packing")
    python benchmarks/packing_scale.py --sizes 1000,1000000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SEQ = 2048
OLD_LIMIT = 20_000   # the quadratic scan is timed up to here (it took ~4 s at 10k; hours at 1M)


def old_pack_rows(lengths: np.ndarray, seq: int, slots: int, seed: int) -> list[list[int]]:
    """packing.pack_rows as of commit ac6ffeb (before issue 27), verbatim but for the error check."""
    tie = np.random.default_rng([seed, 7]).permutation(len(lengths))
    order = np.lexsort((tie, -np.asarray(lengths)))
    used = np.zeros(0, dtype=np.int64)
    count = np.zeros(0, dtype=np.int64)
    rows: list[list[int]] = []
    for i in order:
        n = int(lengths[i])
        fits = np.flatnonzero((count < slots) & (used + n <= seq))
        if fits.size:
            r = int(fits[0])
        else:
            r = len(rows)
            rows.append([])
            used, count = np.append(used, 0), np.append(count, 0)
        rows[r].append(int(i))
        used[r] += n
        count[r] += 1
    return rows


def old_choose_and_pack(lengths: np.ndarray, seq: int, seed: int) -> list[list[int]]:
    from porting.train.data import packing

    best = min(packing.SLOT_CHOICES, key=lambda k: (len(old_pack_rows(lengths, seq, k, seed))
                                                    * packing.row_length(seq, k), packing.SLOT_CHOICES.index(k)))
    return old_pack_rows(lengths, seq, best, seed)


def new_choose_and_pack(lengths: np.ndarray, seq: int, seed: int) -> list[list[int]]:
    from porting.train.data import packing

    return packing.pack_rows(lengths, seq, packing.choose_slots(lengths, seq, seed), seed)


def dry_run_plan(n: int) -> tuple[float, int]:
    """build_plan with packing on n tokenised examples (what --dry-run runs after the tokenizer)."""
    from porting.train.data.batching import build_plan
    from porting.train.data.examples import DataReport, Example, TokenizedData
    from porting.train.recipe.schema import validate_recipe

    lengths = np.random.default_rng(1).integers(20, 400, n)
    examples = [Example(np.ones(k, np.int32), np.ones(k, np.int32), i + 1) for i, k in enumerate(lengths)]
    data = TokenizedData(examples, DataReport(path="synthetic", sha256="-", format="text"), 0)
    recipe = validate_recipe({"model": {"source": "stories260k"}, "data": {"path": "synthetic", "max_seq_length": SEQ},
                              "batching": {"micro_batch_size": 1, "packing": True,
                                           "bucketing": {"boundaries": []}}}, check_files=False)
    t = time.perf_counter()
    plan = build_plan(recipe, None, data=data)
    return time.perf_counter() - t, len(plan.rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2000,10000,20000,1000000")
    args = ap.parse_args()
    print(f"| examples | before: one-by-one scan (s) | now: segment tree (s) | rows | same rows |")
    print("|---:|---:|---:|---:|:---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        lengths = np.random.default_rng(0).integers(20, 400, n)
        t = time.perf_counter()
        new = new_choose_and_pack(lengths, SEQ, 0)
        t_new = time.perf_counter() - t
        if n <= OLD_LIMIT:
            t = time.perf_counter()
            old = old_choose_and_pack(lengths, SEQ, 0)
            t_old, same = f"{time.perf_counter() - t:.2f}", "yes" if old == new else "NO"
        else:
            t_old, same = "not run (hours)", "-"
        print(f"| {n:,} | {t_old} | {t_new:.2f} | {len(new):,} | {same} |")
    secs, rows = dry_run_plan(1_000_000)
    print(f"\nbuild_plan with packing on 1,000,000 tokenised examples (the dry run's plan): {secs:.1f} s, {rows:,} rows")


if __name__ == "__main__":
    main()
