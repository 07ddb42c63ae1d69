"""Tokens kept between runs (porting/train/data/token_cache.py, ``PORT_TOKEN_CACHE``): a second run of the
same data and tokenizer gets, example for example, what the tokenizer makes, without loading transformers;
any change to what the tokens depend on is a miss. Hostile cache entries: tests/attacks/test_token_cache.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from porting.train.data import token_cache, token_file
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import validate_recipe
from porting.tokenizer import load_tokenizer
from tests.train.conftest import ROOT

EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
TEXT = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"


def _recipe(model, path, **data):
    return validate_recipe({"model": {"source": str(model)}, "data": {"path": str(path), **data}})


def _same(a, b) -> None:
    assert a.pad_id == b.pad_id and a.report == b.report
    assert len(a.examples) == len(b.examples) > 0
    for x, y in zip(a.examples, b.examples):
        assert x.source == y.source and np.array_equal(x.input_ids, y.input_ids)
        assert np.array_equal(x.labels, y.labels)


def _tokens(r, model, cache, warnings=None):
    return token_cache.tokenised(r, model, (warnings if warnings is not None else []).append,
                                 {token_cache.ENV: str(cache)})


@pytest.mark.parametrize("kind", ["text split", "alpaca"])
def test_a_second_run_gets_exactly_what_the_tokenizer_makes(tmp_path, alpaca, kind):
    r = (_recipe(EMBEDDED, TEXT, long_text="split", max_seq_length=32) if kind == "text split"
         else _recipe(EMBEDDED, alpaca, max_seq_length=128, eval_split=0.1))
    cache = tmp_path / "cache"
    first = _tokens(r, EMBEDDED, cache)
    assert first.origin == "tokenised" and len(list(cache.iterdir())) == 1
    second = _tokens(r, EMBEDDED, cache)
    assert second.origin.startswith(f"{token_cache.ENV} ") and second.raw == first.raw
    _same(tokenize_dataset(r.data, load_tokenizer(EMBEDDED)), second.data)
    assert len(list(cache.iterdir())) == 1     # a hit writes nothing


def test_unset_means_no_cache(tmp_path):
    r = _recipe(EMBEDDED, TEXT, max_seq_length=64)
    got = token_cache.tokenised(r, EMBEDDED, [].append, {})
    assert got.origin == "tokenised" and not list(tmp_path.iterdir())


def test_a_hit_does_not_load_transformers(tmp_path):
    r = _recipe(EMBEDDED, TEXT, max_seq_length=64)
    cache = tmp_path / "cache"
    _tokens(r, EMBEDDED, cache)
    code = (
        "import sys\n"
        "from porting.train.data import token_cache\n"
        "from porting.train.recipe.schema import validate_recipe\n"
        f"r = validate_recipe({{'model': {{'source': {str(EMBEDDED)!r}}}, 'data': {{'path': {str(TEXT)!r}, "
        "'max_seq_length': 64}})\n"
        f"t = token_cache.tokenised(r, {str(EMBEDDED)!r}, print, {{'{token_cache.ENV}': {str(cache)!r}}})\n"
        "print(t.origin, len(t.data.examples), 'transformers' in sys.modules, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    origin, n, transformers, torch = out.stdout.split()[-4:]
    assert n == str(len(_tokens(r, EMBEDDED, cache).data.examples)) and transformers == torch == "False", out.stdout


def test_whatever_the_tokens_depend_on_changes_the_key_and_the_weights_do_not(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED, model)
    data = tmp_path / "d.txt"
    shutil.copy(TEXT, data)
    r = _recipe(model, data, max_seq_length=64)
    ident = token_file.identity(r, model)
    base = token_cache.key(r, model, ident)
    assert base == token_cache.key(r, model, ident)           # deterministic
    # a weight file is not read by the tokenizer: rewriting it keeps the key (no 26 GB hash per launch)
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes() + b"")
    (model / "extra-00001-of-00002.safetensors").write_bytes(b"weights")
    assert token_cache.key(r, model, ident) == base
    # another data setting
    r64 = _recipe(model, data, max_seq_length=32)
    assert token_cache.key(r64, model, token_file.identity(r64, model)) != base
    # the data's content, same path
    data.write_text(data.read_text() + "\nOne more story.\n")
    changed = token_cache.key(r, model, ident)
    assert changed != base
    # a tokenizer file's content (its configuration: a chat template, a special token)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages }}"
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert token_cache.key(r, model, ident) != changed
    # the installed tokenizer libraries
    versions = token_cache._versions()
    assert set(versions) == {"transformers", "tokenizers", "sentencepiece"} and versions["transformers"]


def test_a_run_whose_data_changed_tokenises_again(tmp_path):
    data = tmp_path / "d.txt"
    data.write_text(TEXT.read_text())
    r = _recipe(EMBEDDED, data, max_seq_length=64)
    cache = tmp_path / "cache"
    before = _tokens(r, EMBEDDED, cache)
    data.write_text(TEXT.read_text() + "\nOnce upon a time there was a cat who liked to sit in the sun.\n")
    after = _tokens(r, EMBEDDED, cache)
    assert after.origin == "tokenised" and after.data.report.examples == before.data.report.examples + 1
    _same(tokenize_dataset(r.data, load_tokenizer(EMBEDDED)), after.data)
    assert len(list(cache.iterdir())) == 2


@pytest.mark.slow   # kept out of the fast tier (`pytest` alone, 5 minutes on 2 cores); CI runs it
def test_port_train_twice_with_the_cache_gives_the_same_losses(tmp_path, model_dir):
    from tests.helpers import port

    runs = []
    for name in ("a", "b"):
        run = tmp_path / name
        port("train", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--run-dir", str(run), "--set", "schedule.max_steps=3",
             "--set", "checkpointing.export_hf=false", "--set", f"model.source={model_dir}", env={token_cache.ENV: str(tmp_path / "cache")}, check=True)
        runs.append(run)
    logs = [(r / "logs" / "rank_0.log").read_text() for r in runs]
    assert f"tokens from {token_cache.ENV} " not in logs[0] and f"tokens from {token_cache.ENV} " in logs[1]
    losses = [[json.loads(ln)["loss"] for ln in (r / "metrics.jsonl").read_text().splitlines() if '"step"' in ln]
              for r in runs]
    assert losses[0] == losses[1] and len(losses[0]) == 3
