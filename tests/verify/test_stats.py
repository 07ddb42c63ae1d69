"""The one difference function (chunked float64 accumulation: the same numbers as one pass over the whole
tensor) and the one tolerance table's lookups."""

from __future__ import annotations

import numpy as np
import pytest

from model_zoo.errors import ConfigError
from porting.verify import stats


def test_chunked_statistics_equal_the_one_pass_ones():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(3 * stats._CHUNK + 17).astype(np.float32)
    ms = ref + rng.standard_normal(ref.size).astype(np.float32) * np.float32(1e-3)
    s = stats.compare(ms, ref)
    a, b = ms.astype(np.float64), ref.astype(np.float64)
    d = np.abs(a - b)
    assert s.max_abs == d.max() and s.scaled_abs == d.max() / np.abs(b).max()
    assert np.isclose(s.max_rel, (d / np.maximum(np.abs(b), 1e-6)).max())
    assert np.isclose(s.rel_l2, np.linalg.norm(d) / np.linalg.norm(b), rtol=1e-9)
    assert np.isclose(s.cosine, a @ b / np.linalg.norm(a) / np.linalg.norm(b), rtol=1e-12)
    assert np.isclose(s.mean_abs, d.mean(), rtol=1e-12)
    ms[-1], ms[5] = np.inf, np.nan
    bad = stats.compare(ms, ref)
    assert (bad.nonfinite_ms, bad.nonfinite_ref) == (2, 0) and bad.to_dict()["max_abs"] is None


def test_scalars_and_small_arrays_are_exact():
    """What parity's old `_diff` gave: max |a - b| and max |a - b| / max(|b|, 1e-6), on a 0-d array too."""
    s = stats.compare(np.array(2.5), np.array(2.0))
    assert (s.max_abs, s.max_rel, s.shape) == (0.5, 0.25, ())
    z = stats.compare(np.array([1e-9, 1.0], np.float32), np.zeros(2, np.float32))
    assert z.max_rel == pytest.approx(1.0 / 1e-6) and z.rel_l2 == z.max_abs == 1.0


def test_tolerance_lookups_refuse_an_unknown_dtype():
    assert stats.tolerances("float32")["logits"] == 1e-4
    with pytest.raises(ConfigError, match="--dtype 'int8': expected one of float32, float16, bfloat16"):
        stats.tolerances("int8")
    assert stats.curve_tolerances("float32").loss_rtol == 1e-3
    assert stats.curve_tolerances("float32", loss_rtol=0.5, loss_atol=None).loss_atol == 1e-4
    with pytest.raises(ConfigError, match="baseline dtype 'int8' has no tolerances"):
        stats.curve_tolerances("int8")
    assert stats.curve_gate(rtol=0.5, window=None).window == stats.IMPORTED_CURVE_GATE.window
