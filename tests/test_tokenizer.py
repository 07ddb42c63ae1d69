"""porting.tokenizer: the one way `port` loads a model's tokenizer (offline, one-line errors)."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from model_zoo.errors import ConfigError
from porting.tokenizer import UNBOUNDED_LENGTH, load_tokenizer
from tests.conftest import EMBEDDED


def _copy(tmp_path, *names: str):
    d = tmp_path / "model"
    d.mkdir()
    for n in names:
        shutil.copy(EMBEDDED / n, d / n)
    return d


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_embedded_tokenizer_loads_offline_without_a_length_limit():
    tok = load_tokenizer(EMBEDDED)
    assert tok.encode("Once upon") == [1, 403, 407]   # BOS added, as the tokenizer_config says
    assert tok.decode([1, 403, 407], skip_special_tokens=True) == "Once upon"
    assert tok.model_max_length == UNBOUNDED_LENGTH


def test_tokenizer_json_alone_is_enough(tmp_path):
    d = _copy(tmp_path, "config.json", "tokenizer.json")
    assert load_tokenizer(d).encode("Once upon")[-2:] == [403, 407]


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_tokenizer(tmp_path / "nope")
    assert str(tmp_path / "nope") in _one_line(e) and "no such model directory" in str(e.value)


def test_missing_tokenizer_file_is_named(tmp_path):
    d = _copy(tmp_path, "config.json", "tokenizer_config.json")
    with pytest.raises(ConfigError) as e:
        load_tokenizer(d)
    assert _one_line(e).startswith(f"{d}: missing tokenizer.json (or tokenizer.model)")


def test_sentencepiece_only_needs_the_package(tmp_path):
    d = _copy(tmp_path, "config.json", "tokenizer.model", "tokenizer_config.json")
    if importlib.util.find_spec("sentencepiece") is None:
        with pytest.raises(ConfigError) as e:
            load_tokenizer(d)
        assert "missing tokenizer.json" in _one_line(e) and "pip install sentencepiece" in str(e.value)
    else:
        assert load_tokenizer(d).encode("Once upon")[-2:] == [403, 407]


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_corrupt_file_is_named_with_its_position(tmp_path, name):
    d = _copy(tmp_path, "config.json", "tokenizer.json", "tokenizer_config.json")
    (d / name).write_text('{"version": "1.0", oops')
    with pytest.raises(ConfigError) as e:
        load_tokenizer(d)
    assert _one_line(e).startswith(f"{d / name}: invalid {name} at line 1 column")


def test_tokenizer_json_that_is_not_a_tokenizer(tmp_path):
    d = _copy(tmp_path, "config.json", "tokenizer_config.json")
    (d / "tokenizer.json").write_text('{"version": "1.0"}')
    with pytest.raises(ConfigError) as e:
        load_tokenizer(d)
    assert _one_line(e).startswith(f"{d / 'tokenizer.json'}: cannot build the tokenizer (")
