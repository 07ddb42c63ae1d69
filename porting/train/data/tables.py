"""Tables users bring as training data: HF ``datasets`` directories (``Dataset.save_to_disk``) and
Parquet files, read offline into rows, confined and bounded before a row is decoded.

Three things are checked before anything is materialised (docs/promises.md, section 7):

* **Confinement.** A datasets directory names its files in JSON: ``dataset_dict.json``'s ``splits``
  (sub-directories) and each split's ``state.json`` ``_data_files[*].filename`` (Arrow files). Every such
  name is a plain name inside its directory (:func:`model_zoo.files.plain_name`) and a regular file or
  directory, not a link, so ``../outside.arrow`` or ``/etc/x`` is refused and every file that feeds
  training lies inside ``data.path``, where :func:`data_sha256` digests it. The Arrow files are read here
  with pyarrow (the streaming IPC format ``save_to_disk`` writes), not through ``datasets.load_from_disk``,
  which joins those names to the directory unchecked and reads the JSON unbounded
  (huggingface/datasets ``src/datasets/arrow_dataset.py``, ``Dataset.load_from_disk``).
* **Size on disk and rows**: :data:`MAX_TABLE_BYTES`, :data:`MAX_TABLE_ROWS`, and for Parquet the footer's
  uncompressed size.
* **Decoded size.** Encodings let a few bytes stand for many: a dictionary-encoded column repeats one
  stored value once per row (a 10 KB Parquet file can decode to gigabytes; the footer's
  ``total_uncompressed_size`` counts the dictionary indices, not what they expand to). Parquet string
  columns are therefore read *as dictionaries* (``read_dictionary``: indices plus each distinct value
  once), batch by batch, and :func:`decoded_bytes` counts what every value would expand to; past
  :func:`decoded_bound` the file is refused before any value is expanded. Arrow types whose values can
  alias each other in other ways (views, run-end encoding) are refused by name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from model_zoo.errors import RecipeError
from model_zoo.files import plain_name, read_json_object, sha256_file

MAX_TABLE_BYTES = 16 << 30         # as tokenise.MAX_DATA_BYTES for a JSON or text file
MAX_TABLE_ROWS = 50_000_000        # ~10x the largest public SFT sets
MAX_DECODED_BYTES = 16 << 30       # what the rows expand to, counted before they are expanded
MAX_INFLATION = 1000               # decoded bytes per byte on disk (real text compresses ~3-10x) ...
MIN_DECODED_BOUND = 256 << 20      # ... with this floor, so small files of short repeated values pass
MAX_META_BYTES = 16 << 20          # state.json, dataset_info.json, dataset_dict.json: a few KB in practice
MAX_DATA_FILES = 100_000           # Arrow shards of one split
BATCH_ROWS = 65_536                # Parquet rows decoded (as dictionaries) at a time
VALUE_OVERHEAD = 8                 # bytes counted per value besides its payload (offsets, Python refs)


def _too_big(where: Path, what: str, found: int, bound: int, name: str) -> RecipeError:
    return RecipeError(f"data.path: {where}: {what} {found:,}, more than the {bound:,} port reads "
                       f"(porting.train.data.tables.{name}); split the data into smaller files")


def check_table_size(path: Path) -> int:
    """Bytes on disk of a Parquet file or a datasets directory (its regular files, links not followed)."""
    files = [path] if path.is_file() else _regular_files(path)
    total = 0
    for f in files:
        total += f.lstat().st_size
        if total > MAX_TABLE_BYTES:
            raise _too_big(path, "holds more bytes than", total, MAX_TABLE_BYTES, "MAX_TABLE_BYTES")
    return total


def _check_rows(where: Path, rows: int) -> None:
    if rows > MAX_TABLE_ROWS:
        raise _too_big(where, "rows", rows, MAX_TABLE_ROWS, "MAX_TABLE_ROWS")


def decoded_bound(on_disk: int) -> int:
    """The most bytes the rows of a table of ``on_disk`` bytes may expand to."""
    return min(MAX_DECODED_BYTES, max(MIN_DECODED_BOUND, MAX_INFLATION * on_disk))


# --------------------------------------------------------------------------- decoded size
def decoded_bytes(arr: Any, where: str) -> int:
    """Bytes the values of a pyarrow (chunked) array expand to once decoded: every string's length and
    :data:`VALUE_OVERHEAD` per value, dictionaries expanded through their indices, nested lists and
    structs summed. Computed on the encoded form (no value is expanded); a type port does not read
    (views, run-end encoded, unions, extensions) is refused with its column."""
    import pyarrow as pa  # deferred: pyarrow loads only for a table
    import pyarrow.compute as pc  # deferred: pyarrow loads only for a table

    if isinstance(arr, pa.ChunkedArray):
        return sum(decoded_bytes(c, where) for c in arr.chunks)
    t, n = arr.type, len(arr)
    if pa.types.is_dictionary(t):
        d = arr.dictionary
        if _is_bytes(d.type):
            per = pc.binary_length(d)
        elif _fixed_width(d.type):
            per = pa.array([0] * len(d), pa.int64())
        else:
            raise _unsupported(where, t)
        return VALUE_OVERHEAD * n + int(pc.sum(pc.take(per, arr.indices)).as_py() or 0)
    if _is_bytes(t):
        return VALUE_OVERHEAD * n + int(pc.sum(pc.binary_length(arr)).as_py() or 0)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_map(t):
        return VALUE_OVERHEAD * n + decoded_bytes(arr.flatten(), where)
    if pa.types.is_struct(t):
        return VALUE_OVERHEAD * n + sum(decoded_bytes(f, where) for f in arr.flatten())
    if pa.types.is_null(t) or _fixed_width(t):
        return VALUE_OVERHEAD * n
    raise _unsupported(where, t)


def _is_bytes(t) -> bool:
    import pyarrow as pa  # deferred: pyarrow loads only for a table

    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or \
        pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def _fixed_width(t) -> bool:
    import pyarrow as pa  # deferred: pyarrow loads only for a table

    return (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
            or pa.types.is_temporal(t))


def _unsupported(where: str, t) -> RecipeError:
    return RecipeError(f"data.path: {where}: a column of Arrow type {t}, which port does not read (strings, "
                       "numbers, lists and structs; dictionaries of strings or numbers); save it with plain types")


def _check_decoded(where: Path, table_or_batch: Any, so_far: int, bound: int, on_disk: int) -> int:
    total = so_far + sum(decoded_bytes(col, f"{where}: column {name!r}")
                         for name, col in zip(table_or_batch.schema.names, table_or_batch.columns))
    if total > bound:
        raise RecipeError(f"data.path: {where}: its rows decode to more than {bound:,} bytes ({total:,} counted so far "
                          f"from {on_disk:,} bytes on disk; porting.train.data.tables.MAX_DECODED_BYTES, "
                          f"MAX_INFLATION={MAX_INFLATION}); dictionary- or run-length-encoded values expand once per "
                          "row: split the data into smaller files or store it without such repetition")
    return total


# --------------------------------------------------------------------------- datasets directories
def _regular_files(root: Path) -> list[Path]:
    """Regular files under ``root``, sorted, links neither followed nor listed."""
    out = []
    for d, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        out += sorted(Path(d) / f for f in files if (Path(d) / f).is_file() and not (Path(d) / f).is_symlink())
    return sorted(out)


def _inside(base: Path, name: Any, where: Path, key: str, want_dir: bool) -> Path:
    """``base / name`` for a plain ``name`` read from ``where``; a real file (or directory), not a link."""
    p = base / plain_name(name, where=f"data.path: {where}", key=key, error=RecipeError)
    ok = (p.is_dir() if want_dir else p.is_file()) and not p.is_symlink()
    if not ok:
        kind = "directory" if want_dir else "regular file"
        raise RecipeError(f"data.path: {where}: {key}: {name!r} is not a {kind} inside {base} (missing, a link or "
                          "something else); save the dataset again with Dataset.save_to_disk")
    return p


def _meta(p: Path) -> dict:
    return read_json_object(p, what="datasets metadata file", max_bytes=MAX_META_BYTES, max_depth=32,
                            error=RecipeError)


def split_files(path: Path, split: str) -> list[Path]:
    """The Arrow files of ``split`` of a datasets directory, each confined to its directory."""
    root = path
    if (path / "dataset_dict.json").is_file():
        splits = _meta(path / "dataset_dict.json").get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise RecipeError(f"data.path: {path / 'dataset_dict.json'}: splits: expected a list of split names, "
                              f"found {splits!r:.80}; save the dataset again with DatasetDict.save_to_disk")
        if split not in splits:
            raise RecipeError(f"data.split: {path} has splits {sorted(splits)}, not {split!r}; set data.split")
        root = _inside(path, split, path / "dataset_dict.json", "splits", want_dir=True)
    state = root / "state.json"
    if not state.is_file() or not (root / "dataset_info.json").is_file():
        raise RecipeError(f"data.path: {root}: not a HF datasets directory (no state.json and dataset_info.json); "
                          "expected the output of Dataset.save_to_disk or a .parquet file")
    _meta(root / "dataset_info.json")   # bounded and well-formed, as datasets would read it
    entries = _meta(state).get("_data_files")
    if not isinstance(entries, list) or not entries or len(entries) > MAX_DATA_FILES:
        raise RecipeError(f"data.path: {state}: _data_files: expected a list of 1 to {MAX_DATA_FILES:,} "
                          "{\"filename\": ...} entries; save the dataset again with Dataset.save_to_disk")
    return [_inside(root, e.get("filename") if isinstance(e, dict) else e, state, f"_data_files[{i}].filename",
                    want_dir=False) for i, e in enumerate(entries)]


def _datasets_rows(path: Path, split: str, on_disk: int) -> list[dict]:
    import pyarrow as pa  # deferred: pyarrow loads only for a table

    tables = []
    for f in split_files(path, split):
        with pa.memory_map(str(f)) as mm:      # uncompressed Arrow is mapped, not read
            tables.append(pa.ipc.open_stream(mm).read_all())
    table = pa.concat_tables(tables)
    _check_rows(path, table.num_rows)
    _check_decoded(path, table, 0, decoded_bound(on_disk), on_disk)
    return table.to_pylist()


# --------------------------------------------------------------------------- Parquet
def _parquet_rows(path: Path, on_disk: int) -> list[dict]:
    import pyarrow.parquet as pq  # deferred: pyarrow loads only for a Parquet file

    pf = pq.ParquetFile(str(path))   # the footer only: rows and sizes before any data
    meta = pf.metadata
    _check_rows(path, meta.num_rows)
    inflated = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if inflated > MAX_TABLE_BYTES:
        raise _too_big(path, "uncompressed bytes", inflated, MAX_TABLE_BYTES, "MAX_TABLE_BYTES")
    strings = [c.path for c in (pf.schema.column(i) for i in range(len(pf.schema))) if c.physical_type == "BYTE_ARRAY"]
    pf = pq.ParquetFile(str(path), read_dictionary=strings)   # strings stay indices + distinct values
    bound, total, batches = decoded_bound(on_disk), 0, []
    for batch in pf.iter_batches(batch_size=BATCH_ROWS):
        total = _check_decoded(path, batch, total, bound, on_disk)
        batches.append(batch)
    return [row for b in batches for row in b.to_pylist()]


def read_table_rows(path: Path, split: str) -> list[tuple[int, Any]]:
    """(row number, row) of a HF ``datasets`` directory or a Parquet file, offline; confined, and bounded in
    bytes, rows and decoded size before rows are decoded."""
    on_disk = check_table_size(path)
    try:
        rows = _datasets_rows(path, split, on_disk) if path.is_dir() else _parquet_rows(path, on_disk)
    except RecipeError:
        raise
    except ImportError as exc:
        raise RecipeError(f"{path}: reading datasets directories and Parquet files needs the 'pyarrow' package "
                          f"({exc}); pip install 'port[data]' (datasets and pyarrow)") from None
    except Exception as exc:   # pyarrow raises its own types for a damaged or foreign file
        raise RecipeError(f"data.path: {path}: not a readable HF datasets directory or Parquet file ({type(exc).__name__}: "
                          f"{exc}); expected the output of Dataset.save_to_disk or a .parquet file") from None
    return [(i + 1, r) for i, r in enumerate(rows)]


def data_sha256(path: Path) -> str:
    """sha256 of the data file, or of a directory's regular files (relative names and digests, sorted):
    every file a datasets directory trains on is one of them (:func:`split_files` confines them)."""
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in _regular_files(path):
        h.update(f"{f.relative_to(path)}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()
