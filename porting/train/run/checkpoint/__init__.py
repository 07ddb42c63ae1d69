"""One rank's checkpoints and what is made from them: the per-rank format (``format``: every rank writes what it
owns; ``record``: the layout record, read and bounded), saving and keeping the last K (``save``), reading into any
layout and restoring (``read``), the run directory's checks before a resume (``resume_check``), and the offline
work on a checkpoint (``merge``: full weights, reshard) and the HF export (``export``)."""
