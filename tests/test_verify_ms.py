"""`port verify --hf SRC --ms DIR`: checkpoint checks, round trip and parity on the converted weights."""

from __future__ import annotations

import json
import os

from tests.test_cli import port


def test_verify_converted_stories_then_a_flipped_byte_fails(tmp_path):
    out = tmp_path / "ms"
    res = port("convert", "--hf", "stories260k", "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    res = port("verify", "--hf", "stories260k", "--ms", str(out), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    assert [r["name"] for r in rep["checkpoint"]] == ["ms-config", "ms-coverage", "ms-manifest", "ms-tensors", "roundtrip"]
    assert rep["passed"] and rep["zoo_weights_from"] == str(out)
    # the JSON form of a row is the one scripts read: these keys in this order, counts under numbers
    assert all(list(r) == ["name", "passed", "detail", "numbers"] for r in rep["checkpoint"]), rep["checkpoint"]
    assert rep["checkpoint"][3]["numbers"]["compared"] > 0

    f = out / "model.safetensors"
    os.chmod(f, 0o644)
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x40  # a mantissa bit of the last tensor's last element
    f.write_bytes(bytes(data))
    res = port("verify", "--hf", "stories260k", "--ms", str(out), "--json")
    assert res.returncode == 1
    rows = {r["name"]: r for r in json.loads(res.stdout)["checkpoint"]}
    assert not rows["ms-tensors"]["passed"]
    detail = rows["ms-manifest"]["detail"]
    assert not rows["ms-manifest"]["passed"] and "claim 'tensor digests' failed" in detail, detail


def test_verify_ms_missing_dir_is_one_line(tmp_path):
    res = port("verify", "--hf", "stories260k", "--ms", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no such directory" in res.stderr and res.stderr.count("\n") == 1
