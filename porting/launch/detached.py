"""``python -m porting.launch.detached MSRUN_ARGV...``: one node's msrun launch run with ``--join=False``
(node k > 0 on a loopback master, porting/launch/msrun.py ``same_host_node_argv``), as one process that ends when
the node's workers end, with the first failing exit code. msrun itself returns once its workers are started;
this process adopts them as their subreaper (porting/launch/lifeline.py ``run_msrun``) and waits. `port train
--supervise` watches it like a joined msrun; a SIGTERM or SIGINT stops the workers it adopted."""

from __future__ import annotations

import os
import sys

from model_zoo.errors import PortingError
from porting.launch.lifeline import run_msrun


def _stop(proc, grace_s: float) -> None:   # msrun has returned by then: what is left is stopped by run_msrun
    del proc, grace_s


def main(argv: list[str]) -> int:
    if "--join=False" not in argv:
        print("error: porting.launch.detached runs a msrun command with --join=False only", file=sys.stderr)
        return 2
    try:   # the supervisor built this process's environment (porting/launch/children.py child_env)
        return run_msrun(argv, os.environ, stop=_stop)
    except PortingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
