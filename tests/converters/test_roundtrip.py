"""HF -> MindSpore -> HF on tiny random models of every zoo architecture (made by transformers'
classes and save_pretrained) and on the real stories260K: MindSpore loads the result into the zoo cell
with zero missing / unexpected parameters, transformers loads the way back, and every tensor, name,
dtype and shard comes back bit for bit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from converters import convert
from converters.sources import MANIFEST, open_hf
from porting.verify.roundtrip import verify_checkpoint
from tests.converters.conftest import ARCHS
from tests.helpers import port

pytestmark = pytest.mark.filterwarnings("ignore")


def load_into_zoo(ms_dir: Path):
    """mindspore.load_checkpoint on every shard + load_param_into_net(strict) into model_zoo.build(cfg)."""
    import mindspore as ms

    from model_zoo import LlamaConfig, build

    cfg = LlamaConfig.from_hf(ms_dir)
    fmt = "safetensors" if list(ms_dir.glob("*.safetensors")) else "ckpt"
    params = {}
    for f in sorted(ms_dir.glob(f"*.{fmt}")):
        params.update(ms.load_checkpoint(str(f), format=fmt))
    stored = {str(p.dtype) for p in params.values()}
    assert len(stored) == 1, stored
    # the cell's parameters in the stored dtype, so strict loading compares like with like
    net = build(cfg, param_dtype={"Float32": "float32", "BFloat16": "bfloat16", "Float16": "float16"}[stored.pop()])
    not_loaded, unused = ms.load_param_into_net(net, params, strict_load=True)
    assert not_loaded == [] and unused == [], (not_loaded, unused)
    return net, params


def hf_state(d: Path) -> dict[str, tuple[str, bytes]]:
    """name -> (dtype, raw bytes) through safetensors' own reader (not ours)."""
    from safetensors import safe_open

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(f, framework="pt") as g:
            for k in g.keys():
                t = g.get_tensor(k)
                out[k] = (str(t.dtype), t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return out


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("dtype,shard", [("float32", None), ("bfloat16", "24KB")])
def test_roundtrip_every_architecture(hf_factory, tmp_path, arch, dtype, shard):
    src = hf_factory(arch, dtype, shard)
    ms_dir, back = tmp_path / "ms", tmp_path / "back"
    convert.hf_to_ms(src, ms_dir)
    load_into_zoo(ms_dir)
    convert.ms_to_hf(ms_dir, back)
    src_files = sorted(p.name for p in src.glob("*.safetensors"))
    assert sorted(p.name for p in back.glob("*.safetensors")) == src_files
    if shard:
        assert len(src_files) > 1
        assert json.loads((back / "model.safetensors.index.json").read_text()) == \
            json.loads((src / "model.safetensors.index.json").read_text())
    for name in src_files:  # names, order, dtypes, shapes, bytes: the files themselves are identical
        assert sha(back / name) == sha(src / name), name
    assert hf_state(back) == hf_state(src)
    rows = verify_checkpoint(src, ms_dir)
    assert [r.name for r in rows] == ["ms-config", "ms-coverage", "ms-manifest", "ms-tensors", "roundtrip"]
    assert all(r.passed for r in rows), rows
    assert "bitwise" in rows[3].detail and "byte-identical" in rows[4].detail


def test_from_pretrained_and_zoo_logits_after_roundtrip(hf_factory, tmp_path):
    """transformers loads the MS -> HF output, and the zoo cell loaded from MindSpore gives HF's logits."""
    import mindspore as ms
    import torch
    import transformers

    src = hf_factory("qwen2", "float32")
    ms_dir, back = tmp_path / "ms", tmp_path / "back"
    convert.hf_to_ms(src, ms_dir, out_format="ckpt")
    net, _ = load_into_zoo(ms_dir)
    convert.ms_to_hf(ms_dir, back)
    ref = transformers.AutoModelForCausalLM.from_pretrained(back).eval()
    ids = np.array([[1, 5, 9, 33, 2, 17, 80, 3]], dtype=np.int32)
    with torch.no_grad():
        want = ref(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    got = net(ms.Tensor(ids)).asnumpy()
    assert np.abs(got - want).max() < 1e-4
    assert hf_state(back) == hf_state(src)


@pytest.mark.compat
def test_ckpt_format_sharded_bf16(hf_factory, tmp_path):
    src = hf_factory("llama-mqa-tied", "bfloat16", "24KB")
    ms_dir = tmp_path / "ms"
    assert port("convert", "--hf", str(src), "--out", str(ms_dir), "--format", "ckpt", "-q").returncode == 0
    ckpts = sorted(p.name for p in ms_dir.glob("*.ckpt"))
    assert ckpts == sorted(p.name.replace(".safetensors", ".ckpt") for p in src.glob("*.safetensors"))
    assert (ms_dir / "param_name_map.json").is_file()
    _, params = load_into_zoo(ms_dir)
    import mindspore as ms
    assert all(p.dtype == ms.bfloat16 for p in params.values())
    rows = verify_checkpoint(src, ms_dir)
    assert all(r.passed for r in rows), rows
    back = tmp_path / "back"
    assert port("convert", "--ms", str(ms_dir), "--out", str(back), "-q").returncode == 0
    assert hf_state(back) == hf_state(src)


def test_bin_source_sharded(hf_factory, tmp_path):
    """pytorch_model-*.bin + index (torch.load(weights_only=True)) converts to the same tensors."""
    import torch
    from safetensors.torch import load_file

    st = hf_factory("llama-gqa", "bfloat16", "24KB")
    src = tmp_path / "bin"
    src.mkdir()
    (src / "config.json").write_text((st / "config.json").read_text())
    index = json.loads((st / "model.safetensors.index.json").read_text())
    wm = {}
    for f in sorted(st.glob("model-*.safetensors")):
        name = f.name.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        state = load_file(f)
        torch.save(state, src / name)
        wm.update({k: name for k in state})
    (src / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": index["metadata"], "weight_map": wm}))
    ms_dir = tmp_path / "ms"
    convert.hf_to_ms(src, ms_dir)
    assert sorted(p.name for p in ms_dir.glob("*.safetensors")) == sorted(p.name for p in st.glob("*.safetensors"))
    load_into_zoo(ms_dir)
    back = tmp_path / "back"
    convert.ms_to_hf(ms_dir, back)
    assert hf_state(back) == hf_state(st)
    rows = {r.name: r for r in verify_checkpoint(src, ms_dir)}
    assert rows["ms-tensors"].passed and "bitwise" in rows["ms-tensors"].detail
    assert rows["roundtrip"].detail.startswith("skipped:")  # .bin -> safetensors: file layout cannot match


@pytest.mark.parametrize("src_dtype,target,torch_target", [("bfloat16", "fp32", "float32"),
                                                          ("float32", "bf16", "bfloat16"),
                                                          ("float32", "fp16", "float16"),
                                                          ("bfloat16", "fp16", "float16")])
def test_dtype_cast_matches_torch(hf_factory, tmp_path, src_dtype, target, torch_target):
    import torch

    src = hf_factory("llama-gqa", src_dtype)
    ms_dir = tmp_path / "ms"
    convert.hf_to_ms(src, ms_dir, dtype=target)
    back = tmp_path / "back"
    convert.ms_to_hf(ms_dir, back)
    from safetensors.torch import load_file
    want = {k: v.to(getattr(torch, torch_target)) for k, v in load_file(src / "model.safetensors").items()}
    got = load_file(back / "model.safetensors")
    assert want.keys() == got.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype
        assert torch.equal(got[k].view(-1).view(torch.uint8), want[k].view(-1).view(torch.uint8)), k
    rows = {r.name: r for r in verify_checkpoint(src, ms_dir)}
    assert rows["ms-tensors"].passed and "after the cast" in rows["ms-tensors"].detail
    widening = src_dtype == "bfloat16" and target == "fp32"
    assert rows["roundtrip"].passed and rows["roundtrip"].detail.startswith("skipped:") != widening


def test_verify_detects_a_changed_tensor(hf_factory, tmp_path):
    """The checks can fail: flip bytes of one stored tensor and both tensor and round-trip checks name it."""
    from converters.safetensors_io import read_header

    src = hf_factory("llama-gqa", "float32")
    ms_dir = tmp_path / "ms"
    convert.hf_to_ms(src, ms_dir)
    f = ms_dir / "model.safetensors"
    t = read_header(f).by_name()["model.layers.1.attention.wk.weight"]
    data = bytearray(f.read_bytes())
    data[t.begin + 12] ^= 0x01
    f.write_bytes(bytes(data))
    rows = {r.name: r for r in verify_checkpoint(src, ms_dir)}
    assert not rows["ms-tensors"].passed
    assert "model.layers.1.self_attn.k_proj.weight: bytes differ" in rows["ms-tensors"].detail
    assert (rows["ms-tensors"].measure, rows["ms-tensors"].value) == ("tensors_differing", 1)
    assert not rows["roundtrip"].passed and "model.layers.1.self_attn.k_proj.weight" in rows["roundtrip"].detail
    (ms_dir / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()),
                                                     "rms_norm_eps": 0.5}))
    rows = {r.name: r for r in verify_checkpoint(src, ms_dir, roundtrip=False)}
    assert not rows["ms-config"].passed and "rms_norm_eps" in rows["ms-config"].detail


