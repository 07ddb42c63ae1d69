"""tests/helpers.py's in-process `port` gives what the process gives: the same exit status, stdout and
stderr byte for byte (commands that start no MindSpore, so the process costs ~1 s), a traceback where an
exception escapes, and the test process left as it was."""

from __future__ import annotations

import os
import sys

import pytest

from tests.helpers import MAIN, ROOT, port, port_process

SAME = [
    ("zoo", "list", "--json"),                      # success, stdout
    ("zoo", "show", "lama-7b"),                     # the one-line error (UnknownModelError, exit 2)
    ("zoo", "show", "stories260k", "--no-such-flag"),   # click's usage error: "python -m porting" in it
    ("--version",),
]


@pytest.mark.parametrize("args", SAME, ids=lambda a: " ".join(a))
def test_in_process_equals_the_process(args, tmp_path):
    env = {"PORT_ZOO_FILE": str(tmp_path / "zoo.json")}
    inproc, proc = port(*args, env=env), port_process(*args, env=env)
    assert (inproc.returncode, inproc.stdout, inproc.stderr) == (proc.returncode, proc.stdout, proc.stderr)
    assert inproc.stdout or inproc.stderr


def test_an_escaped_exception_is_a_traceback_and_exit_1(monkeypatch):
    """What the interpreter does with an exception the CLI lets through (injected here: the product has
    none to offer on purpose), so a "no traceback" assertion sees it."""
    from model_zoo import presets

    def broken(*a, **k):
        raise RuntimeError("injected by the test")

    monkeypatch.setattr(presets, "all_entries", broken)
    r = port("zoo", "list")
    assert r.returncode == 1
    assert r.stderr.startswith("Traceback (most recent call last):")
    assert r.stderr.rstrip().endswith("RuntimeError: injected by the test")


def test_the_test_process_is_left_as_it_was(tmp_path):
    argv, cwd = list(sys.argv), os.getcwd()
    os.environ.pop("PORT_TEST_HELPER_PROBE", None)
    r = port("zoo", "show", "lama-7b", cwd=tmp_path, env={"PORT_TEST_HELPER_PROBE": "1"})
    assert r.returncode == 2
    assert sys.argv == argv and os.getcwd() == cwd and "PORT_TEST_HELPER_PROBE" not in os.environ
    assert MAIN == str(ROOT / "porting" / "__main__.py") and os.path.isfile(MAIN)
