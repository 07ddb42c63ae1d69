"""Output files written one tensor at a time: a ``.bin`` / ``.ckpt`` source (tensors loaded by torch /
MindSpore) to safetensors, and any source to MindSpore's ``.ckpt``. The safetensors -> safetensors fast
path is ``converters.shard_writer``; both are driven by ``converters.convert.execute``."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from converters import dtypes
from converters.fused import FusedInfo, PartInfo
from converters.layout import ConversionLayout, PlannedFile
from converters.safetensors_io import OutTensor, TensorInfo, write_all
from converters.sources import stream
from model_zoo.errors import CheckpointError


def tensor_record(o: OutTensor, digest: str, file: str, src: TensorInfo, src_file: str) -> dict:
    """The manifest's record of one output tensor and the source tensor it came from (a fused tensor's
    rows, or the parts a fused tensor was joined from: converters/fused.py)."""
    rec = {"name": o.name, "shape": list(o.shape), "dtype": o.dtype, "sha256": digest, "file": file,
           "source_name": src.name, "source_dtype": src.dtype, "source_file": src_file}
    if isinstance(src, PartInfo):
        rec["source_fused"] = {"name": src.fused_name, "rows": list(src.rows)}
    elif isinstance(src, FusedInfo):
        rec["source_parts"] = [p.name for p in src.parts]
    return rec


def write_loaded(plan: ConversionLayout, pf: PlannedFile, out_path: Path, progress) -> list[dict]:
    """A .bin / .ckpt source (tensors loaded by torch / MindSpore), or parts of a fused HF tensor stored
    apart, -> safetensors, chunk by chunk; a fused tensor's parts are held until the last one is read."""
    outs: dict[str, tuple[OutTensor, FusedInfo | None, int]] = {}
    for t, o in pf.tensors:
        for k, part in enumerate(t.parts if isinstance(t, FusedInfo) else (t,)):
            outs[part.name] = (o, t if isinstance(t, FusedInfo) else None, k)
    tensor_hash: dict[str, object] = {}
    held: dict[str, dict[int, list[bytes]]] = {}
    with open(out_path, "wb", buffering=0) as fo:
        write_all(fo, pf.header)
        for seg in stream(plan.source, pf.src):
            t = seg.tensor
            if t is not None and t.name in outs:
                o, group, k = outs[t.name]
                out = dtypes.cast_bytes(t.dtype, o.dtype, seg.view)
                if group is None:
                    tensor_hash.setdefault(t.name, hashlib.sha256()).update(out)
                    write_all(fo, out)
                else:
                    parts = held.setdefault(o.name, {})
                    parts.setdefault(k, []).append(bytes(out))
                    if sum(len(c) for cs in parts.values() for c in cs) == o.nbytes:   # the last part is in
                        data = b"".join(c for i in range(len(group.parts)) for c in parts.get(i, []))
                        tensor_hash.setdefault(o.name, hashlib.sha256()).update(data)
                        write_all(fo, data)
                        del held[o.name]
            progress(seg.view.nbytes)
        size = fo.tell()
    if size != pf.out_bytes:
        raise CheckpointError(f"{pf.src.path}: wrote {size} bytes to {out_path.name}, expected {pf.out_bytes}; "
                              "the source changed while it was read")
    return [tensor_record(o, tensor_hash.get(t.name, hashlib.sha256()).hexdigest(), pf.out_name, t, pf.src.name)
            for t, o in pf.tensors]


def _ms_numpy_dtype(code: str):
    import numpy as np

    if code == "BF16":
        from mindspore.common import np_dtype
        return np_dtype.bfloat16
    return {"F32": np.float32, "F16": np.float16}[code]


def write_ckpt(plan: ConversionLayout, pf: PlannedFile, out_path: Path, progress,
                hash_source: bool) -> tuple[str | None, list[dict]]:
    """MindSpore's own .ckpt writer, one shard in memory at a time (it needs whole tensors)."""
    import mindspore as ms
    import numpy as np

    outs = {t.name: (t, o) for t, o in pf.tensors}
    file_hash = hashlib.sha256() if plan.source.kind == "safetensors" and hash_source else None
    parts: dict[str, list[bytes]] = {}
    for seg in stream(plan.source, pf.src):
        t, chunk = seg.tensor, seg.view
        if file_hash is not None:
            file_hash.update(chunk)
        if t is not None and t.name in outs:
            parts.setdefault(t.name, []).append(bytes(dtypes.cast_bytes(t.dtype, outs[t.name][1].dtype, chunk)))
        progress(chunk.nbytes)
    records, to_save = [], []
    for t, o in pf.tensors:
        raw = b"".join(parts.pop(t.name, []))
        arr = np.frombuffer(raw, dtype=_ms_numpy_dtype(o.dtype)).reshape(o.shape)
        to_save.append({"name": o.name, "data": ms.Tensor(arr)})
        records.append(tensor_record(o, hashlib.sha256(raw).hexdigest(), pf.out_name, t, pf.src.name))
    try:
        ms.save_checkpoint(to_save, str(out_path), format="ckpt")
    except (RuntimeError, ValueError) as e:  # MindSpore wraps OSError; keep "disk full" recognisable
        if shutil.disk_usage(out_path.parent).free < sum(o.nbytes for _, o in pf.tensors):
            raise OSError(28, "No space left on device", str(out_path)) from None
        raise CheckpointError(f"{out_path}: MindSpore could not write the checkpoint ({str(e).splitlines()[0]})") from None
    return (file_hash.hexdigest() if file_hash else None), records
