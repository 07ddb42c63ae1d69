"""`port ops scan|zoo`: real HF models traced on CPU (stories260K, tiny Llama configs), meta tensors,
a model with a deliberately unsupported op, and the MindSpore-side kernel plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from porting.diagnostics import opscan


def invoke(*args: str):
    from click.testing import CliRunner

    from porting.cli import main

    return CliRunner().invoke(main, ["ops", *args])


def by_op(result: dict) -> dict[str, dict]:
    return {r["op"]: r for r in result["ops"]}


@pytest.fixture(scope="module")
def stories_scan(stories_dir):
    model, inputs, device = opscan.load_hf(str(stories_dir))
    return opscan.scan(model, inputs, source="stories260k", device=device)


def test_stories260k_forward_backward_optimizer(stories_scan):
    ops = by_op(stories_scan)
    assert stories_scan["device"] == "cpu" and stories_scan["phases_run"] == ["forward", "backward", "optimizer"]
    assert ops["aten::mm"]["status"] == "registered" and ops["aten::mm"]["phases"] == ["forward", "backward"]
    assert ops["aten::embedding_dense_backward"]["phases"] == ["backward"]
    assert ops["aten::silu_backward"]["status"] == "registered"
    assert "float32[2, 16, 64]" in " ".join(ops["aten::mul.Tensor"]["examples"])
    # SDPA on CPU runs a CPU-only flash kernel; on NPU torch_npu's scaled_dot_product_attention is used,
    # and the replacement names the zoo's fused Ascend kernel and its composition
    for name in ("aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward"):
        row = ops[name]
        assert row["status"] == "device_specific" and "scaled_dot_product_attention" in row["detail"]
        assert "ops.flash_attention_score" in row["replacement"]["mindspore"]
        assert "npu_fusion_attention" in row["replacement"]["torch_npu"]
        assert "softmax" in row["replacement"]["composition"]
    assert ops["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]["phases"] == ["backward"]
    assert stories_scan["blocking"] == []
    assert stories_scan["registry_version"] == "v2.13" and stories_scan["registry_knows_version"]


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory) -> Path:
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def test_tiny_llama_eager_attention(tiny_llama_dir):
    r = invoke("scan", "--hf", str(tiny_llama_dir), "--attn", "eager", "--json", "--seq", "8")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    ops = by_op(d)
    assert ops["aten::bmm"]["status"] == "registered" and ops["aten::bmm"]["phases"] == ["forward", "backward"]
    assert ops["aten::_softmax"]["status"] == "registered"
    assert "backward" in ops["aten::_softmax_backward_data"]["phases"]
    assert not any(r["status"] == "device_specific" for r in d["ops"])
    assert d["blocking"] == []


def test_config_only_dir_runs_on_meta(tiny_llama_dir, tmp_path):
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    model, inputs, device = opscan.load_hf(str(tmp_path))
    assert device == "meta"
    d = opscan.scan(model, inputs, source="cfg", device=device)
    assert d["phases_run"] == ["forward", "backward"]
    assert by_op(d)["aten::mm"]["status"] == "registered"


def test_zoo_name_without_weights_runs_on_meta():
    r = invoke("scan", "--hf", "tinyllama-1.1b", "--seq", "4", "--batch", "1")
    assert r.exit_code == 0, r.output
    assert "meta tensors" in r.output and "blocking on NPU: none" in r.output


def test_unsupported_op_reported_in_forward_and_backward():
    r = invoke("scan", "--module", "tests.diagnostics.unsupported_model:build", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    ops = by_op(d)
    assert ops["aten::lgamma"]["status"] == "missing" and ops["aten::lgamma"]["phases"] == ["forward"]
    assert ops["aten::digamma"]["status"] == "missing" and ops["aten::digamma"]["phases"] == ["backward"]
    assert sorted(d["blocking"]) == ["aten::digamma", "aten::lgamma"]
    assert ops["aten::addmm"]["status"] == "registered"


def test_registry_versions_and_ranges():
    reg, order = opscan.load_registry()
    assert len(reg) > 1000 and order[0] == "v2.1" and "v2.13" in order
    assert opscan._expand(["v2.1", "v2.12"], list(order)) == frozenset(order[: order.index("v2.12") + 1])
    assert opscan._expand("v2.1, v2.2", list(order)) == {"v2.1", "v2.2"}
    # an overload whose kernels stop at v2.12 is not registered for torch 2.13
    old = next(e for e in reg.values() if e.impls and max(order.index(v) for vs in e.impls.values() for v in vs)
               < order.index("v2.13") and "." not in e.name and not e.name.startswith("npu"))
    row = opscan.classify(opscan.OpRecord(op=f"aten::{old.name}", name=old.name, count=1, phases={"forward"}), "v2.13")
    assert row["status"] == "not_for_version" and "v2.13" in row["detail"]
    row = opscan.classify(opscan.OpRecord(op=f"aten::{old.name}", name=old.name, count=1, phases={"forward"}), "v2.1")
    assert row["status"] in ("registered", "limited")


def test_float64_is_a_limit():
    row = opscan.classify(opscan.OpRecord(op="aten::mm", name="mm", count=1, phases={"forward"},
                                          dtypes={"torch.float64"}), "v2.13")
    assert row["status"] == "limited" and "float64" in row["detail"]


def test_registry_is_shipped_with_its_licence():
    head = (opscan.DATA_DIR / opscan.REGISTRY_FILE).read_text().splitlines()[:3]
    assert "Ascend/op-plugin" in head[0] and "BSD 3-Clause" in head[1]


def test_zoo_report_per_device():
    d = opscan.zoo_report("stories260k", device="Ascend", compute_dtype="bfloat16")
    plan = d["plan"]["kernels"]
    assert plan["attention"]["impl"] == "reference" and "head_dim 8" in plan["attention"]["reason"]
    assert plan["rope"]["impl"] == "fused" and plan["rmsnorm"]["impl"] == "fused"
    assert len(d["rows"]) == 5 * 4 + 1 and plan["swiglu"]["mindspeed_flag"] == "--use-fused-swiglu"
    d7 = opscan.zoo_report("llama-7b", device="Ascend", compute_dtype="bfloat16")
    assert all(r["impl"] == "fused" for r in d7["rows"]) and len(d7["rows"]) == 32 * 4 + 1
    assert "flash_attention_score" in d7["rows"][0]["op"]
    cpu = opscan.zoo_report("llama-7b", device="CPU")
    # llama-7b computes in bfloat16: port's float32 CPU kernels are not used, and the reason says so.
    assert all(r["impl"] == "reference" and "only on Ascend" in r["reason"] for r in cpu["rows"])
    assert "CPU kernel takes float32, the compute dtype is bfloat16" in cpu["rows"][0]["reason"]
    r = invoke("zoo", "--hf", "llama-7b", "--device", "Ascend", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["layers"] == 32
    r = invoke("zoo", "--hf", "stories260k", "--device", "Ascend")
    assert r.exit_code == 0 and "0-4" in r.output and "final" in r.output


@pytest.mark.parametrize("args,needle", [
    (("scan",), "exactly one of --hf"),
    (("scan", "--hf", "stories260k", "--module", "x:y"), "exactly one of --hf"),
    (("scan", "--hf", "/nonexistent/model"), "no such directory"),
    (("scan", "--module", "nomodule_xyz:build"), "cannot import nomodule_xyz"),
    (("scan", "--module", "json"), "expected package.module:factory"),
    (("zoo", "--hf", "/nonexistent/model"), "no such directory"),
])
def test_bad_input_one_line(args, needle):
    r = invoke(*args)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_garbage_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    r = invoke("scan", "--hf", str(tmp_path))
    assert r.exit_code == 2 and "invalid JSON" in r.output