def test_manifest_contents(hf_factory, tmp_path):
    src = hf_factory("llama-bias", "bfloat16", "24KB")
    ms_dir = tmp_path / "ms"
    assert port("convert", "--hf", str(src), "--out", str(ms_dir), "--dtype", "fp32", "-q",
                "--source-hash").returncode == 0
    m = json.loads((ms_dir / MANIFEST).read_text())
    assert m["direction"] == "hf->ms" and m["output"]["dtype"] == "fp32"
    assert {f["name"]: f["sha256"] for f in m["source"]["files"]} == \
        {p.name: sha(p) for p in src.glob("*.safetensors")}
    assert {f["sha256_source"] for f in m["source"]["files"]} == {"computed"} and m["source"]["sha256_recorded"]
    from safetensors import safe_open
    seen = 0
    for rec in m["tensors"]:
        with safe_open(ms_dir / rec["file"], framework="np") as g:
            arr = g.get_tensor(rec["name"])
        assert rec["dtype"] == "F32" and list(arr.shape) == rec["shape"] and rec["source_dtype"] == "BF16"
        assert hashlib.sha256(arr.tobytes()).hexdigest() == rec["sha256"]
        seen += 1
    assert seen == len(open_hf(src).tensor_names())
    assert m["name_map"]["model.layers.{}.self_attn.q_proj.weight"] == "model.layers.{}.attention.wq.weight"
    assert m["versions"]["packages"]["mindspore"] and m["versions"]["python"]
    assert (ms_dir / "config.json").read_text() == (src / "config.json").read_text()


