"""The fingerprint records (porting/rundir/fingerprints.py): shards compose to the unsharded record without a gather,
a changed bit or a moved element changes the digest, and the reader refuses what port did not write."""

from __future__ import annotations

import json

import numpy as np
import pytest

from porting.rundir import fingerprints as fp


def _rng(*shape: int) -> np.ndarray:
    return np.random.default_rng(7).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("axis", [0, 1])
def test_tensor_parallel_shards_compose_to_the_whole_tensor(axis):
    full = _rng(12, 8)
    parts = np.split(full, 2, axis=axis)
    composed = fp.EMPTY
    for r, part in enumerate(parts):
        composed = composed + fp.stat_of(part, fp.shard_index(part.shape, full.shape, axis, r * part.shape[axis]))
    whole = fp.stat_of(full)
    assert composed.count == whole.count and composed.digest == whole.digest
    assert composed.maxabs == whole.maxabs and composed.nonfinite == 0
    # float32 sums of each shard: within 2e-6 of the sum of magnitudes (the module's bound, a hundredth of the
    # tightest envelope), measured as `port diverge` measures: the sum against sqrt(count * sumsq)
    assert abs(composed.sum - whole.sum) <= 2e-6 * np.sqrt(whole.count * whole.sumsq)
    assert composed.sumsq == pytest.approx(whole.sumsq, rel=2e-6)
    # a shard placed at the wrong offset is another tensor
    wrong = fp.stat_of(parts[1], fp.shard_index(parts[1].shape, full.shape, axis, 0)) + fp.stat_of(
        parts[0], fp.shard_index(parts[0].shape, full.shape, axis, parts[0].shape[axis]))
    assert wrong.digest != whole.digest and wrong.sumsq == pytest.approx(whole.sumsq)


def test_a_shard_whose_pairs_are_not_logical_pairs_is_refused_not_misdigested():
    full = _rng(12, 10)
    part = full[:, 5:]   # an odd last dimension: local pairs straddle its rows
    with pytest.raises(fp.FingerprintError, match="cannot compose"):
        fp.stat_of(part, fp.shard_index(part.shape, full.shape, 1, 5))


def test_the_sums_are_as_close_to_float64_as_the_module_says():
    x = np.random.default_rng(3).standard_normal(3 * fp.CHUNK + 7).astype(np.float32) + np.float32(0.25)
    s, wide = fp.stat_of(x), x.astype(np.float64)
    assert abs(s.sum - wide.sum()) <= 2e-6 * np.abs(wide).sum()
    assert s.sumsq == pytest.approx(float(np.dot(wide, wide)), rel=2e-6)
    assert s.maxabs == float(np.abs(wide).max()) and s.count == x.size
    before = np.random.default_rng(4).standard_normal(x.size).astype(np.float32)   # an update, a chunk at a time
    assert fp.stat_of(x, minus=before) == fp.stat_of(x - before)


def test_rows_split_over_ranks_compose_and_padding_is_not_counted():
    x = _rng(4, 6, 3)
    lengths = [6, 2, 5, 0]
    whole = fp.rows_stat(x, lengths)
    assert whole.count == sum(lengths) * 3
    split = fp.rows_stat(x[2:], lengths[2:]) + fp.rows_stat(x[:2], lengths[:2])   # two data-parallel ranks
    assert split.digest == whole.digest and split.count == whole.count
    padded = x.copy()
    padded[1, 3:] = 99.0   # the padding of row 1 changes nothing
    assert fp.rows_stat(padded, lengths) == whole


def test_one_flipped_bit_or_a_swap_changes_the_digest_not_the_moments():
    x = _rng(64)
    base = fp.stat_of(x)
    flipped = x.copy()
    flipped.view(np.uint32)[5] ^= 1   # the last mantissa bit of one element
    assert fp.stat_of(flipped).digest != base.digest
    swapped = x.copy()
    swapped[[3, 9]] = swapped[[9, 3]]
    s = fp.stat_of(swapped)
    assert s.digest != base.digest and s.sumsq == pytest.approx(base.sumsq, rel=1e-12)


def test_nonfinite_elements_are_counted_and_kept_out_of_the_sums():
    x = np.array([1.0, np.nan, -2.0, np.inf], np.float32)
    s = fp.stat_of(x)
    assert (s.count, s.nonfinite, s.sum, s.sumsq, s.maxabs) == (4, 2, -1.0, 5.0, 2.0)


def test_writer_and_reader_round_trip_and_compose_ranks(tmp_path):
    folder = tmp_path / "fingerprints"
    full = _rng(8, 4)
    for r in range(2):
        w = fp.Writer(folder / f"rank_{r}.jsonl", {"source": "port", "rank": r})
        part = full[4 * r:4 * r + 4]
        w.record(3, "gradient", "model.layers.0.mlp.up_proj.weight",
                 fp.stat_of(part, fp.shard_index(part.shape, full.shape, 0, 4 * r)))
        w.close()
    got = fp.read(folder)
    assert got.steps == [3] and len(got.headers) == 2
    assert got.stats[(3, "gradient", "model.layers.0.mlp.up_proj.weight")].digest == fp.stat_of(full).digest


