"""Every bad input of issue 3: one-line error naming the file (and tensor), non-zero exit, nothing at --out.

Most cases run the real click command in-process (CliRunner) for speed; the process-level cases
(pickle that would run code, kill -9, disk full) run `python -m porting` in a subprocess.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.converters.conftest import ROOT, one_line_error, read_raw_header, write_raw
from tests.helpers import port

pytestmark = pytest.mark.filterwarnings("ignore")


def convert(*args: str):
    from porting.cli import main

    return CliRunner().invoke(main, ["convert", *args])


def assert_refused(res, out: Path, *needles: str) -> str:
    assert res.exit_code != 0, res.output
    line = one_line_error(res.stderr)
    for n in needles:
        assert n in line, f"{n!r} not in {line!r}"
    assert not out.exists(), "partial output left at the destination"
    assert not list(out.parent.glob(f".{out.name}.port-tmp-*")), "temporary directory left behind"
    return line


def damage(d: Path, mutate) -> Path:
    """Rewrite d/model.safetensors with ``mutate(header, body) -> (header, body[, length])``."""
    f = d / "model.safetensors"
    header, body = read_raw_header(f)
    write_raw(f, *mutate(header, body))
    return f


def test_missing_shard_named_by_index(hf_factory, tmp_path):
    src = hf_factory("llama-gqa", shard="20KB")
    shards = sorted(src.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(src), "--out", str(out)), out, str(shards[1]), "missing",
                   "model.safetensors.index.json")


def test_truncated_file_names_the_tensor(stories_copy, tmp_path):
    f = stories_copy / "model.safetensors"
    header, _ = read_raw_header(f)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    f.write_bytes(f.read_bytes()[:-100])
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), last, "truncated")


def test_file_shorter_than_the_length_field(stories_copy, tmp_path):
    f = stories_copy / "model.safetensors"
    f.write_bytes(b"\x10\x00\x00")
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), "too short")


def test_corrupt_header(stories_copy, tmp_path):
    f = damage(stories_copy, lambda h, b: (json.dumps(h).encode().replace(b'"dtype"', b'"dtype":{{'), b))
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), "not valid JSON")


def test_oversized_header(stories_copy, tmp_path):
    f = damage(stories_copy, lambda h, b: (h, b, 2**40))
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), "exceeds")


def test_header_length_past_end_of_file(stories_copy, tmp_path):
    f = damage(stories_copy, lambda h, b: (json.dumps(h).encode(), b"", len(json.dumps(h)) + 10))
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), "past the end")


def _by_offset(h: dict) -> list[str]:
    return sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])


def test_overlapping_offsets(stories_copy, tmp_path):
    names = {}

    def overlap(h, b):
        first, second = _by_offset(h)[:2]
        names["t"] = second
        # the second tensor now starts inside the first; make it the same size as before
        s, e = h[second]["data_offsets"]
        h[second]["data_offsets"] = [s - 8, e - 8]
        return h, b
    f = damage(stories_copy, overlap)
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), names["t"], "overlap")


@pytest.mark.parametrize("offsets,needle", [(lambda s, e: [e, s], "out of range"),
                                            (lambda s, e: [-4, e - s - 4], "out of range"),
                                            (lambda s, e: [s + 10**9, e + 10**9], "past the end")])
def test_out_of_range_offsets(stories_copy, tmp_path, offsets, needle):
    name = "model.layers.0.attention_norm.weight"

    def bad(h, b):
        t = "model.layers.0.input_layernorm.weight"
        h[t]["data_offsets"] = offsets(*h[t]["data_offsets"])
        return h, b
    f = damage(stories_copy, bad)
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f),
                   "model.layers.0.input_layernorm.weight", needle)
    assert name  # the HF name is reported, not the MindSpore one


def test_shape_not_matching_config(stories_copy, tmp_path):
    def reshape(h, b):
        h["model.layers.1.self_attn.q_proj.weight"]["shape"] = [32, 128]  # same bytes, wrong shape
        return h, b
    f = damage(stories_copy, reshape)
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f),
                   "model.layers.1.self_attn.q_proj.weight", "[32, 128]", "[64, 64]", "config.json")


def _resave(d: Path, edit) -> None:
    from safetensors.numpy import load_file, save_file

    state = load_file(d / "model.safetensors")
    edit(state)
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})


def test_missing_and_unexpected_tensors_sorted(stories_copy, tmp_path):
    def edit(s):
        del s["model.layers.3.mlp.up_proj.weight"]
        del s["model.layers.1.mlp.up_proj.weight"]
        s["model.layers.7.mlp.up_proj.weight"] = np.zeros((172, 64), np.float32)
        s["extra.weight"] = np.zeros(3, np.float32)
    _resave(stories_copy, edit)
    out = tmp_path / "out"
    line = assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(stories_copy),
                          "missing 2 tensor(s): model.layers.1.mlp.up_proj.weight, model.layers.3.mlp.up_proj.weight",
                          "unexpected 2 tensor(s): extra.weight, model.layers.7.mlp.up_proj.weight")
    assert "config.json" in line


def test_unsupported_dtype_convertible_check(stories_copy, tmp_path):
    _resave(stories_copy, lambda s: s.__setitem__("model.norm.weight", s["model.norm.weight"].astype(np.int64)))
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, "model.safetensors",
                   "model.norm.weight", "unsupported dtype I64")


def test_unknown_dtype_in_header(stories_copy, tmp_path):
    def bad(h, b):
        h["model.norm.weight"]["dtype"] = "F4"
        return h, b
    f = damage(stories_copy, bad)
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), "model.norm.weight",
                   "unsupported dtype 'F4'")


def test_nonempty_out_refused_unless_force(stories_copy, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = convert("--hf", str(stories_copy), "--out", str(out))
    assert res.exit_code != 0
    line = one_line_error(res.stderr)
    assert str(out) in line and "--force" in line
    assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1
    # --force replaces only what port wrote: a directory without a port manifest is refused even then
    res = convert("--hf", str(stories_copy), "--out", str(out), "--force", "--quiet")
    assert res.exit_code != 0 and "is not a `port convert` output" in one_line_error(res.stderr)
    assert (out / "keep.txt").read_text() == "mine" and len(list(out.iterdir())) == 1
    # ... and an earlier port output is replaced whole
    (out / "keep.txt").unlink()
    assert convert("--hf", str(stories_copy), "--out", str(out), "--quiet").exit_code == 0
    (out / "stale.txt").write_text("from the earlier run")
    res = convert("--hf", str(stories_copy), "--out", str(out), "--force", "--quiet")
    assert res.exit_code == 0, res.stderr
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert not list(tmp_path.glob(".out.port-*"))


def test_out_through_dotdot_never_replaces_the_source(stories_copy, tmp_path):
    """Issue 15 #3: `--out x/../SRC --force` replaced the source; without --force it created x/."""
    before = {p.name: p.read_bytes() for p in stories_copy.iterdir()}
    (tmp_path / "x").mkdir()
    for extra in (["--force"], []):
        sneaky = tmp_path / ("x" if extra else "y") / ".." / stories_copy.name
        res = convert("--hf", str(stories_copy), "--out", str(sneaky), *extra)
        assert res.exit_code != 0 and "overlaps the input" in one_line_error(res.stderr)
    assert {p.name: p.read_bytes() for p in stories_copy.iterdir()} == before
    assert not (tmp_path / "y").exists(), "a refused --out created a directory"


