"""Tensor dtypes as data, and the byte-level casts between the float formats checkpoints use.

Casts work on raw little-endian bytes, one chunk at a time, so a tensor never has to be held whole
in a wider format. bf16 is handled as 16-bit integers: NumPy has no bfloat16 of its own, and going
through fp32 is needed only when a cast is asked for.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where a cast happens: a plain copy never loads it (start-up time)
    import numpy as np


@dataclasses.dataclass(frozen=True)
class DType:
    code: str  # the safetensors spelling ("BF16")
    itemsize: int
    name: str  # the --dtype / torch / MindSpore spelling ("bfloat16")
    convertible: bool  # whether the converters move this dtype (floats only)


# Every dtype the safetensors format defines (sizes are needed to validate any header); only the
# float formats Llama checkpoints use are converted.
_ALL = [
    DType("F32", 4, "float32", True), DType("F16", 2, "float16", True), DType("BF16", 2, "bfloat16", True),
    DType("F64", 8, "float64", False), DType("I64", 8, "int64", False), DType("I32", 4, "int32", False),
    DType("I16", 2, "int16", False), DType("I8", 1, "int8", False), DType("U8", 1, "uint8", False),
    DType("U16", 2, "uint16", False), DType("U32", 4, "uint32", False), DType("U64", 8, "uint64", False),
    DType("BOOL", 1, "bool", False), DType("F8_E4M3", 1, "float8_e4m3fn", False),
    DType("F8_E5M2", 1, "float8_e5m2", False),
]
BY_CODE: dict[str, DType] = {d.code: d for d in _ALL}
BY_NAME: dict[str, DType] = {d.name: d for d in _ALL}
CONVERTIBLE = tuple(d.code for d in _ALL if d.convertible)

# --dtype choices -> safetensors code (None = keep the source dtype).
TARGETS: dict[str, str | None] = {"keep": None, "bf16": "BF16", "fp16": "F16", "fp32": "F32"}


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    import numpy as np

    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(raw: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch and MindSpore do; NaN stays a (quiet) NaN."""
    import numpy as np

    u = raw.view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(raw.view(np.float32))
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    return rounded


def _to_f32(code: str, raw: np.ndarray) -> np.ndarray:
    import numpy as np

    if code == "BF16":
        return _bf16_to_f32(raw)
    if code == "F16":
        return raw.view(np.float16).astype(np.float32)
    return raw.view(np.float32)


def _from_f32(code: str, f32: np.ndarray) -> np.ndarray:
    import numpy as np

    if code == "BF16":
        return _f32_to_bf16(f32)
    if code == "F16":
        with np.errstate(over="ignore"):  # beyond +-65504 becomes +-inf, as torch's cast does
            return f32.astype(np.float16)
    return f32


def cast_bytes(src_code: str, dst_code: str, chunk: memoryview | bytes) -> memoryview:
    """``chunk`` (whole elements of ``src_code``) as bytes of ``dst_code``; the same bytes when equal."""
    if src_code == dst_code:
        return chunk  # the very same view: no copy, and nothing extra pins the source's memory map
    import numpy as np

    raw = np.frombuffer(chunk, dtype=np.uint8)
    return memoryview(np.ascontiguousarray(_from_f32(dst_code, _to_f32(src_code, raw))).view(np.uint8))


def to_numpy_f32(code: str, raw: memoryview | bytes, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 copy of a raw tensor (bf16 widened exactly)."""
    import numpy as np

    arr = _to_f32(code, np.frombuffer(raw, dtype=np.uint8))
    return np.array(arr, dtype=np.float32, copy=True).reshape(shape)
