"""`port diverge`'s collective rules on fingerprint files written by port's own writer (the msrun test of
tests/diverge/test_diverge.py holds the recorder and the planted cases): inputs before outputs, per rank; another
bucket plan or another data-parallel size is not compared bucket by bucket."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from porting.diverge import compare as cmp
from porting.rundir import fingerprints as fp

HOLDS = [{"first": "lm_head.weight", "last": "model.norm.weight", "tensors": 2},
         {"first": "model.layers.0.mlp.down_proj.weight", "last": "model.embed_tokens.weight", "tensors": 9}]
GRAD = "model.layers.0.mlp.down_proj.weight"


def _run(root: Path, name: str, out_scale: float = 1.0, in_scale: float = 1.0, dp: int = 2,
         holds: list[dict] = HOLDS) -> cmp.Side:
    """A DP ``dp`` run of one step: two buckets; bucket 1's output times ``out_scale``, rank 1's input of bucket 1
    and the gradient times ``in_scale``."""
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    for r in range(dp):
        w = fp.Writer(root / name / "fingerprints" / f"rank_{r}.jsonl",
                      {"source": "port", "layout": "zoo", "dtype": "float32", "dp": dp, "tp": 1})
        if r == 0:   # one global batch, however many ranks share it
            w.record(1, "batch", "input_ids", fp.stat_of(np.arange(8, dtype=np.float32)))
        for k, holds_k in enumerate(holds):
            w.record(1, "collective", fp.collective_name(k, r), fp.stat_of(x * (in_scale if k and r else 1)), holds_k)
            if r == 0:
                w.record(1, "collective", fp.collective_name(k, None), fp.stat_of(x * (out_scale if k else 1)),
                         holds_k)
                w.record(1, "gradient", GRAD if k else "lm_head.weight", fp.stat_of(x * (in_scale if k else 1)))
        w.close()
    return cmp.locate(root / name)


def test_an_output_that_parts_after_every_input_matched_is_the_collective(tmp_path):
    v = cmp.compare(_run(tmp_path, "a"), _run(tmp_path, "b", out_scale=1.01))
    f = v["first"]
    assert (f["phase"], f["name"]) == ("collective", "allreduce/bucket_1/output") and v["phases"][0] == "collective"
    assert f["collective"]["inputs"] == "matched" and f["collective"]["first_tensor"] == GRAD
    assert "inputs matched, outputs did not" in cmp.words(v)


def test_an_input_that_parts_names_the_gradient_with_the_rank(tmp_path):
    v = cmp.compare(_run(tmp_path, "a"), _run(tmp_path, "b", in_scale=1.01))
    f = v["first"]
    assert (f["phase"], f["name"], f["layer"]) == ("gradient", GRAD, 0), f
    assert (f["collective"]["side"], f["collective"]["dp_rank"], f["collective"]["bucket"]) == ("input", 1, 1)
    assert ("the all-reduce inputs differed (gradient bucket 1: model.layers.0.mlp.down_proj.weight .. "
            "model.embed_tokens.weight, 9 tensors; data-parallel rank 1)") in cmp.words(v)


def test_another_bucket_plan_or_data_parallel_size_is_not_compared_bucket_by_bucket(tmp_path):
    other = [HOLDS[0], {**HOLDS[1], "tensors": 8}]
    v = cmp.compare(_run(tmp_path, "a"), _run(tmp_path, "b", out_scale=1.01, holds=other))
    # bucket 0 (the same gradients) compared: 2 inputs and its output; bucket 1 not; then the 2 gradients
    assert v["first"] is None and v["records_compared"] == 5, v
    v = cmp.compare(_run(tmp_path, "c"), _run(tmp_path, "d", out_scale=1.01, in_scale=1.01, dp=3))
    f = v["first"]   # rank 1's rows differ between DP sizes: only the outputs compare
    assert f["name"] == "allreduce/bucket_1/output" and f["collective"]["inputs"] == "not compared", f
    assert "inputs not compared" in cmp.words(v)
