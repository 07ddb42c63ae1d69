"""The fault-injection hooks (porting/train/run/faults.py): one registry, parsed at once, documented once
(docs/test-hooks.md), each off unless set and refused in one line when it does not parse."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from porting.train.run import faults
from porting.train.run.faults import HOOKS, FaultHookError, Faults, parse

ROOT = Path(__file__).resolve().parents[2]


def test_all_off_unless_set():
    assert parse({}) == Faults() and parse({h.env: "" for h in HOOKS}) == Faults()
    off = Faults()
    assert off.nonfinite is None and not off.nan_at(1, 0) and off.delay_for(0) == 0.0
    assert off.crash_at_exit is None and off.bad_devices == frozenset()


def test_each_hook_parses_its_form():
    f = parse({"PORT_TEST_NONFINITE": "3@1", "PORT_TEST_COMM_DELAY": "1:0.25", "PORT_TEST_CRASH_AT_EXIT": "1",
               "PORT_TEST_BAD_DEVICES": "2,5", "PORT_TEST_COMPILE_DELAY": "0:12"})
    assert f.compile_delay_for(0) == 12.0 and f.compile_delay_for(1) == 0.0 and Faults().compile_delay_for(0) == 0.0
    assert [f.nan_at(n, 1) for n in (2, 3, 4)] == [False, True, False] and not f.nan_at(3, 0)   # rank 1 only
    assert f.delay_for(1) == 0.25 and f.delay_for(0) == 0.0
    assert f.crash_at_exit == 1 and f.bad_devices == {2, 5}
    g = parse({"PORT_TEST_REFUSE_STATIC_PARALLEL": "1", "PORT_TEST_COLLECTIVE_TRACE": "/tmp/trace"})
    assert g.refuse_static_parallel and g.collective_trace == "/tmp/trace"
    nan = lambda spec, n: parse({"PORT_TEST_NONFINITE": spec}).nan_at(n, 0)  # noqa: E731
    assert [nan("4-", n) for n in (3, 4, 9)] == [False, True, True] and nan("*", 1)
    assert [nan("2,13", n) for n in (1, 2, 3, 13)] == [False, True, False, True]


@pytest.mark.parametrize("env,bad", [("PORT_TEST_NONFINITE", v) for v in ("x", "3@", "-3", "3;rm", "1e3", "３")]
                         + [("PORT_TEST_COMM_DELAY", v) for v in ("0.5", "x:1", "1:-2", "1:1e9", "-1:0.5")]
                         + [("PORT_TEST_COMPILE_DELAY", v) for v in ("12", "1:x", "1:601")]
                         + [("PORT_TEST_CRASH_AT_EXIT", v) for v in ("x", "1,2", "-1", "²")]
                         + [("PORT_TEST_BAD_DEVICES", v) for v in ("2;5", "a", "2,,5", "-1")]
                         + [("PORT_TEST_REFUSE_STATIC_PARALLEL", v) for v in ("yes", "0", "2")]
                         + [("PORT_TEST_COLLECTIVE_TRACE", v) for v in ("trace", "../t", "~/t")])
def test_a_value_that_does_not_parse_is_one_line(env, bad):
    with pytest.raises(FaultHookError) as e:
        parse({env: bad})
    msg = str(e.value)
    assert msg.startswith(f"{env}=") and "expected" in msg and "unset it for a real run" in msg and "\n" not in msg


def test_the_docs_list_every_hook_of_the_registry():
    page = (ROOT / "docs" / "test-hooks.md").read_text()
    rows = re.findall(r"^\| `(PORT_TEST_\w+)` \|", page, re.M)
    assert rows == [h.env for h in HOOKS]
    for h in HOOKS:
        row = next(ln for ln in page.splitlines() if ln.startswith(f"| `{h.env}` |"))
        assert f"`{h.where}`" in row, (h.env, h.where)


def test_no_module_but_the_registry_reads_a_hook():
    """Every PORT_TEST_ name in porting/ is in the registry, and only faults.py reads the environment for one."""
    names, readers = set(), []
    for p in sorted((ROOT / "porting").rglob("*.py")):
        src = p.read_text(encoding="utf-8")
        names |= set(re.findall(r"PORT_TEST_[A-Z_]+", src))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("PORT_TEST_"):
                if p.name != "faults.py" and _is_env_read(src, node):
                    readers.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert names == {h.env for h in HOOKS}, names
    assert not readers, f"a PORT_TEST_ hook read outside porting/train/run/faults.py: {readers}"


def _is_env_read(src: str, node: ast.Constant) -> bool:
    line = src.splitlines()[node.lineno - 1]
    return "environ" in line or "getenv" in line


def test_active_reads_this_processs_environment(monkeypatch):
    monkeypatch.setenv("PORT_TEST_BAD_DEVICES", "3")
    assert faults.active().bad_devices == {3}
    monkeypatch.setenv("PORT_TEST_COMM_DELAY", "nope")
    with pytest.raises(FaultHookError, match="PORT_TEST_COMM_DELAY"):
        faults.active()