def test_manifest_file_names_are_confined_to_out(stories_copy, tmp_path):
    """Issue 15 #2: hf_layout.files[*].name wrote ../X.safetensors outside --out, or over any file."""
    ms = tmp_path / "ms"
    assert convert("--hf", str(stories_copy), "--out", str(ms), "--quiet").exit_code == 0
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"precious")
    m_path = ms / "port_manifest.json"
    os.chmod(m_path, 0o644)
    original = json.loads(m_path.read_text())
    for bad in ("../X.safetensors", str(victim), "a/b.safetensors", "..", ""):
        m = json.loads(json.dumps(original))
        m["hf_layout"]["files"]["model.safetensors"]["name"] = bad
        m_path.write_text(json.dumps(m))
        out = tmp_path / "hf"
        line = assert_refused(convert("--ms", str(ms), "--out", str(out)), out, "plain file name")
        assert str(m_path) in line and "hf_layout.files" in line
    assert victim.read_bytes() == b"precious" and not (tmp_path / "X.safetensors").exists()


def test_unwritable_destination_is_not_called_a_full_disk(stories_copy, tmp_path):
    """An --out that cannot be created was reported as 'not enough free disk space ... 0.00 GiB'."""
    res = convert("--hf", str(stories_copy), "--out", "/proc/port-test-out")
    line = one_line_error(res.stderr)
    assert res.exit_code != 0 and "cannot create the output directory" in line and "disk space" not in line
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" / "out"
    res = convert("--hf", str(stories_copy), "--out", str(out))
    assert res.exit_code != 0 and "is a file" in one_line_error(res.stderr)


