"""The streaming pieces: the writer's format, the casts, the parallel copy-and-hash engine (blocks,
digests, kernel-side copies and their fallback, a full disk under copy_file_range), and peak memory
that does not grow with the checkpoint."""

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
from converters import shard_writer
from converters.safetensors_io import OutTensor, encode_header, read_header
from tests.converters.conftest import EMBEDDED, ROOT


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


def _stories_jobs(tmp_path: Path, dtype: str | None = None, hash_source: bool = True) -> list[shard_writer.FileJob]:
    """The embedded stories260K (real weights) as one copy-and-hash job into tmp_path/out.safetensors."""
    src = EMBEDDED / "model.safetensors"
    h = read_header(src)
    outs = [OutTensor(t.name, dtype or t.dtype, t.shape) for t in h.tensors]
    header = encode_header(outs, {"format": "ms"})
    spans, pos = [], len(header)
    for t, o in zip(h.tensors, outs):
        spans.append(shard_writer.TensorSpan(o.name, t.begin, t.end, pos, t.dtype, o.dtype))
        pos += o.nbytes
    dst = tmp_path / "out.safetensors"
    return [shard_writer.FileJob(src, dst, dst, header, src.stat().st_size, tuple(spans), hash_source)]


def test_blocks_cover_every_byte_once_and_chain_split_tensors():
    job = _stories_jobs(Path("/nonexistent"))[0]
    blocks = shard_writer.plan_blocks([job], block=40_000)  # small blocks: tensors split across several
    assert blocks[0].begin == 0 and blocks[-1].end == job.size
    assert all(a.end == b.begin for a, b in zip(blocks, blocks[1:]))
    assert all(0 < b.end - b.begin <= 40_000 for b in blocks)
    for i, t in enumerate(job.tensors):  # each tensor's pieces, in block order, tile its bytes exactly
        pieces = [p for b in blocks for p in b.pieces if p.tensor == i]
        assert [p.src for p in pieces] == list(range(t.src_begin, t.src_end, 40_000 - 40_000 % 4))[:len(pieces)]
        assert sum(p.src_len for p in pieces) == t.src_end - t.src_begin
        assert all(a.src + a.src_len == b.src for a, b in zip(pieces, pieces[1:]))
    split = [b for b in blocks if b.continues]
    assert split, "the embedding (131 KB) must span several 40 KB blocks"
    for b in split:
        prev = blocks[blocks.index(b) - 1]
        assert prev.pieces[-1].tensor == b.pieces[0].tensor


@pytest.mark.parametrize("workers", [1, 2, 5])
@pytest.mark.parametrize("dtype", [None, "BF16"])
def test_copy_and_hash_digests_and_bytes(tmp_path, monkeypatch, workers, dtype):
    """Every output byte equals the source's (or its cast); every digest equals hashlib's over the
    written file; any number of workers and small blocks/hash steps give the same result."""
    import hashlib

    monkeypatch.setattr(shard_writer, "BLOCK_BYTES", 48 << 10)
    monkeypatch.setattr(shard_writer, "HASH_STEP", 16 << 10)
    monkeypatch.setattr(shard_writer, "WINDOW", 2)
    job = _stories_jobs(tmp_path, dtype)[0]
    seen: list[int] = []
    fds, tds, ways = shard_writer.copy_and_hash([job], seen.append, workers=workers)
    src, out = job.src.read_bytes(), job.dst.read_bytes()
    assert fds == [hashlib.sha256(src).hexdigest()]
    assert sum(seen) == len(src) and len(seen) > 5
    assert out[:len(job.header)] == job.header
    for t, digest in zip(job.tensors, tds[0]):
        want = bytes(dtypes.cast_bytes(t.src_dtype, t.dst_dtype, memoryview(src[t.src_begin:t.src_end])))
        n = len(want)
        assert out[t.dst_begin:t.dst_begin + n] == want, t.name
        assert digest == hashlib.sha256(out[t.dst_begin:t.dst_begin + n]).hexdigest(), t.name
    assert len(out) == job.tensors[-1].dst_begin + len(want)
    assert ways["copy_file_range"] + ways["write"] == len(out) - len(job.header)
    if dtype is None:  # same filesystem: everything is copied inside the kernel
        assert ways == {"copy_file_range": len(out) - len(job.header), "write": 0}


