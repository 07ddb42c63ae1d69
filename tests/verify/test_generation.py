"""Greedy decoding in one place (model_zoo.decode) and `port generate` on the packaged stories260K."""

from __future__ import annotations

import shutil

import pytest

from model_zoo.errors import ConfigError
from porting.verify.generation import CACHE_MODES
from porting.verify.pair import load_zoo
from tests.conftest import EMBEDDED, GOLDEN_FIRST_IDS, GOLDEN_TEXT
from tests.helpers import port


@pytest.fixture(scope="module")
def stories():
    return load_zoo(EMBEDDED)


def test_cli_choices_are_the_decoders():
    from model_zoo.decode import DECODERS

    assert CACHE_MODES == tuple(DECODERS)


@pytest.mark.parametrize("cache", CACHE_MODES)
def test_every_mode_stops_at_eos(stories, cache):
    from model_zoo.decode import greedy

    # Pretend the 5th golden token is EOS: every mode must stop right after emitting it.
    assert greedy(stories, [1], 20, cache=cache, eos_token_id=GOLDEN_FIRST_IDS[4]) == GOLDEN_FIRST_IDS[:5]


@pytest.mark.slow
def test_longer_prompt_continues_the_golden_text(stories):
    from model_zoo.decode import greedy

    ids = greedy(stories, [1] + GOLDEN_FIRST_IDS[:4], 6, cache="static")
    assert ids == GOLDEN_FIRST_IDS[4:10]
    assert greedy(stories, [1] + GOLDEN_FIRST_IDS[:4], 6, cache="dynamic") == ids


@pytest.mark.parametrize("args, message", [
    (dict(prompt_ids=[1], max_new_tokens=3, cache="paged"),
     "KV cache mode 'paged': expected one of static, dynamic, none"),
    (dict(prompt_ids=[], max_new_tokens=3), "the prompt has no tokens"),
    (dict(prompt_ids=[1], max_new_tokens=0), "max_new_tokens=0: expected at least 1"),
])
def test_bad_arguments_are_one_line(stories, args, message):
    from model_zoo.decode import greedy

    with pytest.raises(ConfigError, match=message):
        greedy(stories, **args)


@pytest.mark.slow
def test_port_generate_prints_the_golden_text():
    res = port("generate", "--hf", str(EMBEDDED), "--max-new-tokens", "60")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout == GOLDEN_TEXT + "\n"


def test_port_generate_without_tokenizer_is_one_line(tmp_path):
    d = tmp_path / "no-tokenizer"
    d.mkdir()
    shutil.copy(EMBEDDED / "config.json", d / "config.json")
    shutil.copy(EMBEDDED / "model.safetensors", d / "model.safetensors")
    res = port("generate", "--hf", str(d))
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == f"error: {d}: missing tokenizer.json (or tokenizer.model); copy the model's tokenizer " \
                         "files into the model directory\n"
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]   # nothing written
