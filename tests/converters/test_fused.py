"""Fused-weight checkpoints (Phi-3/Phi-4: qkv_proj, gate_up_proj) through the converters: split and fuse
are an inverse pair, HF -> MS -> HF is bitwise with the split in the manifest, a MindSpore checkpoint whose
parts lie apart (a training checkpoint's parameter order) is gathered into the fused HF tensors, and the zoo
cell loaded from such a checkpoint matches transformers' Phi3ForCausalLM."""

from __future__ import annotations

import json

import numpy as np
import pytest

from converters import convert, fused
from converters.sources import open_hf
from model_zoo import LlamaConfig
from model_zoo.errors import CheckpointError
from tests.converters.conftest import make_hf
from tests.converters.test_roundtrip import hf_state, sha


def test_split_and_fuse_are_inverse():
    x = np.random.default_rng(0).standard_normal((7 + 3 + 3, 5)).astype(np.float32)
    parts = fused.split_rows(x, [7, 3, 3])
    assert [p.shape for p in parts] == [(7, 5), (3, 5), (3, 5)]
    assert np.array_equal(fused.fuse_rows(parts), x)                                  # fuse(split(x)) == x
    assert all(np.array_equal(a, b) for a, b in zip(fused.split_rows(fused.fuse_rows(parts), [7, 3, 3]), parts))
    with pytest.raises(CheckpointError, match="cannot split into"):
        fused.split_rows(x, [7, 3])


def test_phi3_reads_as_separate_weights_at_byte_ranges_of_the_fused_ones(tmp_path):
    src = open_hf(make_hf(tmp_path / "phi3", "phi3"))
    infos = {t.name: t for f in src.files for t in f.tensors}
    q, k, v = (infos[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    assert (q.shape, k.shape, v.shape) == ((32, 32), (16, 32), (16, 32))   # 4 heads x 8, 2 KV heads x 8
    assert q.end == k.begin and k.end == v.begin and q.fused_name == "model.layers.0.self_attn.qkv_proj.weight"
    gate, up = infos["model.layers.1.mlp.gate_proj.weight"], infos["model.layers.1.mlp.up_proj.weight"]
    assert gate.rows == (0, 48) and up.rows == (48, 96) and gate.end == up.begin
    assert not any("qkv_proj" in n or "gate_up" in n for n in infos)


@pytest.mark.parametrize("dtype,shard", [("float32", None), ("bfloat16", "24KB")])
def test_phi3_round_trip_is_bitwise_and_the_manifest_records_the_split(tmp_path, dtype, shard):
    from porting.verify.roundtrip import verify_checkpoint

    src = make_hf(tmp_path / "hf", "phi3", dtype, shard)
    ms_dir, back = tmp_path / "ms", tmp_path / "back"
    man = convert.hf_to_ms(src, ms_dir)
    assert man["fused"]["model.layers.{}.self_attn.qkv_proj.weight"][1] == {
        "part": "model.layers.{}.self_attn.k_proj.weight", "rows": 16, "rows_from": "kv_size"}
    rec = {r["name"]: r for r in man["tensors"]}
    assert rec["model.layers.1.attention.wv.weight"]["source_fused"] == {
        "name": "model.layers.1.self_attn.qkv_proj.weight", "rows": [48, 64]}
    back_man = convert.ms_to_hf(ms_dir, back)
    assert {r["name"]: r.get("source_parts") for r in back_man["tensors"]}["model.layers.0.mlp.gate_up_proj.weight"] \
        == ["model.layers.0.feed_forward.w1.weight", "model.layers.0.feed_forward.w3.weight"]
    for f in src.glob("*.safetensors"):
        assert sha(back / f.name) == sha(f), f.name
    assert hf_state(back) == hf_state(src)
    assert all(r.passed for r in verify_checkpoint(src, ms_dir))


def test_parts_stored_apart_are_gathered_into_the_fused_tensor(tmp_path):
    """A MindSpore checkpoint in the cell's parameter order (w1, w2, w3: gate and up apart), as `port train`
    saves: MS -> HF joins gate and up into gate_up_proj, and transformers loads the result."""
    import mindspore as ms
    import torch
    import transformers

    from converters.loading import load_hf_dir
    from model_zoo import build

    src = make_hf(tmp_path / "hf", "phi3")
    model = build(LlamaConfig.from_hf(src))
    load_hf_dir(model, src)
    ms_dir = tmp_path / "ms"
    ms_dir.mkdir()
    ms.save_checkpoint(model, str(ms_dir / "model.ckpt"))
    (ms_dir / "config.json").write_text((src / "config.json").read_text())
    convert.ms_to_hf(ms_dir, tmp_path / "back")
    assert hf_state(tmp_path / "back") == hf_state(src)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    assert ref.model.layers[0].mlp.gate_up_proj.weight.shape == torch.Size([96, 32])


def test_phi3_matches_transformers_past_its_original_context(tmp_path):
    """Phi-3 as released: fused weights, longrope with the original context at the top level of config.json,
    pad_token_id (its embedding row gets no gradient, as nn.Embedding(padding_idx)); logits, hidden states
    and gradient norms at 96 positions, 3 x the original 32."""
    import torch
    import transformers

    from porting.verify.parity import check_parity

    cfg = transformers.Phi3Config(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, original_max_position_embeddings=32, bos_token_id=1,
        pad_token_id=3, rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                         "short_factor": [1.0 + 0.05 * i for i in range(8)],
                                         "long_factor": [1.0 + 0.5 * i for i in range(8)]})
    torch.manual_seed(0)
    transformers.Phi3ForCausalLM(cfg).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["original_max_position_embeddings"] == 32
    from porting.verify.parity import probe_ids

    assert 3 in probe_ids(128, 2, 96, 3, 1)   # the pad id is in the probe: its row's gradient is compared
    report = check_parity(tmp_path, batch=2, seq=96, hidden_states=True, grads=True, seed=3)
    assert report["passed"], report["checks"]


def test_fused_weights_in_bin_files_are_refused_in_one_line(tmp_path):
    import torch

    src = make_hf(tmp_path / "hf", "phi3")
    from safetensors.torch import load_file

    torch.save(load_file(src / "model.safetensors"), src / "pytorch_model.bin")
    (src / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"fused weights in \.bin files.*save_pretrained"):
        open_hf(src)
