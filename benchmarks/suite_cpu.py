"""The test suite's cost in CPU seconds, by file: what `PORT_TEST_CPU_LOG=FILE bash scripts/test.sh` recorded
(tests/conftest.py), summed, with each file's wall seconds beside it. CPU seconds count every process a test
waited for (msrun's workers included) and hold while other jobs load the machine, so two trees can be compared
on a busy machine; the suite's wall time on 2 cores is at least the total CPU seconds / 2.

    PORT_TEST_CPU_LOG=/tmp/cpu.jsonl bash scripts/test.sh
    python benchmarks/suite_cpu.py /tmp/cpu.jsonl [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    cpu: collections.Counter = collections.Counter()
    wall: collections.Counter = collections.Counter()
    n = 0
    with open(args.log, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            path = rec["test"].split("::")[0]
            cpu[path] += rec["cpu_s"]
            wall[path] += rec["wall_s"]
            n += 1
    total = sum(cpu.values())
    print(f"{n} tests, {total:,.0f} CPU-s in all ({total / 2:,.0f} s on 2 cores at best), "
          f"{sum(wall.values()):,.0f} wall-s summed over workers")
    print(f"{'CPU-s':>8} {'wall-s':>8}  file")
    for path, c in cpu.most_common(args.top):
        print(f"{c:8.1f} {wall[path]:8.1f}  {path}")


if __name__ == "__main__":
    main()