def test_out_inside_source_refused(stories_copy):
    out = stories_copy / "ms"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, "overlaps the input")


def test_bin_whose_pickle_would_run_code_is_refused(tmp_path):
    import torch

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    src = tmp_path / "evil"
    shutil.copytree(ROOT / "model_zoo" / "assets" / "stories260k", src)
    (src / "model.safetensors").unlink()
    torch.save({"model.norm.weight": torch.ones(64), "x": Evil()}, src / "pytorch_model.bin")
    out = tmp_path / "out"
    res = port("convert", "--hf", str(src), "--out", str(out))
    assert res.returncode != 0
    line = one_line_error(res.stderr)
    assert str(src / "pytorch_model.bin") in line and "refused" in line and "weights_only" in line
    assert not marker.exists(), "the pickle's code ran"
    assert not out.exists()


def _big_bf16_source(d: Path, layers: int) -> Path:
    """A random bf16 checkpoint of the TinyLlama shape cut to ``layers`` layers (~48 MiB per layer)."""
    import dataclasses

    from converters.synthetic import write_random_hf
    from model_zoo import presets

    write_random_hf(dataclasses.replace(presets.config("tinyllama-1.1b"), num_hidden_layers=layers), d, 2)
    return d


def test_kill_9_leaves_nothing_at_destination(tmp_path):
    src = _big_bf16_source(tmp_path / "big", layers=8)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "porting", "convert", "--hf", str(src), "--out", str(out),
                             "--quiet"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp_glob = f".out.port-tmp-{proc.pid}"
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until it is writing weights, then kill it
        written = [p for p in tmp_path.glob(f"{tmp_glob}/*.safetensors") if p.stat().st_size > 32 << 20]
        if written:
            break
        time.sleep(0.005)
    else:
        pytest.fail("conversion never started writing")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "kill -9 left something at the destination"
    assert (tmp_path / tmp_glob).is_dir()  # the half-written temp dir is beside it, hidden
    res = port("convert", "--hf", str(src), "--out", str(out), "--quiet")  # the next run cleans it up
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / tmp_glob).exists()
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(p.name for p in src.glob("*.safetensors"))


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing


def test_disk_full_mid_write_is_a_clean_error(tmp_path):
    """RLIMIT_FSIZE makes the kernel refuse the write of the 1 MB weight file part way (EFBIG)."""
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "porting", "convert", "--hf", "stories260k", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, preexec_fn=_limit_file_size)
    assert res.returncode != 0
    line = one_line_error(res.stderr)
    assert "disk full while writing" in line and str(out / "model.safetensors") in line
    assert not out.exists() and not list(tmp_path.glob(".out.port-*"))


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="needs root to mount a tmpfs")
def test_disk_full_on_a_small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount tmpfs here")
    try:
        out = mnt / "out"
        res = port("convert", "--hf", "stories260k", "--out", str(out))
        assert res.returncode != 0
        line = one_line_error(res.stderr)
        assert "not enough free disk space" in line and str(mnt) in line
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)])


