"""HF datasets directories and Parquet files (porting/train/data/tables.py): every file a directory names
stays inside it and is covered by the run's data digest; what rows decode to is counted before anything
is expanded. Real files written by `datasets` and `pyarrow`; the hostile ones are in
tests/attacks/datasets/."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_zoo.errors import RecipeError
from porting.train.data import tables

ROWS = [{"text": f"row {i}: once upon a time", "role": "user" if i % 2 else "assistant"} for i in range(20)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import datasets

    datasets.disable_progress_bars()
    root = tmp_path_factory.mktemp("tables")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(root / "one"), num_shards=2)
    return root / "one"


def test_every_file_that_feeds_training_is_in_the_digest(saved, tmp_path):
    """Each file read (dataset_info.json, state.json, both Arrow shards) changes the digest when changed;
    every Arrow file state.json names is one of the files digested."""
    import shutil

    work = tmp_path / "ds"
    shutil.copytree(saved, work)
    fed = tables.split_files(work, "train")
    assert len(fed) == 2 and all(f.parent == work for f in fed)
    digested = {p.name for p in work.iterdir()}
    assert {f.name for f in fed} | {"state.json", "dataset_info.json"} <= digested
    before = tables.data_sha256(work)
    for f in fed + [work / "state.json", work / "dataset_info.json"]:
        raw = f.read_bytes()
        f.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
        assert tables.data_sha256(work) != before, f.name
        f.write_bytes(raw)
    assert tables.data_sha256(work) == before


def test_a_name_out_of_the_directory_is_refused_and_the_outside_file_never_read(saved, tmp_path):
    import shutil

    work = tmp_path / "ds"
    shutil.copytree(saved, work)
    outside = tmp_path / "outside.arrow"
    shutil.copy(next(work.glob("*.arrow")), outside)
    state = json.loads((work / "state.json").read_text())
    for name in ("../outside.arrow", str(outside), "./../outside.arrow", "..", ""):
        state["_data_files"] = [{"filename": name}]
        (work / "state.json").write_text(json.dumps(state))
        with pytest.raises(RecipeError, match=r"_data_files\[0\]\.filename: found .*expected a plain file name"):
            tables.read_table_rows(work, "train")


def test_rows_read_like_datasets_reads_them(saved):
    rows = [r for _, r in tables.read_table_rows(saved, "train")]
    assert rows == ROWS


def test_dictionary_encoded_parquet_is_counted_as_decoded(tmp_path):
    """A real dictionary-encoded column (a repeated role) reads; the same shape with a 4 KB value repeated
    over 200,000 rows (1 KB on disk, 800 MB decoded) is refused before a value is expanded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ok = tmp_path / "ok.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), ok)   # pyarrow dictionary-encodes both columns by default
    assert [r for _, r in tables.read_table_rows(ok, "train")] == ROWS
    bomb = tmp_path / "bomb.parquet"
    col = pa.DictionaryArray.from_arrays(pa.array(np.zeros(200_000, np.int32)), pa.array(["z" * 4096]))
    pq.write_table(pa.table({"text": col}), bomb, write_statistics=False)
    size = bomb.stat().st_size
    assert size < 4096
    with pytest.raises(RecipeError, match=rf"decode to more than 268,435,456 bytes .* from {size:,} bytes on disk"):
        tables.read_table_rows(bomb, "train")


def test_decoded_bytes_of_each_arrow_shape():
    import pyarrow as pa

    strings = pa.array(["ab", None, "cde"])
    assert tables.decoded_bytes(strings, "c") == 3 * 8 + 5
    d = pa.DictionaryArray.from_arrays(pa.array([0, 0, 1, None], pa.int32()), pa.array(["xyz", "q"]))
    assert tables.decoded_bytes(d, "c") == 4 * 8 + 3 + 3 + 1
    nested = pa.array([[{"role": "user", "content": "hi"}], []])
    assert tables.decoded_bytes(nested, "c") == 2 * 8 + (8 + (8 + 4) + (8 + 2))
    assert tables.decoded_bytes(nested.slice(1), "c") == 8   # a slice counts only its own values
    assert tables.decoded_bound(1) == tables.MIN_DECODED_BOUND
    assert tables.decoded_bound(1 << 40) == tables.MAX_DECODED_BYTES
