"""The launcher's token file (porting/train/data/token_file.py): what a worker reads back is the data the
tokenizer makes, example for example, and the batch schedule built on it is the same; a file written for
another data section or tokenizer is refused. Hostile files: tests/attacks/test_token_file.py."""

from __future__ import annotations

import numpy as np
import pytest

from model_zoo.errors import RecipeError
from porting.train.data import token_cache, token_file
from porting.train.data.batching import build_plan
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import validate_recipe
from porting.tokenizer import load_tokenizer
from tests.train.conftest import ROOT

EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
TEXT = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(EMBEDDED)


def _recipe(path, **data):
    return validate_recipe({"model": {"source": str(EMBEDDED)}, "data": {"path": str(path), **data}})


def _same(a, b) -> None:
    assert a.pad_id == b.pad_id and a.report == b.report
    assert len(a.examples) == len(b.examples) > 0
    for x, y in zip(a.examples, b.examples):
        assert x.source == y.source and x.input_ids.dtype == y.input_ids.dtype == np.int32
        assert np.array_equal(x.input_ids, y.input_ids) and np.array_equal(x.labels, y.labels)


@pytest.mark.parametrize("kind", ["text split", "alpaca"])
def test_a_worker_reads_back_exactly_what_the_tokenizer_made(tmp_path, tok, alpaca, kind):
    r = (_recipe(TEXT, long_text="split", max_seq_length=32) if kind == "text split"
         else _recipe(alpaca, max_seq_length=128, eval_split=0.1))
    made = tokenize_dataset(r.data, tok)
    ident = token_file.identity(r, EMBEDDED)
    value = token_file.write(tmp_path, made, ident)
    back = token_file.read(value, tmp_path, ident)
    _same(made, back)
    # the worker's schedule (2 data-parallel ranks) is the one the tokenizer's data gives
    a, b = build_plan(r, None, 2, data=made), build_plan(r, None, 2, data=back)
    for ga, gb in zip(a.epoch_batches(0), b.epoch_batches(0)):
        for ma, mb in zip(a.micro_batches(ga), b.micro_batches(gb)):
            assert np.array_equal(ma.input_ids, mb.input_ids) and np.array_equal(ma.labels, mb.labels)
    assert a.total_steps == b.total_steps and a.boundaries == b.boundaries


def test_for_workers_tokenises_the_recipes_data_into_the_run_directory(tmp_path, tok):
    r = _recipe(TEXT, max_seq_length=64)
    env = token_cache.for_workers(r, tmp_path)
    assert token_cache.for_workers(r, tmp_path, 3)[token_file.ENV].endswith(":data_tokens_node3.npz")   # a node's own
    assert set(env) == {token_file.ENV} and env[token_file.ENV].endswith(":data_tokens_node0.npz")
    _same(tokenize_dataset(r.data, tok), token_file.read(env[token_file.ENV], tmp_path, token_file.identity(r, EMBEDDED)))


def test_tokens_of_another_data_section_or_tokenizer_are_refused(tmp_path, tok):
    r = _recipe(TEXT, max_seq_length=64)
    value = token_file.write(tmp_path, tokenize_dataset(r.data, tok), token_file.identity(r, EMBEDDED))
    other = _recipe(TEXT, max_seq_length=32)
    with pytest.raises(RecipeError, match="written for another data section"):
        token_file.read(value, tmp_path, token_file.identity(other, EMBEDDED))
    with pytest.raises(RecipeError, match="written for another tokenizer"):
        token_file.read(value, tmp_path, token_file.identity(r, tmp_path))
    # the file itself is intact: the refusals above are about what it was made for
    assert token_file.read(value, tmp_path, token_file.identity(r, EMBEDDED)).report.examples > 0
