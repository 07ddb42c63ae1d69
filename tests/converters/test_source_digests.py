"""Source sha256 digests known without reading the file: the HF hub cache (snapshot files are symlinks to
``blobs/<sha256>``) and ``huggingface-cli download --local-dir`` metadata. The manifest says how each
digest was obtained, and `port verify` recomputes the ones it did not compute."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from converters import convert
from converters.sources import MANIFEST, known_sha256
from porting.verify.roundtrip import verify_checkpoint
from tests.converters.conftest import EMBEDDED
from tests.helpers import port

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def hub_cache(root: Path, weights_name: str | None = None) -> Path:
    """stories260K laid out as huggingface_hub's cache does it: blobs named by sha256 (LFS files) or git
    sha1 (small files), a snapshot directory of relative symlinks. ``weights_name`` overrides the blob
    name of model.safetensors (a cache whose claim is wrong)."""
    repo = root / "models--port-test--stories260k"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for f in sorted(EMBEDDED.iterdir()):
        if f.is_file():
            lfs = f.suffix == ".safetensors"
            blob = (weights_name or sha(f)) if lfs else hashlib.sha1(f.read_bytes()).hexdigest()
            shutil.copyfile(f, repo / "blobs" / blob)
            (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    return snap


def source_entry(ms_dir: Path) -> dict:
    (entry,) = json.loads((ms_dir / MANIFEST).read_text())["source"]["files"]
    return entry


def test_hf_cache_blob_digest_is_used_and_verify_recomputes_it(tmp_path):
    snap = hub_cache(tmp_path / "hub")
    assert known_sha256(snap / "model.safetensors") == (sha(EMBEDDED / "model.safetensors"), "hf-cache-blob")
    assert known_sha256(snap / "config.json") is None  # a 40-hex git sha1 blob is not a sha256
    out = tmp_path / "ms"
    assert port("convert", "--hf", str(snap), "--out", str(out), "-q").returncode == 0
    entry = source_entry(out)
    assert entry["sha256"] == sha(EMBEDDED / "model.safetensors")
    assert entry["sha256_source"] == "hf-cache-blob"
    rows = {r.name: r for r in verify_checkpoint(snap, out, roundtrip=False)}
    assert all(r.passed for r in rows.values()), rows
    assert "1 sha256 recomputed and equal" in rows["ms-manifest"].detail, rows["ms-manifest"]
    # --source-hash computes nothing the cache already says: the digest still comes from the cache
    out2 = tmp_path / "ms2"
    assert port("convert", "--hf", str(snap), "--out", str(out2), "-q", "--source-hash").returncode == 0
    assert source_entry(out2)["sha256_source"] == "hf-cache-blob"


def test_verify_catches_a_cache_blob_whose_name_is_not_its_digest(tmp_path):
    wrong = hashlib.sha256(b"something else").hexdigest()
    snap = hub_cache(tmp_path / "hub", weights_name=wrong)
    out = tmp_path / "ms"
    convert.hf_to_ms(snap, out)
    assert source_entry(out)["sha256"] == wrong  # recorded as the cache claims it...
    rows = {r.name: r for r in verify_checkpoint(snap, out, roundtrip=False)}
    bad = rows["ms-manifest"]
    assert not bad.passed  # ...and verify finds out
    assert "model.safetensors: sha256" in bad.detail and "hf-cache-blob" in bad.detail, bad
    assert rows["ms-tensors"].passed  # the tensors themselves are fine


def test_local_dir_metadata_digest_only_while_the_file_is_unmodified(tmp_path):
    d = tmp_path / "local"
    shutil.copytree(EMBEDDED, d)
    meta = d / ".cache" / "huggingface" / "download" / "model.safetensors.metadata"
    meta.parent.mkdir(parents=True)
    digest = sha(d / "model.safetensors")
    meta.write_text(f"{COMMIT}\n{digest}\n{time.time()}\n")
    out = tmp_path / "ms"
    convert.hf_to_ms(d, out)
    assert (source_entry(out)["sha256"], source_entry(out)["sha256_source"]) == (digest, "hf-local-dir-metadata")
    assert all(r.passed for r in verify_checkpoint(d, out, roundtrip=False))
    # modified after the download (mtime later than the record): the record no longer counts
    now = time.time()
    os.utime(d / "model.safetensors", (now, now))
    meta.write_text(f"{COMMIT}\n{'0' * 64}\n{now - 100}\n")
    assert known_sha256(d / "model.safetensors") is None
    convert.hf_to_ms(d, out, force=True)  # by default an unknown digest is not computed...
    assert (source_entry(out)["sha256"], source_entry(out)["sha256_source"]) == (None, None)
    convert.hf_to_ms(d, out, force=True, hash_source=True)  # ...with --source-hash it is
    assert (source_entry(out)["sha256"], source_entry(out)["sha256_source"]) == (digest, "computed")
    # an etag that is a git sha1 (a non-LFS file) is not a sha256
    meta.write_text(f"{COMMIT}\n\"{'a' * 40}\"\n{time.time() + 10}\n")
    assert known_sha256(d / "model.safetensors") is None


def test_rehash_source_recomputes_computed_digests(tmp_path):
    out = tmp_path / "ms"
    convert.hf_to_ms(EMBEDDED, out, hash_source=True)
    m = json.loads((out / MANIFEST).read_text())
    assert m["source"]["files"][0]["sha256_source"] == "computed"
    m["source"]["files"][0]["sha256"] = "f" * 64  # a manifest edited by hand
    (out / MANIFEST).write_text(json.dumps(m))
    default = {r.name: r for r in verify_checkpoint(EMBEDDED, out, roundtrip=False)}
    assert default["ms-manifest"].passed  # computed digests are trusted unless asked
    rehash = {r.name: r for r in verify_checkpoint(EMBEDDED, out, roundtrip=False, rehash_source=True)}
    assert not rehash["ms-manifest"].passed and "recorded ffffffffffff" in rehash["ms-manifest"].detail