@pytest.mark.compat
@pytest.mark.slow
def test_stories260k_real_model(stories_dir, tmp_path):
    """The real stories260K: bitwise round trip, and the zoo cell loaded from the MindSpore checkpoint
    generates the golden tokens."""
    from model_zoo.decode import greedy
    from tests.conftest import GOLDEN_FIRST_IDS

    ms_dir, back = tmp_path / "ms", tmp_path / "back"
    res = port("convert", "--hf", str(stories_dir), "--out", str(ms_dir))
    assert res.returncode == 0, res.stderr
    assert "hf->ms: 47 tensors" in res.stderr
    assert port("convert", "--ms", str(ms_dir), "--out", str(back), "-q").returncode == 0
    assert sha(back / "model.safetensors") == sha(stories_dir / "model.safetensors")
    assert (back / "tokenizer.model").read_bytes() == (stories_dir / "tokenizer.model").read_bytes()
    net, _ = load_into_zoo(ms_dir)
    assert greedy(net, [1], len(GOLDEN_FIRST_IDS)) == GOLDEN_FIRST_IDS
    rows = verify_checkpoint(stories_dir, ms_dir)
    assert all(r.passed for r in rows), rows


def test_read_hf_state_and_load_hf_dir_bf16(hf_factory):
    from safetensors.torch import load_file

    from converters.loading import load_hf_dir, read_hf_state
    from model_zoo import LlamaConfig, build

    src = hf_factory("qwen2", "bfloat16", "24KB")
    state = read_hf_state(src)
    ref = {}
    for f in src.glob("*.safetensors"):
        ref.update(load_file(f))
    assert state.keys() == ref.keys()
    for k, v in ref.items():
        assert state[k].dtype == np.float32 and np.array_equal(state[k], v.float().numpy()), k
    net = build(LlamaConfig.from_hf(src))
    load_hf_dir(net, src)
    w = net.model.layers[1].attention.wk.bias.asnumpy()
    assert np.array_equal(w, ref["model.layers.1.self_attn.k_proj.bias"].float().numpy())


