"""The one-pass HF export of a per-rank checkpoint (porting/train/run/checkpoint/export.py, converters/streamed.py)
against the two passes it replaced, on real rank files written by the checkpoint writer at DP 2 with ZeRO-1
(weights split between two ranks' shards are gathered), also under TP 2 (every split weight re-joined), bf16
parameters with fp32 masters, for a plain (llama), a fused (phi3: its gate and up parts lie apart in the zoo's
order, so they are held and joined) and a q/k-norm family (qwen3).

The two passes, as `port ckpt merge` made them before issue 46: the MindSpore-named weights written to a
folder (``write_weights``), then converted by ``converters.convert.ms_to_hf`` with the source hashed. The
one pass must give the same files byte for byte and the same manifest but for ``created``, ``source.dir``
(the checkpoint, where it named the staging folder) and ``output.bytes_written_by``. benchmarks/merge_speed.py
compares with the commit before the change itself, on `port train` checkpoints of two widths.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from porting.train.run.checkpoint.format import Layout, ParamSpec, identity_of, owned, piece_key, write_rank, write_record

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=128,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5)
FAMILIES = {"llama": dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"]),
            "phi3": dict(BASE, model_type="phi3", architectures=["Phi3ForCausalLM"], pad_token_id=0),
            "qwen3": dict(BASE, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16)}
ROOT = Path(__file__).resolve().parents[2]
PER_RUN = ("created", "source.dir", "output.bytes_written_by")


def _axis(name: str, shape: tuple[int, ...], tp: int) -> int | None:
    """The split a TP rank stores: row-parallel weights (wo, w2) by columns, other matrices by rows, vectors whole."""
    if tp == 1 or len(shape) == 1:
        return None
    return 1 if name.endswith(("wo.weight", "w2.weight")) else 0


def _checkpoint(out: Path, family: str, tp: int = 1) -> tuple[Path, dict]:
    """Rank files and layout.json by the real writer, for the zoo model's own parameters (names, order, shapes)
    in the layout a DP 2 ZeRO-1 bf16 recipe gives (``target_layout``: its flat buckets), TP ``tp`` x DP 2."""
    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build
    from model_zoo.parallel import split_shard
    from porting.train import load_recipe
    from porting.train.run.checkpoint.merge import target_layout

    cfg = LlamaConfig.from_hf(FAMILIES[family])
    specs = tuple(ParamSpec(p.name, tuple(p.shape), _axis(p.name, tuple(p.shape), tp), "BF16")
                  for p in build(cfg, defer_init=True).trainable_params())
    rec = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [
        "cluster.device=ascend", f"cluster.devices_per_node={2 * tp}", f"parallel.tensor_parallel={tp}",
        "parallel.optimizer_sharding=true", "batching.micro_batch_size=1", "precision.param_dtype=bfloat16",
        "precision.compute_dtype=bfloat16"], check_files=False)
    layout = target_layout(Layout(tp, tp, 0, True, specs, ()), rec)
    assert layout.zero and layout.dp == 2 and layout.tp == tp and layout.masters
    rng = np.random.default_rng(0)
    state = {}
    for kind in layout.kinds:
        for p in specs:
            x = rng.standard_normal(p.shape).astype(np.float32)
            state[kind, p.name] = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32) if kind == "param" else x
    out.mkdir(parents=True)
    for r in range(layout.world):
        t = r % tp
        pieces = []
        for k, i, a, b in owned(layout, r):
            spec = layout.params[i]
            part = split_shard(state[k, spec.name], spec.axis, t, tp).ravel()[a:b]
            pieces.append((piece_key(k, spec.name, t, a, b), "BF16" if k == "param" else "F32", b - a,
                           lambda part=part: part))
        write_rank(out, r, pieces)
    write_record(out, layout, identity_of(rec, cfg.to_hf()))
    return out, {name: x for (kind, name), x in state.items() if kind == "param"}


def _two_passes(ck: Path, out: Path, work: Path) -> None:
    """What `port ckpt merge --out` did before the one pass: stage, then convert the staged folder."""
    from converters.convert import ms_to_hf
    from porting.train.run.checkpoint.merge import write_weights

    stage = work / "stage"
    stage.mkdir()
    cfg = write_weights(ck, stage / "model.safetensors")
    (stage / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    ms_to_hf(stage, out, hash_source=True, command=["port"], versions={})


def _without(manifest: dict) -> dict:
    m = json.loads(json.dumps(manifest))
    for key in PER_RUN:
        *path, last = key.split(".")
        d = m
        for part in path:
            d = d[part]
        del d[last]
    return m


@pytest.mark.parametrize("family,tp", [("llama", 1), ("phi3", 1), ("qwen3", 1), ("llama", 2), ("phi3", 2)])
def test_one_pass_equals_the_two_passes_byte_for_byte(tmp_path, family, tp, monkeypatch):
    from porting.train.run.checkpoint import export

    monkeypatch.setattr(export, "versions", lambda: {})
    ck, weights = _checkpoint(tmp_path / "ck", family, tp)
    _two_passes(ck, tmp_path / "two", tmp_path)
    lines: list[str] = []
    done = export.merge(ck, None, hf_out=tmp_path / "one", ms_out=tmp_path / "ms", command=["port"], log=lines.append)
    assert done == [tmp_path / "ms", tmp_path / "one"] and any("param layer 1:" in ln for ln in lines), lines
    two, one = tmp_path / "two", tmp_path / "one"
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    for p in two.iterdir():
        if p.name != "port_manifest.json":
            assert (one / p.name).read_bytes() == p.read_bytes(), p.name
    m1, m2 = (json.loads((d / "port_manifest.json").read_text()) for d in (one, two))
    assert _without(m1) == _without(m2)
    assert m1["source"]["dir"] == str(ck.absolute())
    assert m1["output"]["bytes_written_by"] == {"copy_file_range": 0,
                                                "write": sum(t["nbytes"] for t in _sizes(one / "model.safetensors"))}
    # the MindSpore-named file written in the same pass is the staged one, and the digest the manifest records
    ms_file = (tmp_path / "ms" / "model.safetensors").read_bytes()
    assert ms_file == (tmp_path / "stage" / "model.safetensors").read_bytes()
    _holds(tmp_path / "ms" / "model.safetensors", weights)
    assert m1["source"]["files"][0]["sha256"] == hashlib.sha256(ms_file).hexdigest()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no staging left
    if family == "phi3":   # the fused tensors were joined from parts held apart
        assert any("source_parts" in t for t in m1["tensors"])


def _holds(path: Path, weights: dict[str, np.ndarray]) -> None:
    """The MindSpore-named file holds every weight the rank files were written from, bit for bit (so the two
    passes and the one are checked against the truth, not only against each other)."""
    from converters.safetensors_io import read_header

    raw = path.read_bytes()
    head = read_header(path)
    assert [t.name for t in head.tensors] == list(weights)
    for t in head.tensors:
        want = (weights[t.name].ravel().view(np.uint32) >> 16).astype("<u2").tobytes()
        assert t.dtype == "BF16" and raw[t.begin:t.end] == want, t.name


def _sizes(path: Path) -> list[dict]:
    from converters.safetensors_io import read_header

    return [{"name": t.name, "nbytes": t.nbytes} for t in read_header(path).tensors]


def _rechunk(ck: Path, chunk: int) -> None:
    """The record's chunk digests recomputed for ``chunk``-byte chunks (real digests of the real bytes)."""
    doc = json.loads((ck / "layout.json").read_text())
    for name, entry in doc["files"].items():
        raw = (ck / name).read_bytes()
        entry.update(chunk_bytes=chunk, chunks=[hashlib.sha256(raw[i:i + chunk]).hexdigest()
                                                for i in range(0, len(raw), chunk)])
    (ck / "layout.json").write_text(json.dumps(doc))


