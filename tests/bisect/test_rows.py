"""The data-flow order that decides which bisection row is "first", and each row's verdict as the one
result row (porting.verify.check.Check)."""

from __future__ import annotations

from porting.bisect import blocks, rows
from porting.verify.stats import Stats


def test_data_flow_order_forward_then_backward_in_reverse_then_updates():
    params = ["model.tok_embeddings.embedding_weight", "model.layers.0.attention.wq.weight",
              "model.layers.1.feed_forward.w2.weight", "model.norm_out.weight"]
    o = blocks.Order(2, params, "llama")
    assert o.key("forward", None, "embedding") < o.key("forward", 0, "q_proj") < o.key("forward", 1, "down_proj") \
        < o.key("forward", None, "loss") < o.key("backward", None, "logits") < o.key("backward", 1, "down_proj") \
        < o.param("model.layers.1.feed_forward.w2.weight") < o.key("backward", 1, "swiglu") \
        < o.key("backward", 0, "q_proj") < o.param("model.layers.0.attention.wq.weight") \
        < o.key("backward", None, "embedding") < o.update("model.tok_embeddings.embedding_weight") \
        < o.update("model.layers.1.feed_forward.w2.weight")
    ok = Stats(0.0, 0.0, 0.0, 0.0, 1.0, 0, 0, (1,), 0.0)
    far = Stats(1.0, 1.0, 1.0, 1.0, 0.5, 0, 0, (1,), 1.0)
    nan = Stats(*[float("nan")] * 5, 3, 0, (1,), float("nan"))

    def row(pos, phase, block, st):
        return rows.Row(pos, phase, 0, block, block, "-", st, *rows.tolerance_for("float32", phase, block))
    rs = [row(9, "backward", "q_proj", far), row(2, "forward", "o_proj", nan), row(1, "forward", "q_proj", far),
          row(0, "forward", "attention_norm", ok)]
    assert rows.first_divergent(rs).block == "q_proj" and rows.first_divergent(rs).phase == "forward"
    assert rows.first_divergent(rs, nan_origin=True).block == "o_proj"


def test_a_row_is_the_one_result_row_with_its_place():
    far = Stats(1.0, 1.0, 1.0, 0.25, 0.5, 0, 0, (1,), 1.0)
    r = rows.Row(3, "backward", 1, "q_proj", "d loss / d layers.1.q_proj", "matmul", far,
                 *rows.tolerance_for("float32", "backward", "q_proj"))
    d = r.to_dict()
    assert list(d)[:6] == ["name", "measure", "value", "tolerance", "passed", "detail"]
    assert (d["name"], d["measure"], d["value"], d["tolerance"], d["passed"]) == \
        ("d loss / d layers.1.q_proj", "rel_l2", 0.25, 1e-4, False)
    unseen = rows.Row(4, "forward", 1, "gate_proj", "layers.1.gate_proj", "matmul", None, "max_abs", 1e-4,
                      "not observed on the MindSpore side (computed inside a fused kernel)")
    assert unseen.check.value is None and not unseen.passed and "fused kernel" in unseen.check.detail