def test_training_checkpoint_to_hf(hf_factory, tmp_path):
    """A MindSpore checkpoint of a training cell (weights + AdamW states + step counter, no config.json)
    exports to HF with --config; transformers loads it and the weights are the cell's."""
    import mindspore as ms
    import transformers
    from mindspore import nn

    from converters.loading import load_hf_dir
    from model_zoo import LlamaConfig, build

    src = hf_factory("llama-gqa", "float32")
    net = build(LlamaConfig.from_hf(src))
    load_hf_dir(net, src)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    step = tmp_path / "run" / "step_1"
    step.mkdir(parents=True)
    ms.save_checkpoint(list(net.get_parameters()) + list(opt.get_parameters()), str(step / "model.ckpt"))
    names_saved = list(ms.load_checkpoint(str(step / "model.ckpt")))
    assert any(n.startswith("adam_m.") for n in names_saved)
    out = tmp_path / "hf"
    res = port("convert", "--ms", str(step), "--config", str(src / "config.json"), "--out", str(out), "-q")
    assert res.returncode == 0, res.stderr
    m = json.loads((out / MANIFEST).read_text())
    assert any(n.startswith("adam_v.") for n in m["source"]["files"][0]["skipped_tensors"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    want = net.model.layers[0].feed_forward.w2.weight.asnumpy()
    assert np.array_equal(hf.model.layers[0].mlp.down_proj.weight.detach().numpy(), want)
    assert hf_state(out) == hf_state(src)
    res = port("convert", "--ms", str(step), "--out", str(tmp_path / "hf2"))
    assert res.returncode != 0 and "config.json" in res.stderr and not (tmp_path / "hf2").exists()


def test_default_records_tensor_hashes_and_no_unknown_source_hash(hf_factory, tmp_path):
    """One hashing pass by default: every output tensor's sha256, no source file digest that is not free."""
    src = hf_factory("llama-gqa", "bfloat16", "24KB")
    ms_dir = tmp_path / "ms"
    assert port("convert", "--hf", str(src), "--out", str(ms_dir), "-q").returncode == 0
    m = json.loads((ms_dir / MANIFEST).read_text())
    assert m["source"]["sha256_recorded"] is False
    assert all(f["sha256"] is None and f["bytes"] > 0 for f in m["source"]["files"])
    assert all(len(t["sha256"]) == 64 for t in m["tensors"])
    assert all(r.passed for r in verify_checkpoint(src, ms_dir, roundtrip=False))