_COLL = ('{{"step": 1, "phase": "collective", "name": "{name}", {more} "count": 2, "sum": 0, "sumsq": 0, '
         '"maxabs": 0, "nonfinite": 0, "digest": "0000000000000000"}}')
_HOLDS = '"first": "lm_head.weight", "last": "model.norm.weight", "tensors": {n},'


def test_collective_records_are_kept_per_rank_with_what_their_bucket_holds(tmp_path):
    """A bucket's input is one record per data-parallel rank (never added across ranks, unlike every other phase's
    shards), its output one record; the bucket's description read once."""
    holds = {"first": "lm_head.weight", "last": "model.norm.weight", "tensors": 2}
    x = np.arange(6, dtype=np.float32)
    for r in (0, 1):
        w = fp.Writer(tmp_path / f"rank_{r}.jsonl", {"rank": r})
        w.record(2, "collective", fp.collective_name(1, r), fp.stat_of(x + r), holds)
        if r == 0:
            w.record(2, "collective", fp.collective_name(1, None), fp.stat_of(2 * x + 1), holds)
        w.close()
    got = fp.read(tmp_path)
    assert got.buckets == {"allreduce/bucket_1": ("lm_head.weight", "model.norm.weight", 2)}
    assert got.names["collective"] == ["allreduce/bucket_1/input/dp_0", "allreduce/bucket_1/output",
                                       "allreduce/bucket_1/input/dp_1"]
    assert got.stats[(2, "collective", "allreduce/bucket_1/input/dp_1")] == fp.stat_of(x + 1)
    assert got.stats[(2, "collective", "allreduce/bucket_1/output")] == fp.stat_of(2 * x + 1)
    assert fp.collective_name(3, 1, tp_rank=1) == "allreduce/bucket_3/tp_1/input/dp_1"


@pytest.mark.parametrize("body,words", [
    ('{"step": 1}\n', "expected the header"),
    ('{"fingerprints": 1}\n{"step": 0, "phase": "update", "name": "x"}\n', "expected step (>= 1)"),
    ('{"fingerprints": 1}\n{"step": 1, "phase": "allreduce", "name": "x"}\n', "phase (one of"),
    ('{"fingerprints": 2}\n' + _COLL.format(name="allreduce/bucket_0/input", more='') + "\n",
     "expected a collective record"),
    ('{"fingerprints": 2}\n' + _COLL.format(name="allreduce/bucket_0/output", more='"first": "' + "a" * 300 + '",')
     + "\n", "expected a collective record"),
    ('{"fingerprints": 2}\n' + _COLL.format(name="allreduce/bucket_0/output", more=_HOLDS.format(n=3)) + "\n"
     + _COLL.format(name="allreduce/bucket_0/input/dp_1", more=_HOLDS.format(n=4)) + "\n", "in an earlier record"),
    ('{"fingerprints": 1}\n{"step": 1, "phase": "update", "name": "x", "count": 4, "sum": 0, "sumsq": 0, '
     '"maxabs": 0, "nonfinite": 9, "digest": "00"}\n', "digest of 16 hex digits"),
    ('{"fingerprints": 1}\n' + "x" * 5000 + "\n", "more than 4096"),
])
def test_the_reader_refuses_what_port_did_not_write_in_one_line(tmp_path, body, words):
    (tmp_path / "rank_0.jsonl").write_text(body)
    with pytest.raises(fp.FingerprintError) as e:
        fp.read(tmp_path)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_writer_stops_before_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(fp, "MAX_FILE_BYTES", 20_000)
    warned = []
    w = fp.Writer(tmp_path / "rank_0.jsonl", {}, warned.append)
    for s in range(1, 200):
        w.record(s, "update", "lm_head.weight", fp.stat_of(np.ones(3, np.float32)))
    w.close()
    text = (tmp_path / "rank_0.jsonl").read_text()
    assert len(text) <= 20_000 and json.loads(text.splitlines()[-1]) == {"truncated": True} and len(warned) == 1
    assert fp.read(tmp_path).truncated


def test_a_resumed_launch_appends_and_its_rerun_steps_replace_the_earlier_records(tmp_path):
    f = tmp_path / "rank_0.jsonl"
    first, again = fp.stat_of(np.ones(4, np.float32)), fp.stat_of(np.full(4, 2.0, np.float32))
    w = fp.Writer(f, {"launch": 1})
    for step in (1, 2, 3):
        w.record(step, "update", "model.norm.weight", first)
    w.close()
    w = fp.Writer(f, {"launch": 2})   # resumed from step 2's checkpoint: step 3 runs again
    w.record(3, "update", "model.norm.weight", again)
    w.close()
    got = fp.read(tmp_path)
    assert [h["launch"] for h in got.headers] == [1, 2]
    assert got.stats[(2, "update", "model.norm.weight")] == first
    assert got.stats[(3, "update", "model.norm.weight")] == again


def test_the_writer_never_writes_over_a_file_port_did_not_write(tmp_path):
    f = tmp_path / "rank_0.jsonl"
    f.write_text("someone's notes\n")
    with pytest.raises(fp.FingerprintError, match="not a fingerprint file port wrote"):
        fp.Writer(f, {}, fresh=True)
    assert f.read_text() == "someone's notes\n"