def test_ms_side_errors(tmp_path, stories_copy):
    out = tmp_path / "hf"
    # an HF directory given as --ms: its tensors do not carry MindSpore names
    res = convert("--ms", str(stories_copy), "--out", str(out))
    assert_refused(res, out, "unexpected 47 tensor(s)", "model.embed_tokens.weight")
    res = convert("--ms", str(tmp_path / "nope"), "--out", str(out))
    assert_refused(res, out, "no such directory")
    res = convert("--hf", str(stories_copy), "--ms", str(stories_copy), "--out", str(out))
    assert_refused(res, out, "exactly one of")


def test_zoo_name_not_in_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert_refused(convert("--hf", "llama2-7b", "--out", str(out)), out, "meta-llama/Llama-2-7b-hf",
                   str(tmp_path / "cache"), "--hf /path/to/llama2-7b")


def test_zoo_name_found_in_local_cache(tmp_path, monkeypatch):
    """A zoo name resolves to its snapshot in the local HF cache (offline): a random checkpoint of the
    TinyLlama shape cut to one layer, placed where the hub would put that repo."""
    snap = tmp_path / "cache" / "models--TinyLlama--TinyLlama-1.1B-intermediate-step-1431k-3T" / "snapshots" / "abc"
    import dataclasses

    from converters.synthetic import write_random_hf
    from model_zoo import presets

    write_random_hf(dataclasses.replace(presets.config("tinyllama-1.1b"), num_hidden_layers=1, vocab_size=256),
                    snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    res = convert("--hf", "tinyllama-1.1b", "--out", str(out), "-q")
    assert res.exit_code == 0, res.stderr
    m = json.loads((out / "port_manifest.json").read_text())
    assert m["source"]["dir"] == str(snap) and len(m["tensors"]) == 12


def test_out_under_a_file_is_a_one_line_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "sub" / "out"
    res = convert("--hf", "stories260k", "--out", str(out))
    assert res.exit_code != 0
    line = one_line_error(res.stderr)
    assert str(tmp_path / "afile") in line and (tmp_path / "afile").read_text() == "x"


def test_verify_checkpoint_on_a_missing_directory_reports_rows(tmp_path):
    from porting.verify.roundtrip import verify_checkpoint

    rows = verify_checkpoint(ROOT / "model_zoo" / "assets" / "stories260k", tmp_path / "nope")
    assert rows and not any(r.passed for r in rows)
    assert all(isinstance(r.detail, str) and "\n" not in r.detail for r in rows)
    assert not list(tmp_path.iterdir())


def test_every_shape_problem_is_reported_together(stories_copy, tmp_path):
    def reshape(h, b):
        h["model.layers.1.self_attn.q_proj.weight"]["shape"] = [32, 128]
        h["model.layers.2.self_attn.o_proj.weight"]["shape"] = [128, 32]
        return h, b
    damage(stories_copy, reshape)
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, "2 problem(s)",
                   "model.layers.1.self_attn.q_proj.weight", "model.layers.2.self_attn.o_proj.weight")


def test_tensor_stored_in_two_shards(hf_factory, tmp_path):
    from safetensors.numpy import load_file, save_file

    src = hf_factory("llama-gqa", shard="20KB")
    shards = sorted(src.glob("model-*.safetensors"))
    first, last = load_file(shards[0]), load_file(shards[-1])
    dup = sorted(first)[0]
    last[dup] = first[dup]
    save_file(last, shards[-1], metadata={"format": "pt"})
    out = tmp_path / "out"
    # the index names one file, the shards say two: refused before anything is written
    assert_refused(convert("--hf", str(src), "--out", str(out)), out, dup, "model.safetensors.index.json")


def test_tensor_listed_twice_in_a_header(stories_copy, tmp_path):
    f = stories_copy / "model.safetensors"
    header, body = read_raw_header(f)
    entry = json.dumps(header["model.norm.weight"])
    blob = json.dumps(header).encode()[:-1] + f', "model.norm.weight": {entry}}}'.encode()
    write_raw(f, blob, body)
    out = tmp_path / "out"
    assert_refused(convert("--hf", str(stories_copy), "--out", str(out)), out, str(f), "model.norm.weight",
                   "twice")
