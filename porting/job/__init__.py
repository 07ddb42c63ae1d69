"""The job document (``spec.py``: :class:`Job`, written to ``RUN/job.json`` and read by every rank) and what the
launcher needs from the layers above it (``hooks.py``: :class:`Hooks`). Below the CLI and the launch wing, above
``porting/train/`` and ``porting/rundir/``; nothing here starts a process or loads MindSpore."""

from porting.job.hooks import Hooks
from porting.job.spec import Job, JobError, Source, Start

__all__ = ["Hooks", "Job", "JobError", "Source", "Start"]