def test_copy_and_hash_without_source_hash(tmp_path):
    fds, tds, _ = shard_writer.copy_and_hash(_stories_jobs(tmp_path, hash_source=False))
    assert fds == [None] and all(len(d) == 64 for d in tds[0])


def test_convert_onto_another_filesystem(tmp_path):
    """/dev/shm is tmpfs: copy_file_range from ext4 fails with EXDEV and the engine writes the same bytes
    from user space (the manifest says which way every byte went)."""
    if not Path("/dev/shm").is_dir() or shutil.disk_usage("/dev/shm").free < 64 << 20:
        pytest.skip("no usable /dev/shm")
    if os.stat("/dev/shm").st_dev == os.stat(EMBEDDED).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the repository")
    from converters import convert

    out = Path("/dev/shm") / f"port-test-{os.getpid()}"
    try:
        m = convert.hf_to_ms(EMBEDDED, out)
        a, b = read_header(EMBEDDED / "model.safetensors"), read_header(out / "model.safetensors")
        raw_a, raw_b = (EMBEDDED / "model.safetensors").read_bytes(), (out / "model.safetensors").read_bytes()
        assert raw_a[a.header_bytes:] == raw_b[b.header_bytes:]
        assert m["output"]["bytes_written_by"] == {"copy_file_range": 0, "write": len(raw_a) - a.header_bytes}
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount a tmpfs")
def test_disk_full_under_copy_file_range_is_a_clean_error(tmp_path, monkeypatch):
    """Source and output on one small tmpfs, so the weights go through copy_file_range and it hits ENOSPC
    (the free-space pre-check is bypassed: it would refuse before a byte is copied)."""
    from converters import atomic, convert
    from model_zoo.errors import CheckpointError

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount tmpfs here")
    try:
        src = mnt / "hf"
        shutil.copytree(EMBEDDED, src)  # ~1 MB of weights: room for the source and half a copy
        with open(src / "config.json", "rb") as a, open(mnt / "probe", "wb") as b:  # the copy's first choice works here
            assert os.copy_file_range(a.fileno(), b.fileno(), 64) == 64
        (mnt / "probe").unlink()
        monkeypatch.setattr(atomic, "check_free_space", lambda dest, need: None)
        out = mnt / "out"
        with pytest.raises(CheckpointError) as e:
            convert.hf_to_ms(src, out)
        msg = str(e.value)
        assert "\n" not in msg and "disk full while writing" in msg and str(out / "model.safetensors") in msg, msg
        assert sorted(p.name for p in mnt.iterdir()) == ["hf"], "no output, no temporary directory left"
    finally:
        subprocess.run(["umount", str(mnt)])


def _peak_rss_kib(args: list[str]) -> int:
    res = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "porting", *args], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return int(res.stderr.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="needs GNU time for peak RSS")
@pytest.mark.slow
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


def test_ms_output_data_sits_at_the_source_page_offset(tmp_path):
    """HF -> MS pads the MindSpore header with spaces so the data starts at the same offset within a page
    as in the source (whole-page kernel copies); MS -> HF writes the HF header exactly as before."""
    from converters import convert

    ms, back = tmp_path / "ms", tmp_path / "hf"
    convert.hf_to_ms(EMBEDDED, ms)
    convert.ms_to_hf(ms, back)
    src, out = read_header(EMBEDDED / "model.safetensors"), read_header(ms / "model.safetensors")
    assert src.header_bytes % 4096 == out.header_bytes % 4096 and out.header_bytes % 8 == 0
    assert [(t.name, t.shape, t.dtype) for t in out.tensors] == [
        (n, t.shape, t.dtype) for n, t in zip([t.name for t in out.tensors], src.tensors)]
    assert (back / "model.safetensors").read_bytes() == (EMBEDDED / "model.safetensors").read_bytes()
    plain = encode_header([OutTensor("a", "F32", (3,))], None)
    assert len(plain) % 8 == 0 and len(encode_header([OutTensor("a", "F32", (3,))], None, 8 + 4096 * 3 + 80)) % 4096 == 88
    assert encode_header([OutTensor("a", "F32", (3,))], None, 8 * 5 + 3) == plain  # not a multiple of 8: no padding
