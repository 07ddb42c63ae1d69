"""The streaming pieces: the writer's format, the casts, kernel-side copies and their fallback, and peak
memory that does not grow with the checkpoint."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from converters import dtypes
from converters.safetensors_io import OutTensor, copy_range, encode_header, read_header
from tests.converters.conftest import ROOT


def test_header_identical_to_the_safetensors_library(tmp_path):
    from safetensors.numpy import save_file

    arrays = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a.weight": np.ones((3, 5), np.float16),
              "z": np.zeros((0, 4), np.float32), "c": np.ones(1, np.float64)}
    save_file(arrays, tmp_path / "lib.safetensors", metadata={"format": "pt"})
    h = read_header(tmp_path / "lib.safetensors")
    ours = encode_header([OutTensor(t.name, t.dtype, t.shape) for t in h.tensors], {"format": "pt"})
    lib = (tmp_path / "lib.safetensors").read_bytes()
    assert lib[:h.header_bytes] == ours


def test_casts_bit_identical_to_torch():
    import torch

    special = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3.4e38, 65504.0, 1e5,
                        1.00390625, 1.01171875, 5.96e-8], dtype=np.float32)
    x = np.concatenate([special, np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 50])
    t = torch.from_numpy(x)
    nan = np.isnan(x)
    for dst, tdt in (("BF16", torch.bfloat16), ("F16", torch.float16)):
        ours = np.frombuffer(bytes(dtypes.cast_bytes("F32", dst, memoryview(x.tobytes()))), np.uint16)
        want = t.to(tdt).view(torch.int16).numpy().view(np.uint16)
        # every number bit-identical; NaN stays NaN (torch's vectorised path writes 0xFFFF, its scalar
        # path 0x7FC0 as we do: NaN payloads are not part of the contract)
        assert np.array_equal(ours[~nan], want[~nan]), dst
        assert np.isnan(t.to(tdt)[torch.from_numpy(nan)].float()).all()
        widened = np.frombuffer(bytes(dtypes.cast_bytes(dst, "F32", memoryview(ours.tobytes()))), np.float32)
        assert np.isnan(widened[nan]).all()
        assert widened[~nan].tobytes() == t.to(tdt).float().numpy()[~nan].tobytes(), dst
    bf = t.to(torch.bfloat16)
    ours = bytes(dtypes.cast_bytes("BF16", "F16", memoryview(bf.view(torch.int16).numpy().tobytes())))
    assert ours == bf.to(torch.float16).view(torch.int16).numpy().tobytes()


def test_copy_range_falls_back_to_write_for_a_pipe(tmp_path):
    src = tmp_path / "src.bin"
    data = os.urandom(1 << 20)
    src.write_bytes(data)
    r, w = os.pipe()
    with open(src, "rb") as f, os.fdopen(w, "wb", buffering=0) as out:
        view = memoryview(data)[1000:1000 + 50_000]
        import threading
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(os.fdopen(r, "rb").read()))
        reader.start()
        copy_range(f.fileno(), 1000, 50_000, out, view)
    reader.join()
    assert bytes(got) == data[1000:51_000]


def test_convert_onto_another_filesystem(tmp_path):
    """/dev/shm is tmpfs: copy_file_range from ext4 fails (EXDEV) or copies; either way the bytes match."""
    if not Path("/dev/shm").is_dir() or shutil.disk_usage("/dev/shm").free < 64 << 20:
        pytest.skip("no usable /dev/shm")
    from converters import convert
    from tests.converters.conftest import EMBEDDED

    out = Path("/dev/shm") / f"port-test-{os.getpid()}"
    try:
        convert.hf_to_ms(EMBEDDED, out)
        a, b = read_header(EMBEDDED / "model.safetensors"), read_header(out / "model.safetensors")
        raw_a, raw_b = (EMBEDDED / "model.safetensors").read_bytes(), (out / "model.safetensors").read_bytes()
        assert raw_a[a.header_bytes:] == raw_b[b.header_bytes:]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _peak_rss_kib(args: list[str]) -> int:
    res = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "porting", *args], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return int(res.stderr.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time for peak RSS")
def test_peak_rss_does_not_grow_with_model_size(tmp_path):
    """Converting ~55 MiB and ~420 MiB bf16 checkpoints (with and without a cast) costs the same memory."""
    from converters.synthetic import write_random_hf
    from model_zoo import presets

    base = dataclasses.replace(presets.config("tinyllama-1.1b"), vocab_size=2048)  # ~46 MiB per layer
    rss = {}
    for layers in (1, 9):
        src = tmp_path / f"l{layers}"
        write_random_hf(dataclasses.replace(base, num_hidden_layers=layers), src, 2)
        size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
        rss[layers] = (size, _peak_rss_kib(["convert", "--hf", str(src), "--out", str(tmp_path / f"o{layers}"), "-q"]),
                       _peak_rss_kib(["convert", "--hf", str(src), "--out", str(tmp_path / f"c{layers}"), "-q",
                                      "--dtype", "fp32"]))
        shutil.rmtree(tmp_path / f"o{layers}")
        shutil.rmtree(tmp_path / f"c{layers}")
    (small, keep_s, cast_s), (big, keep_b, cast_b) = rss[1], rss[9]
    assert big > 6 * small
    grown = max(keep_b - keep_s, cast_b - cast_s) * 1024
    assert grown < 64 << 20, f"peak RSS grew by {grown / 2**20:.0f} MiB for {(big - small) / 2**20:.0f} MiB more data"
    assert max(keep_b, cast_b) * 1024 < 1 << 30


def test_progress_counts_every_source_byte(hf_factory, tmp_path):
    from converters import convert

    src = hf_factory("llama-gqa", "bfloat16", "24KB")
    seen: list[int] = []
    plan = convert.build_plan(src, convert.HF_TO_MS)
    convert.execute(plan, tmp_path / "ms", progress=seen.append)
    assert sum(seen) == plan.source.total_bytes == sum(p.stat().st_size for p in src.glob("*.safetensors"))
    assert len(seen) > 1
