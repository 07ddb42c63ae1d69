"""`port zoo`: hostile registries and config.json files. The registry sits at ``out/zoo.json`` (relative:
the harness runs each case in its own directory), the only place a case may write."""

from __future__ import annotations

import json

from tests.attacks import inputs as I
from tests.attacks.harness import case

REG = {"PORT_ZOO_FILE": "out/zoo.json"}


def _registry(d, text: str) -> None:
    (d / "out").mkdir()
    (d / "out" / "zoo.json").write_text(text)


def _entry(d, **extra) -> dict:
    return {"name": "mine", "hf_repo": "o/mine", "path": None,
            "hf_config": json.loads((I.hf(d) / "config.json").read_text()), **extra}


@case("zoo.json", "integer of 5,000 digits", env=REG)
def registry_with_a_5000_digit_integer(d):
    _registry(d, '{"models": [], "n": ' + "7" * 5000 + "}")
    return ["zoo", "show", "mine"]


@case("zoo.json", "integer of 401 digits", env=REG)
def registry_entry_with_a_401_digit_layer_count(d):
    e = _entry(d)
    text = json.dumps({"models": [e]}).replace('"num_hidden_layers": 5', '"num_hidden_layers": ' + "9" * 401)
    _registry(d, text)
    return ["zoo", "list"]


@case("zoo.json", "built-in names work meanwhile", exit_code=2, env=REG)
def registry_of_the_wrong_shape_still_lists_built_ins(d):
    _registry(d, '{"models": {"name": "x"}}')
    return ["zoo", "list"]


@case("zoo.json", "expected a regular file", env=REG)
def registry_that_is_a_directory(d):
    (d / "out" / "zoo.json").mkdir(parents=True)
    return ["zoo", "add", "mine", "--hf", str(I.hf(d))]


@case("zoo.json", "cannot create the zoo registry", env={"PORT_ZOO_FILE": "out/file/zoo.json"})
def registry_path_under_a_regular_file(d):
    (d / "out").mkdir()
    (d / "out" / "file").write_text("a file, not a directory\n")
    return ["zoo", "add", "mine", "--hf", str(I.hf(d))]


@case("config.json", "more than the 1,048,576 allowed", env=REG)
def add_a_30_mb_config_json(d):
    src = I.hf(d)
    cfg = json.loads((src / "config.json").read_text())
    cfg["padding"] = "x" * (30 << 20)
    (src / "config.json").write_text(json.dumps(cfg))
    return ["zoo", "add", "big", "--hf", str(src)]


@case("config.json", "integer of 5,000 digits", env=REG)
def add_a_config_json_with_a_5000_digit_vocab(d):
    src = I.hf(d)
    text = (src / "config.json").read_text().replace('"vocab_size": 512', '"vocab_size": ' + "1" * 5000)
    (src / "config.json").write_text(text)
    return ["zoo", "add", "big", "--hf", str(src)]


@case("zoo.json", "not valid UTF-8", env=REG)
def registry_not_utf8(d):
    (d / "out").mkdir()
    (d / "out" / "zoo.json").write_bytes(I.NOT_UTF8)
    return ["zoo", "remove", "mine"]


def _registry_kept(line: str, d) -> None:
    doc = json.loads((d / "out" / "zoo.json").read_text())
    assert doc["comment"] == "mine" and [m.get("note") for m in doc["models"]] == ["kept"], doc


@case("already in", env=REG, check=_registry_kept)
def add_twice_keeps_the_first(d):
    _registry(d, json.dumps({"models": [_entry(d, note="kept")], "comment": "mine"}))
    return ["zoo", "add", "mine", "--hf", str(d / "src")]
