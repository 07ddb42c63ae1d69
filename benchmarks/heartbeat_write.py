"""What a rank's heartbeat costs (porting/rundir/heartbeat.py): the time of one ``Heartbeat.beat`` (an atomic
replace of a ~100-byte record, no fsync) and of one ``read_beat``, on the disk that holds ``--dir``; beside it the
same record written with ``model_zoo.files.write_atomic`` (which fsyncs), the reason the heartbeat does not.

    python benchmarks/heartbeat_write.py --beats 500 --dir /tmp

A rank beats when it logs a line others read (a step line every ``logging.every_steps``, a save's start and
end, a phase change), never more often; the supervisor reads one record per rank every ``poll_s``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_zoo.files import write_atomic  # noqa: E402 (after the checkout is on sys.path)
from porting.rundir.heartbeat import Heartbeat, read_beat  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--beats", type=int, default=500)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        hb = Heartbeat(Path(d), 0)
        writes, reads, synced = [], [], []
        for n in range(args.beats):
            t0 = time.perf_counter()
            hb.beat("step", n)
            writes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert read_beat(Path(d) / "heartbeat" / "rank_0.json").step == n
            reads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            write_atomic(Path(d) / "synced.json", (Path(d) / "heartbeat" / "rank_0.json").read_bytes())
            synced.append(time.perf_counter() - t0)
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] * 1e3  # noqa: E731
    print(f"beat (write): median {statistics.median(writes) * 1e3:.3f} ms, p90 {q(writes, 0.9):.3f} ms; "
          f"read: median {statistics.median(reads) * 1e3:.3f} ms, p90 {q(reads, 0.9):.3f} ms; with fsync "
          f"(write_atomic): median {statistics.median(synced) * 1e3:.3f} ms, p90 {q(synced, 0.9):.3f} ms "
          f"({args.beats} beats)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
