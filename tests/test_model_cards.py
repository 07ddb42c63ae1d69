"""The cheap rows of every family's verification card (benchmarks/model_cards.py), run in the suite:
convert + round trip, forward and gradient parity, generation with the KV cache and the 910C plans, each
through the exact `port` command the card shows, on a small checkpoint with the family's real ratios. The
costly rows (training against the PyTorch baseline, resume, msrun layouts, real shapes) run when the cards
are generated; every supported family has a card with every row."""

from __future__ import annotations

import pytest

from benchmarks import model_cards as mc
from model_zoo.config import SUPPORTED_MODEL_TYPES
from tests.helpers import port

ROOT = mc.ROOT


def _runner(argv: list[str]) -> tuple[int, str]:
    p = port(*argv)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module", params=sorted(mc.FAMILIES))
def family_model(request, tmp_path_factory):
    fam = mc.FAMILIES[request.param]
    return fam, mc.write_small(fam, tmp_path_factory.mktemp(fam.name) / "model")


def test_every_supported_family_has_a_card_generator_and_a_card():
    assert set(mc.FAMILIES) == set(SUPPORTED_MODEL_TYPES)
    for name in SUPPORTED_MODEL_TYPES:
        text = (ROOT / "docs" / "models" / f"{name}.md").read_text()
        assert f"python benchmarks/model_cards.py --family {name}" in text
        for row in mc.ROWS:
            assert f"| {row.name} |" in text and f"**{row.name}**" in text, (name, row.name)


@pytest.mark.parametrize("row", [r for r in mc.ROWS if not r.costly], ids=lambda r: r.name)
def test_cheap_rows_pass(family_model, row, tmp_path):
    fam, model = family_model
    rec = mc.run_row(row, fam, model, tmp_path, _runner)
    assert rec["status"] == "PASS", rec
    assert all(c.startswith("port ") for c in rec["commands"])
