"""The token file an msrun worker reads (porting/train/data/token_file.py), hostile: changed after the
launch, a link in its place, a value that names another file, arrays of the wrong type or that disagree,
a pickled object array, a record that is not JSON or not port's, a file past the size bound. Each is
refused with one RecipeError line naming the file, before any example is built, and nothing is written.

The reader is called directly: its only caller is the worker, whose environment the launching `port train`
sets (tests/train/test_msrun.py runs that path under real msrun)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from model_zoo.errors import RecipeError
from porting.train.data import token_file
from porting.train.data.examples import DataReport, Example, TokenizedData

FILE = token_file.FILE.format(node=0)
IDENT = {"data": {"path": "d.txt"}, "tokenizer": "/m"}


def _good() -> TokenizedData:
    ex = [Example(np.arange(1, 6, dtype=np.int32), np.arange(1, 6, dtype=np.int32), 1),
          Example(np.arange(1, 4, dtype=np.int32), np.array([-100, 2, 3], np.int32), 2)]
    return TokenizedData(ex, DataReport(path="d.txt", sha256="0" * 64, format="text", rows=2, examples=2), 0)


def _arrays(run: Path) -> dict:
    token_file.write(run, _good(), IDENT)
    with np.load(run / FILE) as z:
        return {k: z[k] for k in z.files}


def _planted(run: Path, arrays: dict) -> str:
    """Write ``arrays`` as the token file, with the digest a launcher would have given for it (so the
    checks after the digest are what refuses it)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    (run / FILE).write_bytes(buf.getvalue())
    return f"{hashlib.sha256(buf.getvalue()).hexdigest()}:{FILE}"


def _meta(**m) -> np.ndarray:
    base = {"format": token_file.FORMAT, "pad_id": 0, "report": {"path": "d.txt", "sha256": "0", "format": "text"},
            **IDENT}
    base.update(m)
    return np.frombuffer(json.dumps(base).encode(), np.uint8)


def _changed(run):
    value = token_file.write(run, _good(), IDENT)
    p = run / FILE
    raw = bytearray(p.read_bytes())
    raw[-40] ^= 1
    p.write_bytes(bytes(raw))
    return value


def _link(run):
    value = token_file.write(run, _good(), IDENT)
    real = run.parent / "elsewhere.npz"
    (run / FILE).rename(real)
    os.symlink(real, run / FILE)
    return value


def _other_name(run):
    value = token_file.write(run, _good(), IDENT)
    return value.split(":")[0] + ":../../etc/passwd"


def _short_digest(run):
    token_file.write(run, _good(), IDENT)
    return "abc:" + FILE


def _wrong_dtype(run):
    a = _arrays(run)
    a["ids"] = a["ids"].astype(np.float64)
    return _planted(run, a)


def _offsets_past_end(run):
    a = _arrays(run)
    a["offsets"] = a["offsets"] + np.array([0, 0, 5])
    return _planted(run, a)


def _offsets_backwards(run):
    a = _arrays(run)
    a["offsets"] = np.array([0, 9, 8], np.int64)   # 8 tokens; the first example would end past the second
    return _planted(run, a)


def _labels_short(run):
    a = _arrays(run)
    a["labels"] = a["labels"][:-1]
    return _planted(run, a)


def _object_array(run):
    a = _arrays(run)
    a["sources"] = np.array([{"x": 1}, {"y": 2}], dtype=object)   # a pickle inside the zip
    return _planted(run, a)


def _extra_array(run):
    a = _arrays(run)
    a["payload"] = np.zeros(3, np.int32)
    return _planted(run, a)


def _missing_array(run):
    a = _arrays(run)
    del a["labels"]
    return _planted(run, a)


def _meta_not_json(run):
    a = _arrays(run)
    a["meta"] = np.frombuffer(b"{not json", np.uint8)
    return _planted(run, a)


def _meta_other_format(run):
    a = _arrays(run)
    a["meta"] = _meta(format=99)
    return _planted(run, a)


