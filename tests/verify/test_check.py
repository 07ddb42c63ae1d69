"""The one result row: its verdict, its JSON form read back strictly, and the table README shows."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from porting.verify.check import CLAIM, HEADER, Check, brief, line, table
from tests.conftest import ROOT


def test_a_measured_row_passes_only_finite_and_within():
    assert Check.within("logits", "max_abs", np.float32(2e-5), 1e-4).passed
    assert not Check.within("logits", "max_abs", 2e-4, 1e-4).passed
    assert not Check.within("logits", "max_abs", float("nan"), 1e-4).passed
    assert not Check.within("logits", "max_abs", float("inf"), 1e-4).passed
    count = Check.within("ms-tensors", "tensors_differing", 0, 0)
    assert count.passed and isinstance(count.value, int) and isinstance(Check.within("x", "m", np.float64(1), 2).value, float)


def test_the_json_form_is_six_keys_and_reads_back():
    c = Check.within("loss", "max_abs", float("nan"), 1e-5, "max rel nan")
    d = c.to_dict()
    assert list(d) == ["name", "measure", "value", "tolerance", "passed", "detail"] and d["value"] is None
    assert Check.from_dict(d) == Check("loss", "max_abs", None, 1e-5, False, "max rel nan")
    claim = Check.claim("golden text", True, "matches")
    assert claim.measure == CLAIM and Check.from_dict(claim.to_dict()) == claim


@pytest.mark.parametrize("bad, message", [
    ([1], "expected a check row (an object), found list"),
    ({"name": "x", "measure": "m", "passed": "true", "detail": ""}, "field 'passed' is 'true', expected bool"),
    ({"name": "x", "measure": "m", "passed": True, "detail": "", "value": "big"}, "value is 'big', expected a number"),
    ({"name": "x", "measure": "m", "passed": True, "detail": "", "tolerance": True}, "tolerance is 'True'"),
])
def test_a_row_of_another_shape_is_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Check.from_dict(bad)


def test_table_and_brief():
    rows = [Check.within("logits", "max_abs", 2.253e-05, 1e-4, "max rel 1.157e-02"),
            Check.within("greedy 60 tokens (static cache)", "tokens_differing", 2, 0, "first differs at token 7")]
    text = table(rows).splitlines()
    assert text[0] == HEADER and text[1] == line(rows[0])
    assert text[1].split() == ["logits", "max", "abs", "2.253e-05", "1.0e-04", "ok", "max", "rel", "1.157e-02"]
    assert text[2].split()[-8:-4] == ["2", "0", "FAIL", "first"]
    assert brief(rows[0]) == "logits max abs 2.253e-05 (tolerance 1.0e-04) ok" and math.isfinite(rows[0].value)


def test_readme_shows_the_table_port_verify_prints():
    """README's `bash scripts/port.sh` output has the header the formatter writes (its numbers are this
    machine's; scripts/port.sh prints them)."""
    assert HEADER in (ROOT / "README.md").read_text(encoding="utf-8")
