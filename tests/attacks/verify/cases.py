"""`port verify --ms`: every claim of the manifest is checked and the failing one is named (verdicts: exit 1,
the FAIL row in stdout), and hostile inputs are one line."""

from __future__ import annotations

from pathlib import Path

from porting.verify.check import Check, line
from tests.attacks import inputs as I
from tests.attacks.harness import case

# The failed row of a claim and of the tensor comparison, as `port verify` prints them (porting.verify.check).
MANIFEST_FAILED = line(Check.claim("ms-manifest", False, ""))
CONFIG_FAILED = line(Check.claim("ms-config", False, ""))
ONE_TENSOR_DIFFERS = line(Check("ms-tensors", "tensors_differing", 1, 0, False, ""))


def _verify(d: Path, m: Path, *extra: str) -> list[str]:
    return ["verify", "--hf", str(I.hf(d)), "--ms", str(m), "--no-roundtrip", *extra]


def _claim(name: str, edit, *expect: str, roundtrip: bool = False):
    """A case whose manifest was edited by ``edit(manifest)``: verify must FAIL the row that checks it."""
    def gen(d: Path) -> list[str]:
        m = I.ms(d)
        I.edit_manifest(m, edit)
        argv = _verify(d, m)
        return [a for a in argv if a != "--no-roundtrip"] if roundtrip else argv
    gen.__name__ = name
    globals()[name] = case(*expect, dest=None, verdict=True, timeout=60)(gen)


def _zero(m):
    for r in m["tensors"]:
        r["sha256"] = "0" * 64


def _one(key, value, i=0):
    def edit(m):
        m["tensors"][i][key] = value
    return edit


# -- the per-tensor digests were never checked
_claim("zeroed_tensor_digests", _zero, "FAIL    claim 'tensor digests' failed", "47 of 47 tensor(s) do not match")
_claim("zeroed_tensor_digests_with_roundtrip", _zero, "FAIL    claim 'tensor digests' failed", roundtrip=True)
_claim("one_tensor_digest_changed", _one("sha256", "f" * 64, 5), "FAIL    claim 'tensor digests' failed", "1 of 47")
_claim("tensor_digest_missing", _one("sha256", None), "FAIL    claim 'tensor digests' failed")
_claim("tensor_record_names_another_file", _one("file", "other.safetensors"), "FAIL    claim 'tensor digests' failed",
       "recorded file/dtype/shape")
_claim("tensor_record_wrong_shape", _one("shape", [1, 2, 3]), "FAIL    claim 'tensor digests' failed", "recorded file/dtype/shape")
_claim("tensor_record_wrong_dtype", _one("dtype", "F16"), "FAIL    claim 'tensor digests' failed")
_claim("tensor_record_removed", lambda m: m["tensors"].pop(), "FAIL    claim 'tensor digests' failed", "no record for")
_claim("tensor_record_of_an_absent_tensor",
       lambda m: m["tensors"].append(dict(m["tensors"][0], name="model.ghost.weight")), "FAIL    claim 'tensor digests' failed",
       "records of absent tensors")
_claim("tensor_records_not_a_list", lambda m: m.__setitem__("tensors", {"a": 1}), "FAIL    claim 'tensor digests' failed")
# -- the name map
_claim("name_map_edited", lambda m: m["name_map"].update({"x.{}.y": "z.{}.w"}), "FAIL    claim 'name map' failed",
       "name_map differs")
_claim("name_map_removed", lambda m: m.pop("name_map"), "FAIL    claim 'name map' failed")
_claim("model_type_edited", lambda m: m.__setitem__("model_type", "qwen2"), "FAIL    claim 'name map' failed", "model_type")
_claim("record_source_name_swapped", _one("source_name", "lm_head.weight", 3), "FAIL    claim 'name map' failed",
       "do not follow the name map")
# -- the source files
_claim("source_digest_malformed", lambda m: m["source"]["files"][0].__setitem__("sha256", "zz"),
       "FAIL    claim 'source files' failed", "not a 64-digit hex digest")
_claim("source_size_edited", lambda m: m["source"]["files"][0].__setitem__("bytes", 1), "FAIL    claim 'source files' failed",
       "source files recorded differ")
_claim("source_files_not_a_list", lambda m: m["source"].__setitem__("files", 3), "FAIL    claim 'source files' failed")


@case(MANIFEST_FAILED, "not valid UTF-8", dest=None, verdict=True, timeout=60)
def manifest_not_utf8(d):
    m = I.ms(d)
    (m / "port_manifest.json").write_bytes(I.NOT_UTF8)
    return _verify(d, m)


@case(MANIFEST_FAILED, "nests deeper", dest=None, verdict=True, timeout=60)
def manifest_nested_100000_levels(d):
    m = I.ms(d)
    (m / "port_manifest.json").write_text(I.deep_json())
    return _verify(d, m)


@case(MANIFEST_FAILED, "missing", dest=None, verdict=True, timeout=60)
def manifest_removed(d):
    m = I.ms(d)
    (m / "port_manifest.json").unlink()
    return _verify(d, m)


@case(ONE_TENSOR_DIFFERS, dest=None, verdict=True, timeout=60)
def tensor_byte_flipped(d):
    m = I.ms(d)
    f = m / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-3] ^= 0x40
    f.write_bytes(bytes(raw))
    return _verify(d, m)


@case("no such directory", dest=None)
def ms_dir_missing(d):
    return _verify(d, d / "nope")


@case(CONFIG_FAILED, "not valid UTF-8", dest=None, verdict=True)
def hf_config_not_utf8(d):
    src = I.hf(d)
    (src / "config.json").write_bytes(I.NOT_UTF8)
    return ["verify", "--hf", str(src), "--ms", str(I.ms(d)), "--no-roundtrip"]


@case("num_hidden_layers: found 100,000,000", dest=None)
def hf_config_layers_1e8(d):
    src = I.edit_config(I.hf(d), num_hidden_layers=100_000_000)
    return ["verify", "--hf", str(src)]


@case("config.json", "deeper than", dest=None)
def hf_config_nested(d):
    src = I.hf(d)
    (src / "config.json").write_text(I.deep_json())
    return ["verify", "--hf", str(src)]
