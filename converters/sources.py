"""What a checkpoint directory holds: its files in order, every tensor's name/dtype/shape, and how
to stream each file's bytes. Three kinds, found by the files present (a table, not a chain of ifs):
safetensors (single or sharded with an index), PyTorch ``.bin`` (read with ``weights_only=True``, so
a pickle that would run code is refused, never run) and MindSpore ``.ckpt``.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import re
from pathlib import Path
from typing import Callable, Iterator

from converters import dtypes, fused
from converters.safetensors_io import (
    CHUNK_BYTES,
    Header,
    MappedFile,
    TensorInfo,
    read_header,
)
from model_zoo.errors import CheckpointError
from model_zoo.files import read_json_object

# Index file written beside sharded MindSpore checkpoints: {param name: file} (MindFormers' convention
# for a unified safetensors directory).
MS_INDEX = "param_name_map.json"
MANIFEST = "port_manifest.json"


@dataclasses.dataclass(frozen=True)
class SourceFile:
    name: str  # relative to the directory
    path: Path
    tensors: tuple[TensorInfo, ...]  # in data order (offsets are meaningful for safetensors only)
    metadata: dict[str, str] | None = None
    header_bytes: int | None = None  # where the data starts (safetensors only)


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str  # "safetensors" | "bin" | "ckpt"
    dir: Path
    files: tuple[SourceFile, ...]
    index_name: str | None  # the index file, when sharded
    index_metadata: dict | None

    def tensor_names(self) -> list[str]:
        return [t.name for f in self.files for t in f.tensors]

    @property
    def total_bytes(self) -> int:
        return sum(f.path.stat().st_size for f in self.files)


# ------------------------------------------------------------------------------------------ discovery
def _read_index(path: Path) -> tuple[dict[str, str], dict | None]:
    raw = read_json_object(path, what="safetensors index", error=CheckpointError)
    wm = raw.get("weight_map")
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise CheckpointError(f"{path}: has no weight_map {{tensor: file}}; the index is corrupt, re-export it")
    return wm, raw.get("metadata")


def _shard_names(index: Path, weight_map: dict[str, str]) -> list[str]:
    names = list(dict.fromkeys(sorted(weight_map.values())))
    for n in names:
        if Path(n).name != n:
            raise CheckpointError(f"{index}: shard {n!r} is not a plain file name in this directory")
        if not (index.parent / n).is_file():
            raise CheckpointError(f"{index.parent / n}: shard named by {index.name} is missing (tensor "
                                  f"{min(k for k, v in weight_map.items() if v == n)}); re-download the "
                                  "checkpoint or fix the index")
    return names


def _check_index_matches(index: Path, weight_map: dict[str, str], files: list[SourceFile]) -> None:
    actual = {t.name: f.name for f in files for t in f.tensors}
    for name, fname in sorted(weight_map.items()):
        if actual.get(name) != fname:
            where = f"found in {actual[name]}" if name in actual else "found in no shard"
            raise CheckpointError(f"{index}: tensor {name} is listed in {fname} but {where}; the index and the "
                                  "shards disagree, re-download the checkpoint")
    extra = sorted(set(actual) - set(weight_map))
    if extra:
        raise CheckpointError(f"{index.parent / actual[extra[0]]}: tensor {extra[0]} is not in {index.name} "
                              f"({len(extra)} such tensor(s)); the index and the shards disagree")


def _safetensors_file(d: Path, name: str) -> SourceFile:
    h: Header = read_header(d / name)
    return SourceFile(name, d / name, h.tensors, h.metadata, h.header_bytes)


def _torch_load(path: Path):
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: refused: its pickle holds more than tensors and would run code on load "
                              f"({first[:160]}); port reads .bin files with torch.load(weights_only=True) only. "
                              "Use the model's safetensors files, or convert this file with code you trust") from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read as a PyTorch checkpoint ({str(e).splitlines()[0][:160]}); "
                              "the file is truncated or corrupt") from None


_TORCH_CODES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16",
                "torch.float64": "F64", "torch.int64": "I64", "torch.int32": "I32", "torch.int8": "I8",
                "torch.uint8": "U8", "torch.bool": "BOOL", "torch.int16": "I16"}


def _bin_file(d: Path, name: str) -> SourceFile:
    import torch

    state = _torch_load(d / name)
    if not isinstance(state, dict):
        raise CheckpointError(f"{d / name}: holds a {type(state).__name__}, expected a state dict {{name: tensor}}")
    infos = []
    for k, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{d / name}: tensor {k}: holds a {type(t).__name__}, expected a tensor")
        code = _TORCH_CODES.get(str(t.dtype))
        if code is None:
            raise CheckpointError(f"{d / name}: tensor {k}: unsupported dtype {t.dtype}; expected one of "
                                  f"{', '.join(dtypes.CONVERTIBLE)}")
        infos.append(TensorInfo(k, code, tuple(t.shape), 0, t.numel() * t.element_size()))
    return SourceFile(name, d / name, tuple(infos))


def _ms_dtype_code(dtype) -> str | None:
    return {"Float32": "F32", "Float16": "F16", "BFloat16": "BF16", "Float64": "F64", "Int64": "I64",
            "Int32": "I32", "Int8": "I8", "UInt8": "U8", "Bool": "BOOL", "Int16": "I16"}.get(str(dtype))


def _load_ckpt(path: Path) -> dict:
    import mindspore as ms

    try:
        return ms.load_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{path}: cannot read as a MindSpore checkpoint ({str(e).splitlines()[0][:160]}); "
                              "the file is truncated or corrupt") from None


def _ckpt_file(d: Path, name: str) -> SourceFile:
    params = _load_ckpt(d / name)
    infos = []
    for k, p in params.items():
        code = _ms_dtype_code(p.dtype)
        if code is None:
            raise CheckpointError(f"{d / name}: tensor {k}: unsupported dtype {p.dtype}; expected one of "
                                  f"{', '.join(dtypes.CONVERTIBLE)}")
        infos.append(TensorInfo(k, code, tuple(p.shape), 0, math.prod(p.shape) * dtypes.BY_CODE[code].itemsize))
    return SourceFile(name, d / name, tuple(infos))


_READERS: dict[str, Callable[[Path, str], SourceFile]] = {
    "safetensors": _safetensors_file, "bin": _bin_file, "ckpt": _ckpt_file}

# (index file, single file, kind) in order of preference; HF prefers safetensors when both exist.
HF_LAYOUTS = [("model.safetensors.index.json", "model.safetensors", "safetensors"),
              ("pytorch_model.bin.index.json", "pytorch_model.bin", "bin")]


def open_hf(d: Path) -> Source:
    """The HF checkpoint in ``d`` (safetensors preferred over .bin when both are present). A fused-weight
    family's ``qkv_proj`` / ``gate_up_proj`` are shown as the separate weights they stack
    (:func:`converters.fused.unfuse_tensors`)."""
    d = Path(d)
    for index_name, single, kind in HF_LAYOUTS:
        index = d / index_name
        if index.is_file():
            wm, meta = _read_index(index)
            files = [_READERS[kind](d, n) for n in _shard_names(index, wm)]
            _check_index_matches(index, wm, files)
            return _unfused(Source(kind, d, tuple(files), index_name, meta))
        if (d / single).is_file():
            return _unfused(Source(kind, d, (_READERS[kind](d, single),), None, None))
    raise CheckpointError(f"{d}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
                          "pytorch_model.bin.index.json; expected an HF model directory (save_pretrained writes one)")


def _unfused(src: Source) -> Source:
    """``src`` with the fused tensors of its family (config.json's model_type) read as their parts. A fused
    family's checkpoint holding the parts apart (Llama-style weights labelled phi3) is refused: transformers'
    Phi3ForCausalLM cannot load it, so port converts none of it."""
    has_fused = any(fused.parts_of_any(t.name) for f in src.files for t in f.tensors)
    if not has_fused and not (src.dir / "config.json").is_file():
        return src
    from model_zoo.config import LlamaConfig

    cfg = LlamaConfig.from_hf(src.dir)
    if cfg.model_type not in fused.FUSED:
        return src   # the coverage check names the tensors this family does not have
    apart = fused.separate_parts(cfg, [t.name for f in src.files for t in f.tensors])
    if apart:
        raise CheckpointError(f"{src.dir}: model_type {cfg.model_type!r} stores fused tensors ("
                              f"{', '.join(t.replace('{}', 'N') for t in fused.FUSED[cfg.model_type])}), but the "
                              f"checkpoint holds {len(apart)} separate one(s) such as {apart[0]}; transformers' "
                              f"{cfg.model_type} model cannot load it. If these are Llama-style weights, set "
                              "model_type to llama in config.json")
    if src.kind != "safetensors":
        raise CheckpointError(f"{src.dir}: a {cfg.model_type} checkpoint with fused weights in .bin files; port reads "
                              "fused tensors from safetensors (byte ranges): re-save it with transformers' "
                              "save_pretrained (safetensors is its default)")
    files = tuple(dataclasses.replace(f, tensors=fused.unfuse_tensors(cfg, f.tensors, str(f.path))) for f in src.files)
    return dataclasses.replace(src, files=files)


def open_ms(d: Path) -> Source:
    """The MindSpore checkpoint in ``d``: *.safetensors or *.ckpt files, with param_name_map.json when sharded."""
    d = Path(d)
    found = {kind: sorted(p.name for p in d.glob(f"*.{kind}")) for kind in ("safetensors", "ckpt")}
    kinds = [k for k, v in found.items() if v]
    if not kinds:
        raise CheckpointError(f"{d}: no *.safetensors or *.ckpt files; expected a MindSpore checkpoint directory "
                              "(port convert --hf writes one)")
    if len(kinds) > 1:
        raise CheckpointError(f"{d}: holds both .safetensors and .ckpt files; expected one format, move one away")
    kind = kinds[0]
    index = d / MS_INDEX
    if index.is_file():
        wm = read_json_object(index, what="MindSpore index {param name: file}", error=CheckpointError)
        names = _shard_names(index, wm)
        files = [_READERS[kind](d, n) for n in names]
        _check_index_matches(index, wm, files)
        return Source(kind, d, tuple(files), MS_INDEX, None)
    if len(found[kind]) > 1:
        raise CheckpointError(f"{d}: {len(found[kind])} .{kind} files but no {MS_INDEX}; expected one file, or an "
                              "index naming the file of every parameter")
    return Source(kind, d, (_READERS[kind](d, found[kind][0]),), None, None)


# ------------------------------------------------------------------------------------------ streaming
@dataclasses.dataclass
class Segment:
    """A piece of a source file: ``tensor`` is None for the header and gaps. ``mapped``/``offset`` say
    where the bytes lie when the file is memory-mapped (safetensors sources), so they can be copied
    kernel-side and hashed from the mapping after the generator has moved on."""

    tensor: TensorInfo | None
    view: memoryview
    mapped: MappedFile | None = None
    offset: int = 0


def stream_safetensors(f: SourceFile, chunk: int = CHUNK_BYTES) -> Iterator[Segment]:
    """Every byte of the file in order, as Segments. Hashing every view gives the file's sha256 in the
    same single pass."""
    with MappedFile(f.path) as mf:
        pos = 0
        spans = []
        for t in f.tensors:
            if t.begin > pos:
                spans.append((None, pos, t.begin))
            spans.append((t, t.begin, t.end))
            pos = t.end
        if mf.size > pos:
            spans.append((None, pos, mf.size))
        for t, begin, end in spans:
            off = begin
            for c in mf.chunks(begin, end, chunk):
                yield Segment(t, c, mf, off)
                off += c.nbytes


def _raw_torch(t) -> memoryview:
    import torch

    flat = t.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def _raw_ms(p) -> memoryview:
    return memoryview(p.asnumpy().tobytes())


def stream_loaded(f: SourceFile, kind: str, chunk: int = CHUNK_BYTES) -> Iterator[Segment]:
    """Tensor chunks of a .bin (memory-mapped by torch) or .ckpt (loaded by MindSpore) file."""
    state = _torch_load(f.path) if kind == "bin" else _load_ckpt(f.path)
    to_raw = _raw_torch if kind == "bin" else _raw_ms
    for t in f.tensors:
        raw = to_raw(state.pop(t.name))
        for i in range(0, max(raw.nbytes, 1), chunk):
            yield Segment(t, raw[i:i + chunk])


def stream(src: Source, f: SourceFile, chunk: int = CHUNK_BYTES) -> Iterator[Segment]:
    if src.kind == "safetensors":
        return stream_safetensors(f, chunk)
    return stream_loaded(f, src.kind, chunk)


# ------------------------------------------------------------------------------ digests known already
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _hf_cache_blob(path: Path) -> str | None:
    """The HF hub cache stores an LFS file as ``blobs/<sha256>`` and the snapshot file is a symlink to it
    (non-LFS files are named by their 40-hex git sha1 and do not qualify)."""
    if not path.is_symlink():
        return None
    target = path.resolve()
    if target.parent.name == "blobs" and _SHA256.fullmatch(target.name) and target.is_file():
        return target.name
    return None


def _hf_local_dir_metadata(path: Path) -> str | None:
    """``huggingface-cli download --local-dir D`` leaves ``D/.cache/huggingface/download/<file>.metadata``:
    commit, etag (the sha256 for LFS files), download time. Like huggingface_hub itself, the record counts
    only while the file has not been modified since (mtime at most 1 s after the recorded time)."""
    meta = path.parent / ".cache" / "huggingface" / "download" / f"{path.name}.metadata"
    try:
        lines = meta.read_text().splitlines()
        etag, stamp = lines[1].strip().strip('"'), float(lines[2])
    except (OSError, IndexError, ValueError, UnicodeDecodeError):
        return None
    if not _SHA256.fullmatch(etag) or path.stat().st_mtime - 1 > stamp:
        return None
    return etag


# How a source file's sha256 can be known without reading it, in order of preference. Either record is
# written by huggingface_hub from the server's LFS pointer; `port verify --rehash-source` recomputes it.
KNOWN_SHA256: tuple[tuple[str, Callable[[Path], str | None]], ...] = (
    ("hf-cache-blob", _hf_cache_blob), ("hf-local-dir-metadata", _hf_local_dir_metadata))


def known_sha256(path: Path) -> tuple[str, str] | None:
    """(sha256, how it is known) when the HF download tooling recorded the file's digest, else None."""
    for how, find in KNOWN_SHA256:
        digest = find(Path(path))
        if digest is not None:
            return digest, how
    return None


class TensorReader:
    """Random access to the tensors of a Source by name, in element-count chunks (for comparisons).
    safetensors files stay memory-mapped; a .bin/.ckpt file is loaded when first needed, one at a time."""

    def __init__(self, src: Source):
        self.src = src
        self.where = {t.name: (f, t) for f in src.files for t in f.tensors}
        self._maps: dict[Path, MappedFile] = {}
        self._loaded: tuple[Path, dict] | None = None

    def info(self, name: str) -> TensorInfo:
        return self.where[name][1]

    def file_of(self, name: str) -> SourceFile:
        return self.where[name][0]

    def chunks(self, name: str, elems: int = CHUNK_BYTES // 8) -> Iterator[memoryview]:
        f, t = self.where[name]
        step = elems * dtypes.BY_CODE[t.dtype].itemsize
        if self.src.kind == "safetensors":
            mf = self._maps.get(f.path) or self._maps.setdefault(f.path, MappedFile(f.path))
            yield from mf.chunks(t.begin, t.end, step)
            return
        if self._loaded is None or self._loaded[0] != f.path:
            self._loaded = None
            self._loaded = (f.path, _torch_load(f.path) if self.src.kind == "bin" else _load_ckpt(f.path))
        raw = (_raw_torch if self.src.kind == "bin" else _raw_ms)(self._loaded[1][name])
        for i in range(0, raw.nbytes, step):
            yield raw[i:i + step]

    def close(self) -> None:
        for mf in self._maps.values():
            mf.close()
        self._maps.clear()
        self._loaded = None

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def equal_bytes(a: memoryview | bytes, b: memoryview | bytes) -> bool:
    """Byte equality at memory speed (8 bytes per compare; plain == on views is 10x slower)."""
    import numpy as np

    if len(a) != len(b):
        return False
    n = len(a) - len(a) % 8
    x, y = np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8)
    return bool(np.array_equal(x[:n].view(np.uint64), y[:n].view(np.uint64)) and np.array_equal(x[n:], y[n:]))


def files_equal(p: Path, q: Path) -> bool:
    """Whole-file byte equality, streamed."""
    if p.stat().st_size != q.stat().st_size:
        return False
    with MappedFile(p) as a, MappedFile(q) as b:
        return all(equal_bytes(x, y) for x, y in zip(a.chunks(0, a.size), b.chunks(0, b.size)))
