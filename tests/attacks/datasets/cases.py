"""Issue 27, data files, numbers and bounded work: HF ``datasets`` directories whose JSON names files
outside themselves, Parquet and Arrow files that decode to gigabytes from kilobytes, booleans where the
recipe wants a count, hostile numbers in baselines and metrics, run side directories in the way or on a
full disk. Every case runs `port` (train, compare, report) through the one harness."""

from __future__ import annotations

import json
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case
from tests.attacks.report.cases import run_dir

ROWS = [{"text": f"Once upon a time there was a cat number {i}. It liked to sleep in the sun."} for i in range(8)]
BIG_VALUE = "x" * 4096


def _train(d: Path, data: Path, *edits) -> list[str]:
    def edit(r: dict) -> None:
        r["data"]["format"] = "text"
        for e in edits:
            e(r)
    return ["train", str(I.recipe(d, edit, data=data))]


def _saved(d: Path, name: str = "ds", splits: bool = False) -> Path:
    """A real ``save_to_disk`` directory of ROWS (a DatasetDict with train/test when ``splits``)."""
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_list(ROWS)
    out = d / name
    (datasets.DatasetDict({"train": ds, "test": ds}) if splits else ds).save_to_disk(str(out))
    return out


def _edit_json(p: Path, fn) -> None:
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


def _listing(d: Path, name) -> list[str]:
    ds = _saved(d)
    _edit_json(ds / "state.json", lambda s: s.__setitem__("_data_files", [{"filename": name}]))
    return _train(d, ds)


def _outside(d: Path) -> Path:
    """A real Arrow file beside the dataset: what an escaping name would train on."""
    src = _saved(d, "other")
    return next(src.glob("*.arrow"))


# -- 1. paths read from a data file stay inside its directory
@case("state.json", "_data_files[0].filename", "expected a plain file name")
def state_lists_dotdot_arrow(d):
    return _listing(d, "../" + str(_outside(d).relative_to(d)))


@case("state.json", "_data_files[0].filename", "expected a plain file name")
def state_lists_an_absolute_arrow(d):
    return _listing(d, str(_outside(d)))


@case("state.json", "_data_files[0].filename", "expected a plain file name")
def state_lists_a_name_in_a_subdirectory(d):
    return _listing(d, "sub/data-00000-of-00001.arrow")


@case("state.json", "_data_files[0].filename", "expected a plain file name")
def state_lists_a_name_with_a_nul(d):
    return _listing(d, "data\x00.arrow")


@case("state.json", "_data_files[0].filename", "found 7")
def state_lists_a_number_as_a_file(d):
    return _listing(d, 7)


@case("state.json", "_data_files: expected a list of 1 to 100,000")
def state_data_files_is_an_object(d):
    ds = _saved(d)
    _edit_json(ds / "state.json", lambda s: s.__setitem__("_data_files", {"filename": "x.arrow"}))
    return _train(d, ds)


@case("_data_files[0].filename", "is not a regular file inside", "a link")
def data_file_is_a_link_to_outside(d):
    ds = _saved(d)
    arrow = next(ds.glob("*.arrow"))
    arrow.unlink()
    arrow.symlink_to(_outside(d))
    return _train(d, ds)


@case("dataset_dict.json", "splits", "expected a plain file name")
def split_named_dotdot(d):
    ds = _saved(d, splits=True)
    (d / "outside").mkdir()
    _edit_json(ds / "dataset_dict.json", lambda s: s.__setitem__("splits", ["../outside"]))
    return _train(d, ds, I.set_key("data.split", "../outside"))


@case("dataset_dict.json", "splits", "'train' is not a directory inside", "a link")
def split_directory_is_a_link_to_outside(d):
    ds = _saved(d, splits=True)
    other = _saved(d, "other")
    import shutil

    shutil.rmtree(ds / "train")
    (ds / "train").symlink_to(other)
    return _train(d, ds)


@case("dataset_dict.json", "splits: expected a list of split names")
def splits_is_a_string(d):
    ds = _saved(d, splits=True)
    _edit_json(ds / "dataset_dict.json", lambda s: s.__setitem__("splits", "train"))
    return _train(d, ds)


@case("state.json", "more than the 16,777,216 allowed")
def state_json_of_20_mb(d):
    ds = _saved(d)
    _edit_json(ds / "state.json", lambda s: s.__setitem__("_fingerprint", "f" * (20 << 20)))
    return _train(d, ds)


@case("state.json", "integer of 5,000 digits")
def state_json_with_a_5000_digit_integer(d):
    ds = _saved(d)
    (ds / "state.json").write_text('{"_data_files": [], "n": ' + "7" * 5000 + "}")
    return _train(d, ds)


@case("dataset_info.json", "nests deeper than 32 levels")
def dataset_info_nested_100000_levels(d):
    ds = _saved(d)
    (ds / "dataset_info.json").write_text(I.deep_object())
    return _train(d, ds)


@case("state.json", "not valid UTF-8")
def state_json_not_utf8(d):
    ds = _saved(d)
    (ds / "state.json").write_bytes(I.NOT_UTF8)
    return _train(d, ds)


# -- 2. decoded size counted before values are expanded
def _dictionary_column(n: int, value: str = BIG_VALUE):
    import numpy as np
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


