"""Fingerprints of the data-parallel gradient all-reduce (the ``collective`` phase; the format:
porting/rundir/fingerprints.py, the reader: porting/diverge/compare.py, docs/diverge.md).

PyNative with port's overlapped buckets (porting/train/run/step/buckets.py ``OverlappedGradBuckets``: one
asynchronous all-reduce per bucket, launched during the backward) hands each bucket to :class:`CollectiveTap`
twice: its flat buffer just before the all-reduce is launched (:meth:`CollectiveTap.before`) and after the step
waited on its handle (:meth:`CollectiveTap.after`). At a sampled step ``before`` keeps a device copy of the buffer
(queued on the stream before the in-place all-reduce, so it holds this rank's local sum; no host sync there);
``after`` brings both to the host, which the wait on the handle and the gradient records' own host copies right
after it already synchronise, and records

- ``allreduce/bucket_<k>/input/dp_<d>``: this data-parallel rank's local bucket (every rank writes its own: the
  reader compares them rank by rank, never adds them);
- ``allreduce/bucket_<k>/output``: the summed bucket, by data-parallel rank 0 (every rank holds the same).

``PORT_TEST_PLANT_DIVERGENCE`` (porting/train/run/faults.py) plants here too: phase ``collective`` multiplies the
all-reduce output of the bucket holding the named gradient by 1+r on every rank (the inputs untouched: "inputs
matched, outputs did not"); phase ``gradient`` multiplies the named gradient as it enters its bucket, before the
all-reduce, on every rank (the sum is then (1+r) times the clean one, as the after-reduction plant of a run
without buckets; the collective's inputs differ).

Not recorded: graph mode (the buckets are inside the one-graph step), PyNative with gradient accumulation (its
buckets run after the backward, ``GradBuckets``), and ZeRO's reduce-scatter.
"""

from __future__ import annotations

from typing import Protocol

import mindspore as ms
import numpy as np

from porting.rundir import fingerprints as fp


class Recorder(Protocol):
    """What the tap reads of the rank's recorder (porting/train/run/fingerprint.py ``Fingerprinter``)."""

    plant: tuple | None      # (step, HF name, phase, relative)
    step_no: int             # the step running (1-based)
    sampled: bool            # whether it is recorded
    writer: fp.Writer | None
    names: list[str]         # the HF name of each trainable parameter, in the reducer's order


def host_float32(t) -> np.ndarray:
    """``t`` on the host in float32 (NumPy has no bfloat16); a float32 tensor's asnumpy() may share the tensor's
    memory, which a later step overwrites: read it before then. porting/train/run/fingerprint.py uses it too."""
    return (t.astype(ms.float32) if t.dtype != ms.float32 else t).asnumpy()


class CollectiveTap:
    """The recorder's hands on one reducer's buckets (``rec``: the rank's Fingerprinter, for its step, sampling,
    writer and plant)."""

    def __init__(self, rec: Recorder, bucket_idx: tuple[tuple[int, ...], ...], dp_rank: int, tp_rank: int | None):
        self.rec, self.idx, self.dp_rank, self.tp_rank = rec, bucket_idx, dp_rank, tp_rank
        self.bucket_of = {i: k for k, idx in enumerate(bucket_idx) for i in idx}
        self.meta = [{"first": rec.names[idx[0]], "last": rec.names[idx[-1]], "tensors": len(idx)}
                     for idx in bucket_idx]
        self.kept: dict[int, object] = {}

    def _planted(self, phase: str) -> tuple[int, float] | None:
        """(the planted gradient's index, relative) when this step plants ``phase``."""
        p = self.rec.plant
        if p is None or p[0] != self.rec.step_no or p[2] != phase:
            return None
        return self.rec.names.index(p[1]), p[3]

    def local(self, k: int, grads):
        """Bucket ``k``'s gradients as they enter its buffer (indexable by parameter): the planted one multiplied."""
        planted = self._planted("gradient")
        if planted is None or planted[0] not in self.idx[k]:
            return grads
        j, rel = planted
        out = {i: grads[i] for i in self.idx[k]}
        out[j] = out[j] * (1.0 + rel)
        return out

    def before(self, k: int, flat) -> None:
        """Bucket ``k``'s buffer before its all-reduce: a device copy kept at a sampled step."""
        if self.rec.sampled:
            self.kept[k] = flat.copy()

    def after(self, k: int, flat):
        """Bucket ``k``'s buffer after the wait on its all-reduce: recorded (with the kept input) at a sampled step,
        multiplied at the planted step; returns what the step uses."""
        planted = self._planted("collective")
        if planted is not None and self.bucket_of[planted[0]] == k:
            flat = flat * (1.0 + planted[1])
        kept = self.kept.pop(k, None)
        if self.rec.sampled and kept is not None:
            w, n = self.rec.writer, self.rec.step_no
            w.record(n, "collective", fp.collective_name(k, self.dp_rank, self.tp_rank), fp.stat_of(host_float32(kept)),
                     self.meta[k])
            if self.dp_rank == 0:
                w.record(n, "collective", fp.collective_name(k, None, self.tp_rank), fp.stat_of(host_float32(flat)),
                         self.meta[k])
        return flat