def _meta_bool_pad(run):
    a = _arrays(run)
    a["meta"] = _meta(pad_id=True)
    return _planted(run, a)


def _meta_unknown_report_key(run):
    a = _arrays(run)
    a["meta"] = _meta(report={"path": "d", "sha256": "0", "format": "text", "__class__": "x"})
    return _planted(run, a)


def _meta_huge(run):
    a = _arrays(run)
    a["meta"] = np.zeros(token_file.MAX_META_BYTES + 1, np.uint8)
    return _planted(run, a)


def _not_a_zip(run):
    (run / FILE).write_bytes(b"PK\x03\x04" + b"\x00" * 200)
    return hashlib.sha256((run / FILE).read_bytes()).hexdigest() + ":" + FILE


def _past_size_bound(run, monkeypatch):
    value = token_file.write(run, _good(), IDENT)
    monkeypatch.setattr(token_file, "MAX_BYTES", 100)
    return value


CASES = {
    "changed after the launch": (_changed, "its sha256 is not the one the launcher wrote"),
    "a link in its place": (_link, "missing or not a regular file"),
    "a value naming another file": (_other_name, "expected '<sha256>:data_tokens_node<N>.npz'"),
    "a short digest": (_short_digest, "expected '<sha256>:data_tokens_node<N>.npz'"),
    "float token ids": (_wrong_dtype, "of the wrong type"),
    "offsets past the end": (_offsets_past_end, "offsets do not match"),
    "offsets going backwards": (_offsets_backwards, "offsets do not match"),
    "labels shorter than ids": (_labels_short, "offsets do not match"),
    "a pickled object array": (_object_array, "not a token file"),
    "an extra array": (_extra_array, "unexpected or of the wrong type"),
    "a missing array": (_missing_array, "unexpected or of the wrong type"),
    "a record that is not JSON": (_meta_not_json, "its record is not JSON"),
    "a record of another format": (_meta_other_format, "not a format-1 token record"),
    "a boolean pad id": (_meta_bool_pad, "not a format-1 token record"),
    "an unknown report key": (_meta_unknown_report_key, "not a format-1 token record"),
    "a record past its bound": (_meta_huge, "more than"),
    "a damaged zip": (_not_a_zip, "not a token file"),
    "a file past the size bound": (_past_size_bound, "a token file may have"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_token_file_is_refused_in_one_line(tmp_path, monkeypatch, name):
    gen, expect = CASES[name]
    run = tmp_path / "run"
    run.mkdir()
    value = gen(run, monkeypatch) if gen is _past_size_bound else gen(run)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    t0 = time.monotonic()
    with pytest.raises(RecipeError) as e:
        token_file.read(value, run, IDENT)
    msg = str(e.value)
    assert "\n" not in msg and expect in msg, msg
    assert str(run / FILE) in msg or "PORT_TOKENS" in msg, msg
    assert time.monotonic() - t0 < 10
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before   # nothing written, changed or removed


def test_the_digest_is_of_the_bytes_written_so_a_file_swapped_in_after_the_rename_is_refused(tmp_path, monkeypatch):
    """The launcher digested the token file after renaming it into place: another process that replaced it in
    that moment had its file trusted by every worker. The digest is now taken of the bytes port wrote, before
    the rename; a process that swaps the file right after the rename (played here by the rename itself) is
    refused by the reader."""
    import model_zoo.files as files

    real_replace = os.replace

    def replace_then_swap(src, dst):
        real_replace(src, dst)
        if str(dst).endswith(FILE):
            raw = bytearray(Path(dst).read_bytes())
            raw[-40] ^= 1   # another process's file, the same size
            Path(dst).write_bytes(bytes(raw))

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(files.os, "replace", replace_then_swap)
    value = token_file.write(run, _good(), IDENT)
    monkeypatch.setattr(files.os, "replace", real_replace)
    with pytest.raises(RecipeError, match="its sha256 is not the one the launcher wrote"):
        token_file.read(value, run, IDENT)