@case("bomb.parquet", "decode to more than 268,435,456 bytes", "MAX_DECODED_BYTES", timeout=60)
def parquet_dictionary_bomb(d):
    """~3 KB on disk, 4 GB once decoded: one 4 KB value repeated by 1M dictionary indices (the footer's
    uncompressed size counts the indices: ~100 KB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": _dictionary_column(1_000_000)}), d / "bomb.parquet", compression="zstd",
                   write_statistics=False)
    assert (d / "bomb.parquet").stat().st_size < 10_000
    return _train(d, d / "bomb.parquet")


@case("bomb.parquet", "decode to more than", timeout=60)
def parquet_nested_dictionary_bomb(d):
    """The repetition hides inside chat messages (list<struct<role, content>>)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 1_000_000
    msgs = pa.StructArray.from_arrays([pa.array(["assistant"] * n), _dictionary_column(n)], ["role", "content"])
    col = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), msgs)
    pq.write_table(pa.table({"messages": col}), d / "bomb.parquet", compression="zstd", write_statistics=False)
    return _train(d, d / "bomb.parquet", I.set_key("data.format", "chat"))


def _arrow_dataset(d: Path, column) -> Path:
    """A save_to_disk directory whose Arrow file holds ``column`` as 'text' instead."""
    import pyarrow as pa

    ds = _saved(d)
    arrow = next(ds.glob("*.arrow"))
    table = pa.table({"text": column})
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return ds


@case("decode to more than", timeout=60)
def arrow_dictionary_bomb(d):
    """An uncompressed Arrow file of 400 KB of indices that decodes to 6.5 GB (a 64 KB value, 100k rows)."""
    return _train(d, _arrow_dataset(d, _dictionary_column(100_000, "y" * 65536)))


@case("column 'text'", "string_view", "port does not read")
def arrow_string_view_column(d):
    import pyarrow as pa

    return _train(d, _arrow_dataset(d, pa.array([BIG_VALUE] * 4, pa.string_view())))


@case("column 'text'", "run_end_encoded", "port does not read")
def arrow_run_end_encoded_column(d):
    import pyarrow as pa

    return _train(d, _arrow_dataset(d, pa.RunEndEncodedArray.from_arrays([1_000_000], [BIG_VALUE])))


# -- 4. a boolean is never a count
for _name, _key, _value in [("tensor_parallel_true", "parallel.tensor_parallel", True),
                            ("micro_batch_true", "batching.micro_batch_size", True),
                            ("lr_true", "optimizer.lr", True),
                            ("bucket_boundary_false", "batching.bucketing.boundaries", [64, False]),
                            ("devices_per_node_true", "cluster.devices_per_node", True)]:
    def _gen(d, _key=_key, _value=_value):
        return ["train", str(I.recipe(d, I.set_key(_key, _value)))]
    _gen.__name__ = _name
    globals()[_name] = case(_key, "got a boolean")(_gen)


def _baseline(d: Path, edit) -> Path:
    base = {"format": "port-baseline", "format_version": 1, "created": "", "command": [], "device": {},
            "versions": {}, "model": {}, "settings": {}, "timing": {}, "memory": {}, "probe": {},
            "steps": {"step": [1, 2], "loss": [2.0, 1.5], "grad_norm": [1.0, 1.0], "lr": [1e-3, 1e-3],
                      "tokens": [10, 10], "step_time_s": [0.1, 0.1],
                      "peak_memory_gib": {p: [0.1, 0.1] for p in ("forward", "backward", "optimizer")}}}
    edit(base)
    p = d / "base.json"
    p.write_text(json.dumps(base).replace('"@NaN"', "NaN"))
    return p


@case("base.json", "steps.loss[1] is 'x', expected a number or null", dest=None)
def baseline_loss_is_a_string(d):
    return ["compare", str(_baseline(d, lambda b: b["steps"]["loss"].__setitem__(1, "x"))), str(run_dir(d)),
            "--no-probe"]


@case("base.json", "probe.after_step", "expected one of the recorded steps", dest=None)
def baseline_probe_step_is_nan(d):
    return ["compare", str(_baseline(d, lambda b: b["probe"].__setitem__("after_step", "@NaN"))), str(run_dir(d)),
            "--no-probe"]


@case("base.json", "steps.step[0] is 'True', expected a whole number >= 0", dest=None)
def baseline_step_is_a_boolean(d):
    return ["compare", str(_baseline(d, lambda b: b["steps"]["step"].__setitem__(0, True))), str(run_dir(d)),
            "--no-probe"]


@case(dest="out", refusal=False)
def report_with_a_null_step_in_metrics(d):
    r = run_dir(d, metrics__jsonl='{"step": null, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    return ["report", str(r), "--out", str(d / "out")]


# -- 5. the run's side directories
@case("tensorboard", "exists and is not a directory", "TensorBoard events")
def tensorboard_directory_is_a_file(d):
    (d / "out").mkdir()
    (d / "out" / "tensorboard").write_text("a file\n")
    return ["train", str(I.recipe(d, I.set_key("logging.tensorboard", True)))]


@case("tensorboard", "exists and is not a directory", "a link")
def tensorboard_directory_is_a_link_out_of_the_run(d):
    (d / "out").mkdir()
    (d / "elsewhere").mkdir()
    (d / "out" / "tensorboard").symlink_to(d / "elsewhere")
    return ["train", str(I.recipe(d, I.set_key("logging.tensorboard", True)))]


@case("metrics.jsonl", "exists and is not a regular file")
def metrics_file_is_a_directory(d):
    (d / "out" / "metrics.jsonl").mkdir(parents=True)
    return ["train", str(I.recipe(d))]


@case("cannot write there (File too large)", subprocess=True, fsize=32 << 10, timeout=120)
def run_directory_on_a_full_disk(d):
    return ["train", str(I.recipe(d, I.set_key("logging.tensorboard", True)))]
