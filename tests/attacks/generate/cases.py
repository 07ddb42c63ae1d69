"""`port generate --hf`: hostile model directories are one line, before any weight is loaded."""

from __future__ import annotations

from tests.attacks import inputs as I
from tests.attacks.harness import case


def _gen(src):
    return ["generate", "--hf", str(src), "--max-new-tokens", "2"]


@case("config.json", "not valid UTF-8", dest=None)
def config_not_utf8(d):
    src = I.hf(d)
    (src / "config.json").write_bytes(I.NOT_UTF8)
    return _gen(src)


@case("num_hidden_layers: found 100,000,000", dest=None)
def config_layers_1e8(d):
    return _gen(I.edit_config(I.hf(d), num_hidden_layers=100_000_000))


@case("num_hidden_layers: found 1,000,000", dest=None)
def config_layers_1e6(d):
    return _gen(I.edit_config(I.hf(d), num_hidden_layers=1_000_000))


@case("config.json", "deeper than", dest=None)
def config_nested_100000_levels(d):
    src = I.hf(d)
    (src / "config.json").write_text(I.deep_json())
    return _gen(src)


@case("vocab_size", dest=None)
def config_vocab_huge(d):
    return _gen(I.edit_config(I.hf(d), vocab_size=10 ** 12))


@case("rope_theta", dest=None)
def config_rope_theta_inf(d):
    return _gen(I.edit_config(I.hf(d), rope_theta=float("inf")))


@case("model.safetensors", dest=None)
def weights_header_nested(d):
    src = I.hf(d)
    I.raw_safetensors(src / "model.safetensors", I.deep_json().encode())
    return _gen(src)


@case(dest=None)
def hf_missing(d):
    return _gen(d / "no-such-model")


@case("tokenizer", dest=None)
def tokenizer_json_not_utf8(d):
    src = I.hf(d)
    (src / "tokenizer.json").write_bytes(I.NOT_UTF8)
    (src / "tokenizer.model").unlink()
    return _gen(src)
