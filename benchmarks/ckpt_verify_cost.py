"""What checking rank files before use costs a restore (per-chunk sha256 instead of whole files).

On a real per-rank checkpoint (``--checkpoint``; benchmarks/ckpt_io_speed.py makes a 1.43 GB TP 2 x DP 2
ZeRO-1 one, or any `port train` RUN/checkpoints/step_N), every rank of the checkpoint's own layout runs the
reads a same-layout resume makes (porting/train/run/checkpoint/read.py ``restore``'s calls: its TP-local weights
and its ZeRO share of the optimizer state), with the chunk check on and off. Reported per rank: the bytes it
uses, the bytes the chunk check hashes (every chunk it touches, once), the bytes a whole-file check would
hash (every file it touches, whole), and the seconds each way (page cache warm: the first pass is discarded).

    python benchmarks/ckpt_verify_cost.py --checkpoint RUN/checkpoints/step_1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank_pass(ck: Path, rank: int, verify: bool) -> dict:
    from porting.train.run.checkpoint import read as ckpt_read
    from porting.train.run.checkpoint.format import zero_ranges

    layout, _, table = ckpt_read.read_record(ck)
    src = ckpt_read.Source(ck, layout, table, verify)
    tp, t, d = layout.tp, rank % layout.tp, rank // layout.tp
    t0 = time.perf_counter()
    for spec in layout.params:
        src.assemble("param", spec.name, tp, t, 0, spec.local_numel(tp), spec.axis)
    opt = [(i, a, b) for _, i, a, b, _ in zero_ranges(layout, d)] if layout.zero else \
        [(i, 0, p.local_numel(tp)) for i, p in enumerate(layout.params)]
    for kind in layout.kinds[1:]:
        for i, a, b in opt:
            spec = layout.params[i]
            src.assemble(kind, spec.name, tp, t, a, b, spec.axis)
    sec = time.perf_counter() - t0
    touched = sum(table[n]["bytes"] for n in src.files._fds)
    src.files.close()
    return {"seconds": round(sec, 3), "used": src.files.bytes_read, "hashed": src.files.hashed_bytes,
            "whole_files": touched}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from porting.train.run.checkpoint.record import read_record

    layout, _, _ = read_record(args.checkpoint)
    rows = []
    for r in range(layout.world):
        rank_pass(args.checkpoint, r, True)   # warm the page cache
        on, off = rank_pass(args.checkpoint, r, True), rank_pass(args.checkpoint, r, False)
        rows.append({"rank": r, "used_bytes": on["used"], "hashed_bytes": on["hashed"],
                     "whole_file_check_bytes": on["whole_files"], "seconds_checked": on["seconds"],
                     "seconds_unchecked": off["seconds"]})
        x = rows[-1]
        print(f"rank {r}: uses {x['used_bytes']:,} bytes; the chunk check hashes {x['hashed_bytes']:,} "
              f"({x['hashed_bytes'] / x['used_bytes']:.3f}x); a whole-file check would hash "
              f"{x['whole_file_check_bytes']:,} ({x['whole_file_check_bytes'] / x['used_bytes']:.2f}x); "
              f"{x['seconds_checked']:.2f} s checked, {x['seconds_unchecked']:.2f} s unchecked")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
