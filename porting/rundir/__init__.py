"""The run directory of `port train`: its records, their one writer and their one reader.

A run directory holds ``manifest.json`` (:class:`RunManifest`: what ran, with which versions, recipe,
model and data), ``metrics.jsonl`` (one :class:`StepRecord` per optimizer step, then one
:class:`SummaryRecord`), ``plan.json`` (the dry-run plan), ``logs/``, ``checkpoints/`` and ``hf/``.
The format is documented once, in docs/rundir.md; ``FORMAT_VERSION`` is written into the manifest
and the summary.

Reading rules (the same for `port report`, `port compare`, the logits probe and the tests):

* A step that appears more than once (a resumed run re-runs the steps after its checkpoint) counts
  once: the **last** record of that step wins. Steps come back in step order.
* A line of ``metrics.jsonl`` that is not a valid record (cut by a kill mid-write, not UTF-8, not
  JSON, not an object, a known key of the wrong type) is **skipped and counted**; the reader says
  how many and which was first (:attr:`Metrics.warning`). Nothing is silently dropped.
* Everything is bounded: the manifest by ``model_zoo.files`` (size, JSON depth), every metrics line
  by :data:`MAX_LINE_BYTES` and :data:`MAX_RECORD_DEPTH`, the metrics file by :data:`MAX_METRICS_BYTES`.

The records are in :mod:`porting.rundir.records`, the writer in :mod:`porting.rundir.writer`, the reader in
:mod:`porting.rundir.reader`; import them from here.
"""

from porting.rundir.reader import Metrics, RunRecords, read_manifest, read_metrics, read_run
from porting.rundir.records import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    MAX_LINE_BYTES,
    MAX_METRICS_BYTES,
    MAX_RECORD_DEPTH,
    METRICS_FILE,
    PLAN_FILE,
    ModelInfo,
    RunDirError,
    RunManifest,
    StepRecord,
    SummaryRecord,
    finite,
)
from porting.rundir.paths import RunDir
from porting.rundir.writer import MetricsWriter, check_side_paths, write_manifest

__all__ = ["FORMAT_VERSION", "MANIFEST_FILE", "MAX_LINE_BYTES", "MAX_METRICS_BYTES", "MAX_RECORD_DEPTH",
           "METRICS_FILE", "PLAN_FILE", "Metrics", "MetricsWriter", "ModelInfo", "RunDirError", "RunManifest",
           "RunDir", "RunRecords", "StepRecord", "SummaryRecord", "finite", "read_manifest", "read_metrics", "read_run",
           "check_side_paths", "write_manifest"]
