"""Packing's first fit decreasing (porting/train/data/packing.py) is O(n log n) and places every example
exactly where the one-by-one definition (the quadratic scan port used before issue 27) places it."""

from __future__ import annotations

import numpy as np
import pytest

from model_zoo.errors import RecipeError
from porting.train.data import packing


def _one_by_one(lengths: np.ndarray, seq: int, slots: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """First fit decreasing by its definition: each example, longest first, into the lowest row with room."""
    tie = np.random.default_rng([seed, 7]).permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    rows: list[list[int]] = []
    used: list[int] = []
    for i in np.lexsort((tie, -np.asarray(lengths))):
        n = int(lengths[i])
        r = next((r for r in range(len(rows)) if len(rows[r]) < slots and used[r] + n <= seq), None)
        if r is None:
            r = len(rows)
            rows.append([])
            used.append(0)
        rows[r].append(int(i))
        used[r] += n
    return rows


@pytest.mark.parametrize("scan_width", [4096, 2], ids=["flat-scan", "tree"])
@pytest.mark.parametrize("seed", range(8))
def test_rows_equal_the_one_by_one_definition(seed, scan_width, monkeypatch):
    monkeypatch.setattr(packing, "SCAN_WIDTH", scan_width)   # 2: every query descends the tree
    rng = np.random.default_rng(seed)
    seq = int(rng.integers(8, 400))
    n = int(rng.integers(0, 300))
    hi = seq + 1 if seed % 2 else max(2, seq // 6)   # long and short examples (many per row)
    lengths = rng.integers(1, hi, n)
    for slots in packing.SLOT_CHOICES:
        for shuffle in (True, False):
            assert packing.pack_rows(lengths, seq, slots, seed, shuffle) == _one_by_one(lengths, seq, slots, seed, shuffle)
    best = min(packing.SLOT_CHOICES, key=lambda k: (len(_one_by_one(lengths, seq, k, seed)) * packing.row_length(seq, k),
                                                    packing.SLOT_CHOICES.index(k)))
    assert packing.choose_slots(lengths, seq, seed) == best


def test_a_million_examples_pack():
    """1M examples pack (the quadratic scan took hours; BENCHMARKS.md, "Packing"): every example once,
    every row within its bounds."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 400, 1_000_000)
    rows = packing.pack_rows(lengths, 2048, 48, 0)
    flat = np.concatenate([np.asarray(r) for r in rows])
    assert len(flat) == len(lengths) and len(np.unique(flat)) == len(lengths)
    assert max(len(r) for r in rows) <= 48 and max(int(lengths[r].sum()) for r in rows) <= 2048
    assert len(rows) <= 1.01 * (-(-int(lengths.sum()) // 2048))   # first fit decreasing packs tight here


def test_an_example_longer_than_a_row_is_refused():
    with pytest.raises(RecipeError, match="an example has 9 tokens, more than data.max_seq_length=8"):
        packing.pack_rows(np.array([3, 9]), 8, 2, 0)
    assert packing.pack_rows(np.zeros(0, np.int64), 8, 2, 0) == []
