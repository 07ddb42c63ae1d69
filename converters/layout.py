"""The records of one conversion, checked before any write: its :class:`Direction` (HF -> MS or back, as
data), every output file (:class:`PlannedFile`) and the whole :class:`ConversionLayout`. ``converters.convert``
makes them; ``converters.tensor_writer`` and ``converters.shard_writer`` write what they describe."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from converters.safetensors_io import OutTensor, TensorInfo, encode_header
from converters.sources import Source, SourceFile
from model_zoo.config import LlamaConfig


@dataclasses.dataclass(frozen=True)
class Direction:
    """What differs between HF -> MS and MS -> HF, as data."""

    name: str
    table: Callable[[LlamaConfig], dict[str, str]]
    ignored: Callable[[str], bool]
    expected_shapes: Callable[[LlamaConfig], dict[str, tuple[int, ...]]]  # source-side names
    out_metadata: dict[str, str]
    opener: Callable[[Path], Source]
    # pad output headers so the data sits at the source's offset within a page (cheaper kernel copies);
    # off for MS -> HF, whose headers must come out byte-identical to the original HF files
    align_headers: bool


@dataclasses.dataclass(frozen=True)
class PlannedFile:
    src: SourceFile
    out_name: str
    tensors: tuple[tuple[TensorInfo, OutTensor], ...]  # (source, output) in source data order
    skipped: tuple[str, ...]  # source tensors deliberately not converted (listed in the manifest)
    metadata: dict[str, str]
    align_with: int | None = None  # the source header length to align the output's data with

    @property
    def header(self) -> bytes:
        return encode_header([o for _, o in self.tensors], self.metadata, self.align_with)

    @property
    def out_bytes(self) -> int:
        return len(self.header) + sum(o.nbytes for _, o in self.tensors)


@dataclasses.dataclass(frozen=True)
class ConversionLayout:
    """Every output file and tensor of one conversion, checked against config.json before any write."""

    direction: Direction
    source: Source
    cfg: LlamaConfig
    out_format: str
    target_dtype: str | None
    files: tuple[PlannedFile, ...]
    index_metadata: dict | None  # for an HF index (restored on MS -> HF when known)
    config_path: Path | None = None  # the config.json read (copied into the output)
