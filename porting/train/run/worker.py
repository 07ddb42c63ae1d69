"""Entry point of one `msrun` worker: ``msrun ... worker.py --recipe R --run-dir D [--set k=v] [--resume]``.

msrun starts this file with the ``python`` on PATH; each worker finds its rank through MindSpore's
``init()`` and runs :func:`porting.train.run.loop.train`. Errors print one line and exit non-zero, which
makes ``msrun --join=True`` stop the other workers. Every worker (and msrun's scheduler, which runs this
script too) exits by itself once the `port` that launched it is gone (porting/train/run/lifeline.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parents[3]
    if str(root) not in sys.path:   # a source checkout run without installing the package
        sys.path.insert(0, str(root))
    from porting.train.run.lifeline import watch_parent  # deferred: sys.path holds the checkout only from here

    watch_parent()   # before anything slow: this process exits once the `port` that launched it is gone
    from model_zoo.errors import PortingError  # deferred: sys.path holds the checkout only from here
    from porting.diagnostics.doctor import doctor_report  # deferred: sys.path holds the checkout only from here
    from porting.train.recipe.schema import load_recipe  # deferred: sys.path holds the checkout only from here
    from porting.train.run.loop import train  # deferred: sys.path holds the checkout only from here

    ap = argparse.ArgumentParser(prog="port-train-worker")
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.set)
        train(recipe, args.run_dir, resume=args.resume, distributed=True,
              command=[sys.executable, *sys.argv], echo=True, doctor=doctor_report)
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
