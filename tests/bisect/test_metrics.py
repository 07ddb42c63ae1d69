"""The statistics of a bisection row (chunked float64 accumulation: the same numbers as one pass over the
whole tensor) and the data-flow order that decides which row is "first"."""

from __future__ import annotations

import numpy as np

from porting.bisect import blocks, metrics


def test_chunked_statistics_equal_the_one_pass_ones():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(3 * metrics._CHUNK + 17).astype(np.float32)
    ms = ref + rng.standard_normal(ref.size).astype(np.float32) * np.float32(1e-3)
    s = metrics.compare(ms, ref)
    a, b = ms.astype(np.float64), ref.astype(np.float64)
    d = np.abs(a - b)
    assert s.max_abs == d.max() and s.scaled_abs == d.max() / np.abs(b).max()
    assert np.isclose(s.max_rel, (d / np.maximum(np.abs(b), 1e-6)).max())
    assert np.isclose(s.rel_l2, np.linalg.norm(d) / np.linalg.norm(b), rtol=1e-9)
    assert np.isclose(s.cosine, a @ b / np.linalg.norm(a) / np.linalg.norm(b), rtol=1e-12)
    ms[-1], ms[5] = np.inf, np.nan
    bad = metrics.compare(ms, ref)
    assert (bad.nonfinite_ms, bad.nonfinite_ref) == (2, 0) and bad.to_dict()["max_abs"] is None


def test_data_flow_order_forward_then_backward_in_reverse_then_updates():
    params = ["model.tok_embeddings.embedding_weight", "model.layers.0.attention.wq.weight",
              "model.layers.1.feed_forward.w2.weight", "model.norm_out.weight"]
    o = blocks.Order(2, params)
    assert o.key("forward", None, "embedding") < o.key("forward", 0, "q_proj") < o.key("forward", 1, "down_proj") \
        < o.key("forward", None, "loss") < o.key("backward", None, "logits") < o.key("backward", 1, "down_proj") \
        < o.param("model.layers.1.feed_forward.w2.weight") < o.key("backward", 1, "swiglu") \
        < o.key("backward", 0, "q_proj") < o.param("model.layers.0.attention.wq.weight") \
        < o.key("backward", None, "embedding") < o.update("model.tok_embeddings.embedding_weight") \
        < o.update("model.layers.1.feed_forward.w2.weight")
    ok = metrics.Stats(0.0, 0.0, 0.0, 0.0, 1.0, 0, 0, (1,))
    far = metrics.Stats(1.0, 1.0, 1.0, 1.0, 0.5, 0, 0, (1,))
    nan = metrics.Stats(*[float("nan")] * 5, 3, 0, (1,))

    def row(pos, phase, block, st):
        return metrics.Row(pos, phase, 0, block, block, "-", st, *metrics.tolerance_for("float32", phase, block))
    rows = [row(9, "backward", "q_proj", far), row(2, "forward", "o_proj", nan), row(1, "forward", "q_proj", far),
            row(0, "forward", "attention_norm", ok)]
    assert metrics.first_divergent(rows).block == "q_proj" and metrics.first_divergent(rows).phase == "forward"
    assert metrics.first_divergent(rows, nan_origin=True).block == "o_proj"
