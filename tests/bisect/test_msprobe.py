"""`port bisect --msprobe-mapping`: msprobe's cell_mapping / layer_mapping from port's name map, with the
real class names of both sides (docs: mstt msprobe 11.accuracy_compare_MindSpore.md, 4.4 and 4.6)."""

from __future__ import annotations

import yaml
from click.testing import CliRunner

from porting.cli import main
from tests.conftest import EMBEDDED


def test_cell_mapping_of_stories260k(tmp_path):
    out = tmp_path / "cell_mapping.yaml"
    res = CliRunner().invoke(main, ["bisect", "--hf", str(EMBEDDED), "--msprobe-mapping", str(out)])
    assert res.exit_code == 0, res.output
    m = yaml.safe_load(out.read_text())
    # 12 modules per layer x 5 layers, the embedding, the final norm, the model and the layer list
    assert len(m) == 64 and "64 entries" in res.output
    assert m["model.layers.3.attention.wq.Linear"] == "model.layers.3.self_attn.q_proj.Linear"
    assert m["model.layers.0.feed_forward.FeedForward"] == "model.layers.0.mlp.LlamaMLP"
    assert m["model.norm_out.RMSNorm"] == "model.norm.LlamaRMSNorm"
    assert m["model.tok_embeddings.Embedding"] == "model.embed_tokens.Embedding"
    assert len(set(m.values())) == len(m)      # one-to-one, as the name map


def test_layer_mapping_names_only_what_differs(tmp_path):
    out = tmp_path / "layer_mapping.yaml"
    res = CliRunner().invoke(main, ["bisect", "--hf", str(EMBEDDED), "--msprobe-mapping", str(out),
                                    "--msprobe-kind", "layer"])
    assert res.exit_code == 0, res.output
    m = yaml.safe_load(out.read_text())
    assert m["Attention"] == {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj"}
    assert m["FeedForward"] == {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    assert m["DecoderLayer"]["attention"] == "self_attn" and "layers" not in m.get("LlamaModel", {})
