"""The token cache (porting/train/data/token_cache.py, ``PORT_TOKEN_CACHE``), hostile: an entry changed after
it was written, a link in an entry's place, a well-formed entry of another run renamed to this run's key, a
file that is not a token file, an entry past the size bound, a cache path that is a file. Each is passed over
with one warning naming it, the data is tokenised again (the run gets the tokenizer's own examples), and
nothing that port did not write is changed or removed."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from porting.train.data import token_cache, token_file
from porting.train.recipe.schema import validate_recipe
from tests.train.conftest import ROOT

EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
TEXT = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"


def _recipe(**data):
    return validate_recipe({"model": {"source": str(EMBEDDED)}, "data": {"path": str(TEXT), **data}})


def _run(r, cache):
    warnings: list[str] = []
    got = token_cache.tokenised(r, EMBEDDED, warnings.append, {token_cache.ENV: str(cache)})
    return got, warnings


@pytest.fixture(scope="module")
def fresh():
    r = _recipe(max_seq_length=64)
    return r, token_cache.tokenised(r, EMBEDDED, [].append, {})


def _entry(cache, r) -> tuple[str, os.PathLike]:
    k = token_cache.key(r, EMBEDDED, token_file.identity(r, EMBEDDED))
    (entry,) = list(cache.glob(f"{k}-*.npz"))
    return k, entry


def _tokenised_again(got, warnings, fresh_tokens, what: str):
    assert got.origin == "tokenised" and got.raw == fresh_tokens.raw
    assert len(warnings) == 1 and what in warnings[0] and token_cache.ENV in warnings[0], warnings


def test_an_entry_changed_after_it_was_written_is_passed_over(tmp_path, fresh):
    r, tokens = fresh
    cache = tmp_path / "c"
    _run(r, cache)
    _, entry = _entry(cache, r)
    raw = bytearray(entry.read_bytes())
    i = raw.index(b"ids") + 200            # inside the token ids: still a well-formed archive
    raw[i] ^= 1
    entry.write_bytes(bytes(raw))
    got, warnings = _run(r, cache)
    _tokenised_again(got, warnings, tokens, "its sha256 is not the one in its name")
    assert entry.read_bytes() == bytes(raw)      # left as it is: port does not delete from the cache


def test_a_link_in_an_entrys_place_is_not_followed(tmp_path, fresh):
    r, tokens = fresh
    cache = tmp_path / "c"
    _run(r, cache)
    _, entry = _entry(cache, r)
    target = tmp_path / "elsewhere.npz"
    entry.rename(target)
    entry.symlink_to(target)
    got, warnings = _run(r, cache)
    _tokenised_again(got, warnings, tokens, "not a regular file")
    assert entry.is_symlink() and target.is_file()


def test_another_runs_entry_renamed_to_this_key_is_refused(tmp_path, fresh):
    r, tokens = fresh
    other = _recipe(max_seq_length=32)
    cache = tmp_path / "c"
    theirs = _run(other, cache)[0].raw
    k = token_cache.key(r, EMBEDDED, token_file.identity(r, EMBEDDED))
    # well formed and correctly digested: only its record says which data section it was made for
    (cache / f"{k}-{hashlib.sha256(theirs).hexdigest()}.npz").write_bytes(theirs)
    got, warnings = _run(r, cache)
    _tokenised_again(got, warnings, tokens, "written for another data section")


def test_a_file_that_is_not_a_token_file_is_refused(tmp_path, fresh):
    r, tokens = fresh
    cache = tmp_path / "c"
    cache.mkdir()
    k = token_cache.key(r, EMBEDDED, token_file.identity(r, EMBEDDED))
    junk = b"PK\x03\x04 not really a zip"
    (cache / f"{k}-{hashlib.sha256(junk).hexdigest()}.npz").write_bytes(junk)
    pickled = tmp_path / "p.npz"
    np.savez(pickled, ids=np.array([object()], dtype=object))
    raw = pickled.read_bytes()
    (cache / f"{k}-{hashlib.sha256(raw).hexdigest()}.npz").write_bytes(raw)
    got, warnings = _run(r, cache)
    assert got.origin == "tokenised" and got.raw == tokens.raw
    assert len(warnings) == 2 and all("not a token file" in w or "wrong type" in w for w in warnings), warnings


def test_an_entry_past_the_size_bound_is_not_read(tmp_path, fresh, monkeypatch):
    r, tokens = fresh
    cache = tmp_path / "c"
    _run(r, cache)
    monkeypatch.setattr(token_file, "MAX_BYTES", 1000)
    got, warnings = _run(r, cache)
    _tokenised_again(got, warnings, tokens, "more than the 1,000 a token file may have")


def test_a_cache_path_that_is_a_file_is_one_warning_and_the_file_is_kept(tmp_path, fresh):
    r, tokens = fresh
    cache = tmp_path / "c"
    cache.write_text("a user's file")
    got, warnings = _run(r, cache)
    assert got.origin == "tokenised" and got.raw == tokens.raw
    assert len(warnings) == 1 and "could not keep the tokens" in warnings[0], warnings
    assert cache.read_text() == "a user's file"


def test_names_that_only_look_like_entries_are_ignored(tmp_path, fresh):
    r, tokens = fresh
    cache = tmp_path / "c"
    cache.mkdir()
    k = token_cache.key(r, EMBEDDED, token_file.identity(r, EMBEDDED))
    for name in (f"{k}-short.npz", f"{k}-{'g' * 64}.npz", f"{k}-{'0' * 64}.npz.tmp"):
        (cache / name).write_bytes(tokens.raw)
    got, warnings = _run(r, cache)
    assert got.origin == "tokenised" and not warnings
    assert len(list(cache.iterdir())) == 4      # the three left alone, this run's entry added
