"""Entry point of one rank: ``msrun ... train.py --run-dir RUN [--revision N] [--resume]`` (or the same without
msrun for a supervised one-device run).

The rank reads the run's job document (``RUN/job.json`` or revision N, porting/job/): the recipe resolved once by
`port train`, never the user's YAML file or a ``--set`` string, and runs :func:`porting.train.run.loop.train` on it.
msrun starts this file with the ``python`` on PATH; each worker finds its rank through MindSpore's ``init()``.
Errors print one line and exit non-zero, which makes ``msrun --join=True`` stop the other workers. Every worker
(and msrun's scheduler, which runs this script too) exits by itself once the `port` that launched it is gone
(porting/train/run/lifeline.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from porting.job import Job
    from porting.train.run.loop import RunResult


def run_rank(job: Job, resume: bool, distributed: bool) -> RunResult:
    """This rank's run of ``job`` (the one-device launch calls it in `port train`'s own process)."""
    from porting.train.run.loop import train
    from porting.train.run.records import Provenance

    prov = Provenance(job.source.command, job.environment, f"{job.run.path / 'job.json'} revision {job.revision}")
    return train(job.recipe, job.run.path, resume=resume, distributed=distributed, provenance=prov)


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[3]
    if str(root) not in sys.path:   # a source checkout run without installing the package
        sys.path.insert(0, str(root))
    from porting.train.run.lifeline import watch_parent  # deferred: sys.path holds the checkout only from here

    watch_parent()   # before anything slow: this process exits once the `port` that launched it is gone
    from model_zoo.errors import PortingError  # deferred: sys.path holds the checkout only from here
    from porting.job import Job  # deferred: sys.path holds the checkout only from here

    ap = argparse.ArgumentParser(prog="port-train-worker")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--revision", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    try:
        job = Job.read(args.run_dir, args.revision)
        run_rank(job, args.resume, distributed=job.recipe.world_size > 1)
    except PortingError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


def _exit(code: int) -> None:
    """Test hook (off unless set): ``PORT_TEST_CRASH_AT_EXIT=RANK`` (porting/train/run/faults.py) makes that rank's
    worker die by SIGSEGV after its run ended, as MindSpore's teardown at exit sometimes does (porting/rundir/ranklog.py
    FINISHED)."""
    from porting.train.run.faults import active  # deferred: sys.path holds the checkout only once main() ran

    crash = active().crash_at_exit if code == 0 else None
    if crash is not None and str(crash) == os.environ.get("RANK_ID"):
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
