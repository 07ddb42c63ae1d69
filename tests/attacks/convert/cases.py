"""`port convert`: names from manifests and indexes, --out path tricks, hostile config.json and headers."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case


def _name(value):
    def gen(d: Path) -> list[str]:
        m = I.ms(d)
        I.edit_manifest(m, lambda x: x["hf_layout"]["files"]["model.safetensors"].__setitem__("name", value(d)))
        return ["convert", "--ms", str(m), "--out", str(d / "out")]
    return gen


# -- output names from port_manifest.json
@case("hf_layout.files['model.safetensors'].name", "'../X.safetensors'", "plain file name")
def manifest_name_dotdot(d):
    return _name(lambda d: "../X.safetensors")(d)


@case("hf_layout.files['model.safetensors'].name", "plain file name")
def manifest_name_absolute_over_a_canary(d):
    return _name(lambda d: str(I.canary(d)))(d)


@case("plain file name")
def manifest_name_subdirectory(d):
    return _name(lambda d: "sub/model.safetensors")(d)


@case("plain file name")
def manifest_name_backslash(d):
    return _name(lambda d: "..\\..\\model.safetensors")(d)


@case("plain file name")
def manifest_name_empty(d):
    return _name(lambda d: "")(d)


@case("plain file name")
def manifest_name_dot_dot_only(d):
    return _name(lambda d: "..")(d)


@case("plain file name")
def manifest_name_not_a_string(d):
    return _name(lambda d: 7)(d)


@case("plain file name")
def manifest_name_with_nul(d):
    return _name(lambda d: "model\x00.safetensors")(d)


@case("plain file name")
def manifest_name_dotdot_other_extension(d):
    return _name(lambda d: "../../port_manifest.json")(d)


@case("hf_layout.files['model.safetensors'].metadata", "object of strings")
def manifest_metadata_not_strings(d):
    m = I.ms(d)
    I.edit_manifest(m, lambda x: x["hf_layout"]["files"]["model.safetensors"].__setitem__("metadata", {"a": [1]}))
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


@case("hf_layout: expected an object")
def manifest_layout_is_a_list(d):
    m = I.ms(d)
    I.edit_manifest(m, lambda x: x.__setitem__("hf_layout", [1, 2]))
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


@case("hf_layout.index_metadata")
def manifest_index_metadata_string(d):
    m = I.ms(d)
    I.edit_manifest(m, lambda x: x["hf_layout"].__setitem__("index_metadata", "x"))
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


@case("port_manifest.json", "not valid UTF-8")
def manifest_not_utf8(d):
    m = I.ms(d)
    (m / "port_manifest.json").write_bytes(I.NOT_UTF8)
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


@case("port_manifest.json", "nests deeper")
def manifest_nested_100000_levels(d):
    m = I.ms(d)
    (m / "port_manifest.json").write_text('{"hf_layout": ' + I.deep_json() + "}")
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


@case("port_manifest.json", "more than")
def manifest_of_100_mb(d):
    m = I.ms(d)
    I.big_sparse(m / "port_manifest.json", 100 << 20)
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


@case("port_manifest.json", "invalid")
def manifest_truncated(d):
    m = I.ms(d)
    raw = (m / "port_manifest.json").read_bytes()
    (m / "port_manifest.json").write_bytes(raw[: len(raw) // 2])
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


# -- --out resolved before the overlap check
@case("overlaps the input", dest=None)
def out_dotdot_to_source_with_force(d):
    src = I.hf(d)
    (d / "x").mkdir()
    return ["convert", "--hf", str(src), "--out", str(d / "x" / ".." / "src"), "--force"]


@case("overlaps the input", dest=None)
def out_dotdot_to_source_creates_nothing(d):
    src = I.hf(d)  # x/ does not exist and must not be created
    return ["convert", "--hf", str(src), "--out", str(d / "x" / ".." / "src")]


@case("is a symbolic link", dest=None)
def out_symlink_to_source_with_force(d):
    src = I.hf(d)
    os.symlink(src, d / "link")
    return ["convert", "--hf", str(src), "--out", str(d / "link"), "--force"]


@case("overlaps the input", dest=None)
def out_is_the_parent_of_the_source_with_force(d):
    src = I.hf(d / "models")
    return ["convert", "--hf", str(src), "--out", str(d / "models"), "--force"]


@case("overlaps the input", dest=None)
def out_inside_the_source(d):
    src = I.hf(d)
    return ["convert", "--hf", str(src), "--out", str(src / "ms")]


@case("overlaps the input", dest=None)
def ms_out_is_the_ms_source_with_force(d):
    m = I.ms(d)
    return ["convert", "--ms", str(m), "--out", str(d / "." / "ms"), "--force"]


@case("holds the input", dest=None)
def out_holds_the_config_with_force(d):
    m = I.ms(d)
    (d / "base").mkdir()
    (d / "base" / "config.json").write_bytes((m / "config.json").read_bytes())
    (m / "config.json").unlink()
    (d / "base" / "port_manifest.json").write_text("{}")  # looks like a port output
    return ["convert", "--ms", str(m), "--config", str(d / "base" / "config.json"), "--out", str(d / "base"),
            "--force"]


@case("is not a `port convert` output", dest=None)
def force_over_a_directory_port_did_not_write(d):
    src = I.hf(d)
    (d / "mine").mkdir()
    (d / "mine" / "thesis.tex").write_text("years of work")
    return ["convert", "--hf", str(src), "--out", str(d / "mine"), "--force"]


@case("exists and is not empty", dest=None)
def out_not_empty_without_force(d):
    src = I.hf(d)
    (d / "out").mkdir()
    (d / "out" / "keep.txt").write_text("mine")
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("exists and is a file", dest=None)
def out_is_a_file(d):
    src = I.hf(d)
    (d / "out").write_text("a file")
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("is a file", dest=None)
def out_under_a_file(d):
    src = I.hf(d)
    (d / "f").write_text("a file")
    return ["convert", "--hf", str(src), "--out", str(d / "f" / "out")]


@case("cannot create the output directory there", dest=None)
def out_under_proc(d):
    src = I.hf(d)
    return ["convert", "--hf", str(src), "--out", "/proc/port-attack-out"]


# -- hostile config.json (non-UTF-8, num_hidden_layers 1e8 / 1e6)
def _cfg(**fields):
    def gen(d: Path) -> list[str]:
        src = I.edit_config(I.hf(d), **fields)
        return ["convert", "--hf", str(src), "--out", str(d / "out")]
    return gen


for _n, _f, _e in [
    ("config_layers_1e8", {"num_hidden_layers": 100_000_000}, "num_hidden_layers: found 100,000,000, expected at most"),
    ("config_layers_1e6", {"num_hidden_layers": 1_000_000}, "num_hidden_layers: found 1,000,000"),
    ("config_layers_float", {"num_hidden_layers": 1e8}, "expected a positive integer"),
    ("config_hidden_size_1e12", {"hidden_size": 10 ** 12}, "hidden_size: found"),
    ("config_vocab_2_63", {"vocab_size": 2 ** 63}, "vocab_size: found"),
    ("config_vocab_bool", {"vocab_size": True}, "expected a positive integer"),
    ("config_heads_zero", {"num_attention_heads": 0}, "num_attention_heads"),
    ("config_intermediate_negative", {"intermediate_size": -5}, "intermediate_size"),
    ("config_positions_huge", {"max_position_embeddings": 10 ** 15}, "max_position_embeddings"),
    ("config_params_product_absurd", {"hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 1024,
                                      "num_attention_heads": 512, "num_key_value_heads": 512},
     "parameters, expected at most"),
    ("config_rope_theta_inf", {"rope_theta": float("inf")}, "rope_theta"),
    ("config_rms_eps_nan", {"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ("config_rms_eps_bool", {"rms_norm_eps": True}, "rms_norm_eps"),
    ("config_sliding_window_huge", {"model_type": "mistral", "sliding_window": 10 ** 12}, "sliding_window"),
    ("config_model_type_unknown", {"model_type": "gpt2"}, "unsupported architecture"),
]:
    def _named(gen, n=_n):
        gen.__name__ = n
        return gen
    globals()[_n] = case(_e, "config.json")(_named(_cfg(**_f)))


@case("config.json", "not valid UTF-8")
def config_not_utf8(d):
    src = I.hf(d)
    (src / "config.json").write_bytes(I.NOT_UTF8)
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("config.json", "deeper than")
def config_nested_100000_levels(d):
    src = I.hf(d)
    (src / "config.json").write_text(I.deep_json())
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("config.json", "more than")
def config_of_2_mb(d):
    src = I.hf(d)
    (src / "config.json").write_text(" " * (2 << 20) + "{}")
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("config.json", "expected a JSON object")
def config_is_a_list(d):
    src = I.hf(d)
    (src / "config.json").write_text("[1, 2]")
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("config.json", "expected a regular file")
def config_is_a_fifo(d):
    src = I.hf(d)
    (src / "config.json").unlink()
    os.mkfifo(src / "config.json")  # reading it would block forever
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


# -- hostile safetensors headers and indexes (held before; kept so they stay held)
@case("model.safetensors")
def header_length_2_60(d):
    src = I.hf(d)
    I.raw_safetensors(src / "model.safetensors", b"{}", length=1 << 60)
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("model.safetensors")
def header_nested_100000_levels(d):
    src = I.hf(d)
    I.raw_safetensors(src / "model.safetensors", I.deep_json().encode())
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("model.safetensors")
def header_offsets_overlap(d):
    src = I.hf(d)
    hdr = {"model.norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]},
           "lm_head.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}
    I.raw_safetensors(src / "model.safetensors", hdr, b"\0" * 256)
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


def _index(name: str, weight_map_text: str, *expect: str):
    def gen(d: Path) -> list[str]:
        src = I.hf(d)
        (src / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": ' + weight_map_text + "}")
        return ["convert", "--hf", str(src), "--out", str(d / "out")]
    gen.__name__ = name
    globals()[name] = case("model.safetensors.index.json", *expect)(gen)


_index("index_shard_dotdot", '{"model.norm.weight": "../model.safetensors"}', "not a plain file name")
_index("index_shard_absolute", '{"model.norm.weight": "/etc/passwd"}', "not a plain file name")
_index("index_nested_100000", I.deep_json())


@case("model.safetensors.index.json")
def index_not_utf8(d):
    src = I.hf(d)
    (src / "model.safetensors.index.json").write_bytes(I.NOT_UTF8)
    return ["convert", "--hf", str(src), "--out", str(d / "out")]


@case("param_name_map.json")
def ms_index_shard_dotdot(d):
    m = I.ms(d)
    (m / "param_name_map.json").write_text(json.dumps({"model.norm.weight": "../../model.safetensors"}))
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


@case("param_name_map.json")
def ms_index_nested_100000(d):
    m = I.ms(d)
    (m / "param_name_map.json").write_text(I.deep_object())
    return ["convert", "--ms", str(m), "--out", str(d / "out")]


# -- a full disk while copying the companion files is the destination's problem, not the source's
def _names_the_output(line: str, d: Path) -> None:
    assert str(d / "out" / "generation_config.json") in line and str(d / "src") not in line, line


@case("disk full while writing", "nothing was written", dest=None, subprocess=True, timeout=30,
      fsize=1_500_000, check=_names_the_output)
def disk_full_while_copying_a_companion(d):
    """The weights (1 MB) fit under the file-size limit, a 2 MB generation_config.json does not: the error
    names the output file, never the source's, and nothing is left at --out."""
    src = I.hf(d)
    (src / "generation_config.json").write_text('{"x": "' + "y" * (2 << 20) + '"}')
    return ["convert", "--hf", str(src), "--out", str(d / "out"), "--quiet"]


# -- a file copied beside the weights is bounded before anything is written
@case("tokenizer.model", "bytes, more than the 268,435,456", "replace it with the model's own file")
def companion_file_of_300_mb(d):
    src = I.hf(d)
    os.truncate(src / "tokenizer.model", 300 << 20)   # sparse: no disk used, a 300 MB copy if it were copied
    return ["convert", "--hf", str(src), "--out", str(d / "out")]
