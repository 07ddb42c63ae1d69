"""Every diagnostics subcommand is registered and its help ends with worked examples."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from porting.cli import main

COMMANDS = [("doctor",), ("diagnose",), ("report",), ("ops",), ("ops", "scan"), ("ops", "zoo"), ("ranktable",),
            ("ranktable", "check"), ("ranktable", "gen"), ("ranktable", "merge")]


@pytest.mark.parametrize("cmd", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_help_ends_with_examples(cmd):
    r = CliRunner().invoke(main, [*cmd, "--help"])
    assert r.exit_code == 0, r.output
    tail = r.output[r.output.index("Examples:"):]
    assert "port " + cmd[0] in tail


def test_registered_in_the_group():
    out = CliRunner().invoke(main, ["--help"]).output
    for name in ("doctor", "diagnose", "report", "ops", "ranktable"):
        assert f"  {name}" in out
