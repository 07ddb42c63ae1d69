"""model_zoo.files: the one bounded JSON reader and the one atomic file writer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from model_zoo.errors import ConfigError, PortingError
from model_zoo.files import read_json, read_json_object, read_text, sha256_file, write_atomic


def test_reads_an_object(tmp_path):
    p = tmp_path / "a.json"
    p.write_text('{"a": [1, {"b": 2}]}')
    assert read_json_object(p) == {"a": [1, {"b": 2}]}


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe{\x00}\x00", "not valid UTF-8"),
    (b"{\"a\": ", "invalid config.json at line 1"),
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper than"),
    (b"[" * 70 + b"]" * 70, "nests deeper than 64"),
])
def test_bad_json_is_one_line_naming_the_file(tmp_path, content, words):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        read_json(p, what="config.json", error=ConfigError)
    msg = str(e.value)
    assert words in msg and str(p) in msg and "\n" not in msg


def test_top_level_must_be_an_object(tmp_path):
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(PortingError, match="expected a JSON object .* found list"):
        read_json_object(p)


def test_size_bound_is_checked_before_reading(tmp_path):
    p = tmp_path / "big.json"
    p.write_bytes(b" " * 2048)
    with pytest.raises(PortingError, match="more than the 1,024 allowed"):
        read_text(p, max_bytes=1024)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    p = tmp_path / "pipe.json"
    os.mkfifo(p)
    with pytest.raises(PortingError, match="expected a regular file"):
        read_text(p)


def test_missing_file(tmp_path):
    with pytest.raises(PortingError, match="not found"):
        read_text(tmp_path / "nope.json", what="manifest")


def test_write_atomic_replaces_whole_and_leaves_no_temp(tmp_path):
    p = tmp_path / "out.json"
    p.write_text("old")
    write_atomic(p, "new")
    assert p.read_text() == "new"
    assert [q.name for q in tmp_path.iterdir()] == ["out.json"]


def test_write_atomic_failure_keeps_the_old_file(tmp_path):
    with pytest.raises(PortingError, match="cannot write"):
        write_atomic(tmp_path / "missing-dir" / "x.json", b"data")
    assert list(tmp_path.iterdir()) == []


def test_sha256_file(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"abc")
    assert sha256_file(p) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_a_huge_json_integer_is_one_line(tmp_path):
    # CPython refuses integers past 4,300 digits with a bare ValueError; 401 digits overflow every float later
    for digits in (401, 5000):
        p = tmp_path / f"n{digits}.json"
        p.write_text('{"loss": ' + "9" * digits + "}")
        with pytest.raises(ConfigError) as e:
            read_json_object(p, what="metrics", error=ConfigError)
        assert f"integer of {digits:,} digits" in str(e.value) and str(p) in str(e.value)
    ok = tmp_path / "ok.json"
    ok.write_text('{"bytes": 123456789012345678901234567890, "neg": -5}')
    assert read_json_object(ok) == {"bytes": 123456789012345678901234567890, "neg": -5}


def test_bounded_reads_do_not_allocate_the_bound(tmp_path):
    """A 16 GiB bound on a 1 KB file, under a 2 GiB address-space limit: one ``f.read(bound + 1)`` asks
    for the whole bound up front and dies with MemoryError; the chunked read does not."""
    import subprocess
    import sys

    p = tmp_path / "small.txt"
    p.write_text("x" * 1000)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30));"
            "from model_zoo.files import read_text;"
            f"print(len(read_text({str(p)!r}, max_bytes=16 << 30)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 0 and r.stdout.strip() == "1000", r.stderr[-2000:]


def test_a_file_at_the_bound_is_read_and_one_byte_more_is_refused(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(b"a" * (3 << 20))        # three chunks exactly
    assert len(read_text(p, max_bytes=3 << 20)) == 3 << 20
    p.write_bytes(b"a" * ((3 << 20) + 1))
    with pytest.raises(PortingError, match="more than the 3,145,728 allowed"):
        read_text(p, max_bytes=3 << 20)
