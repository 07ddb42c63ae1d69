"""Intake of a team's existing CUDA job: its loss log as a baseline (``baseline_import``), its config as a
recipe (``recipe_import``), its scripts scanned for CUDA habits (``script_scan``), all three at once
(``job``). Nothing here imports or runs what it reads: logs and configs go through bounded parsers,
``training_args.bin`` through a restricted pickle reader (``pickle_reader``), scripts through ``ast``.
"""

from model_zoo.errors import PortingError


class IntakeError(PortingError):
    """A log, config or script of the team's job that port cannot read (one line: file, key, fix)."""
