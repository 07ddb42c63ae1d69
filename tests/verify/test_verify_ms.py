"""`port verify --hf SRC --ms DIR`: checkpoint checks, round trip and parity on the converted weights."""

from __future__ import annotations

import json
import os

from tests.helpers import port


def test_verify_converted_stories_then_a_flipped_byte_fails(tmp_path):
    out = tmp_path / "ms"
    res = port("convert", "--hf", "stories260k", "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    res = port("verify", "--hf", "stories260k", "--ms", str(out), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    names = [r["name"] for r in rep["checks"]]
    assert names == ["ms-config", "ms-coverage", "ms-manifest", "ms-tensors", "roundtrip", "logits", "loss"], names
    assert rep["passed"] and rep["zoo_weights_from"] == str(out)
    # the JSON form of a row is the one every verification writes: these keys in this order
    assert all(list(r) == ["name", "measure", "value", "tolerance", "passed", "detail"] for r in rep["checks"])
    tensors = rep["checks"][3]
    assert (tensors["measure"], tensors["value"], tensors["tolerance"]) == ("tensors_differing", 0, 0), tensors
    assert tensors["detail"].startswith("47 tensors equal the source (bitwise)"), tensors

    f = out / "model.safetensors"
    os.chmod(f, 0o644)
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x40  # a mantissa bit of the last tensor's last element
    f.write_bytes(bytes(data))
    res = port("verify", "--hf", "stories260k", "--ms", str(out), "--json")
    assert res.returncode == 1
    rep = json.loads(res.stdout)
    rows = {r["name"]: r for r in rep["checks"]}
    assert rep["parity"].startswith("not run: the checkpoint failed ms-manifest, ms-tensors"), rep["parity"]
    assert not rows["ms-tensors"]["passed"] and rows["ms-tensors"]["value"] == 1
    detail = rows["ms-manifest"]["detail"]
    assert not rows["ms-manifest"]["passed"] and "claim 'tensor digests' failed" in detail, detail


def test_verify_ms_missing_dir_is_one_line(tmp_path):
    res = port("verify", "--hf", "stories260k", "--ms", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no such directory" in res.stderr and res.stderr.count("\n") == 1