def test_pieces_read_into_place_across_chunk_edges_are_checked(tmp_path):
    """Chunks of 4,099 bytes (odd, so every piece starts and ends inside one): each weight is read straight into
    its place with the chunk bytes around it beside it, and every chunk is checked whole. The export equals the
    one at the writer's 4 MiB chunks; one flipped bit inside a weight, or in a chunk's part outside it, is refused."""
    from model_zoo.errors import CheckpointError
    from porting.train.run.checkpoint import export

    ck, _ = _checkpoint(tmp_path / "ck", "llama")
    export.merge(ck, None, hf_out=tmp_path / "a", ms_out=None)
    _rechunk(ck, 4099)
    export.merge(ck, None, hf_out=tmp_path / "b", ms_out=None)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    from converters.safetensors_io import read_header

    rank0 = ck / "rank_00000.safetensors"
    weights = [t for t in read_header(rank0).tensors if t.name.startswith("param/")]
    after = max(t.end for t in weights)   # the first byte after the weights: in the chunk of their last bytes
    assert after % 4099 and after < rank0.stat().st_size
    for at in (weights[1].begin + weights[1].nbytes // 2, after):
        raw = bytearray(rank0.read_bytes())
        raw[at] ^= 1
        rank0.write_bytes(bytes(raw))
        with pytest.raises(CheckpointError, match="do not match the sha256 layout.json records"):
            export.merge(ck, None, hf_out=tmp_path / "c", ms_out=None)
        raw[at] ^= 1
        rank0.write_bytes(bytes(raw))
    assert not (tmp_path / "c").exists()
