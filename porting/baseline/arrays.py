"""Exact, compact arrays inside JSON: ``{"dtype", "shape", "b64"}`` (little-endian raw bytes, base64).

Per-step curves stay plain JSON lists so people can read them; large tensors such as probe logits
use this form so a float32 round-trips bit for bit and a 32k-vocab probe stays a few megabytes.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

ALLOWED_DTYPES = ("float32", "float16", "int32", "int64")


def encode(arr: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(arr)
    if a.dtype.name not in ALLOWED_DTYPES:
        a = a.astype(np.float32)
    return {"dtype": a.dtype.name, "shape": list(a.shape),
            "b64": base64.b64encode(a.astype(a.dtype.newbyteorder("<")).tobytes()).decode("ascii")}


def decode(obj: Any, where: str) -> np.ndarray:
    """The array stored by :func:`encode`; ``ValueError`` naming ``where`` when it is malformed."""
    if not isinstance(obj, dict) or not {"dtype", "shape", "b64"} <= set(obj):
        raise ValueError(f"{where}: expected an encoded array {{dtype, shape, b64}}")
    if obj["dtype"] not in ALLOWED_DTYPES:
        raise ValueError(f"{where}: dtype {obj['dtype']!r} is not one of {', '.join(ALLOWED_DTYPES)}")
    try:
        raw = base64.b64decode(obj["b64"], validate=True)
        arr = np.frombuffer(raw, dtype=np.dtype(obj["dtype"]).newbyteorder("<"))
        return arr.reshape([int(n) for n in obj["shape"]]).astype(obj["dtype"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: cannot decode ({e})") from None
