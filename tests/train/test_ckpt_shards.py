"""Per-rank checkpoints without msrun (porting/train/run/checkpoint/format.py, ckpt_read.py, ckpt_merge.py).

- Re-slicing: real rank files written for a TP 2 x DP 2 ZeRO layout of three tensors (one split along
  axis 0, one along axis 1, one replicated), read back in six other layouts: every rank's every range
  equals the slice cut directly from the full tensors, and in its own layout a rank reads exactly its
  shard's data bytes.
- A real 1-device run of stories260K: `port ckpt merge` writes an HF directory that
  ``transformers.from_pretrained`` loads, bitwise the weights in the checkpoint; `port ckpt reshard` to
  DP 2 with ZeRO and back to 1 device, then `--resume`, ends bitwise equal to the uninterrupted run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from model_zoo.parallel import split_shard
from porting.train.run.checkpoint import read as ckpt_read
from porting.train.run.checkpoint.format import (Layout, ParamSpec, needed, owned, piece_bytes, piece_key, write_rank,
                                       write_record)

SPECS = (ParamSpec("emb", (8, 6), 0, "F32"), ParamSpec("wo", (6, 8), 1, "BF16"), ParamSpec("norm", (6,), None, "F32"))


def _buckets(tp: int, dp: int, groups=((0, 1), (2,))):
    out = []
    for idx in groups:
        n = sum(SPECS[i].local_numel(tp) for i in idx)
        out.append((idx, -(-n // dp) * dp))
    return tuple(out)


def _layout(world: int, tp: int, zero: bool) -> Layout:
    specs = SPECS if tp > 1 else tuple(ParamSpec(p.name, p.shape, None, p.dtype) for p in SPECS)
    return Layout(world, tp, int(zero), True, specs, _buckets(tp, world // tp) if zero else ())


def _truth() -> dict[tuple[str, str], np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for kind in ("param", "master", "adam_m", "adam_v"):
        for p in SPECS:
            x = rng.standard_normal(p.shape).astype(np.float32)
            if p.dtype == "BF16":   # values a bf16 parameter can hold exactly
                x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
            out[kind, p.name] = x
    return out


def _write(d, layout: Layout, truth) -> None:
    for r in range(layout.world):
        t = r % layout.tp
        pieces = []
        for kind, i, a, b in owned(layout, r):
            p = layout.params[i]
            part = split_shard(truth[kind, p.name], p.axis, t, layout.tp).ravel()[a:b]
            pieces.append((piece_key(kind, p.name, t, a, b), p.dtype if kind == "param" else "F32", b - a,
                           lambda part=part: part))
        write_rank(d, r, pieces)
    write_record(d, layout, {"seed": 0})


@pytest.mark.parametrize("world,tp,zero", [(4, 2, True), (4, 1, True), (2, 1, False), (1, 1, False),
                                           (4, 4, False), (8, 2, True), (4, 2, False)])
def test_every_layout_reads_exactly_its_slices(tmp_path, world, tp, zero):
    truth = _truth()
    saved = _layout(4, 2, True)
    _write(tmp_path, saved, truth)
    new = _layout(world, tp, zero)
    for r in range(world):
        src, _ = ckpt_read.open_checkpoint(tmp_path)
        t = r % tp
        for kind, i, a, b in needed(new, r):
            p = new.params[i]
            got = src.assemble(kind, p.name, tp, t, a, b, SPECS[i].axis)
            want = split_shard(truth[kind, p.name], SPECS[i].axis if tp > 1 else None, t, tp).ravel()[a:b]
            assert np.array_equal(got, want), (kind, p.name, r)
        data = src.files.bytes_read - src.files.header_bytes
        if (world, tp, zero) == (4, 2, True):   # its own layout: exactly its shard's bytes, nothing more
            assert data == piece_bytes(new, needed(new, r))
        src.files.close()


def test_a_replicated_state_has_one_owner_per_tensor_parallel_slice():
    lay = _layout(4, 2, False)
    assert [bool(owned(lay, r)) for r in range(4)] == [True, True, False, False]
    zero = _layout(4, 2, True)
    covered = {}
    for r in range(4):
        for kind, i, a, b in owned(zero, r):
            covered.setdefault((kind, i, r % 2), []).append((a, b))
    for (kind, i, t), spans in covered.items():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == SPECS[i].local_numel(2)
        assert all(x[1] == y[0] for x, y in zip(spans, spans[1:]))   # no gap, no overlap


# --------------------------------------------------------------------------- a real run
def _sets(*extra: str) -> list[str]:
    return ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
            "checkpointing.every_steps=2", "checkpointing.keep_last=5", *extra]


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    from porting.train import train
    from porting.train import load_recipe
    from tests.train.conftest import TINY

    root = tmp_path_factory.mktemp("ckpt")
    base = [f"model.source={model_dir}"]
    train(load_recipe(TINY, _sets(*base, "schedule.max_steps=4")), root / "ref", echo=False)
    return root, base


@pytest.mark.slow
def test_merge_loads_in_transformers_bitwise(runs, model_dir):
    import torch
    import transformers

    from converters import names
    from model_zoo.config import LlamaConfig
    from porting.cli import main

    root, _ = runs
    ck = root / "ref" / "checkpoints" / "step_4"
    res = CliRunner().invoke(main, ["ckpt", "merge", str(ck), "--out", str(root / "hf0")])
    # the run's model is a folder outside the run: the manifest's path is not followed (no tokenizer files)
    assert res.exit_code == 0 and "pass --model DIR" in res.output, res.output
    assert not (root / "hf0" / "tokenizer.json").exists()
    res = CliRunner().invoke(main, ["ckpt", "merge", str(ck), "--out", str(root / "hf"), "--model", str(model_dir)])
    assert res.exit_code == 0, res.output
    assert (root / "hf" / "port_manifest.json").is_file() and (root / "hf" / "tokenizer.json").is_file()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(root / "hf"), torch_dtype=torch.float32)
    state = model.state_dict()
    src, _ = ckpt_read.open_checkpoint(ck)
    cfg = LlamaConfig.from_hf(model_dir)
    table = names.NAME_MAPS[cfg.model_type]
    for hf_name in names.expected_hf_names(cfg):
        ms = names.map_name(hf_name, table)
        assert np.array_equal(state[hf_name].numpy(), src.full("param", ms)), hf_name
    start = load_file_np(model_dir / "model.safetensors")
    assert not np.array_equal(start["model.norm.weight"], state["model.norm.weight"].numpy())   # it trained


def load_file_np(path):
    from safetensors.numpy import load_file

    return load_file(str(path))


@pytest.mark.slow
def test_reshard_to_dp2_zero_and_back_resumes_bitwise(runs):
    from porting.cli import main
    from porting.train.run.checkpoint.save import latest
    from porting.train import train
    from porting.train import load_recipe
    from tests.train.conftest import TINY

    root, base = runs
    ck = root / "ref" / "checkpoints" / "step_2"
    dp2 = root / "dp2"
    args = ["ckpt", "reshard", str(ck), "--to", str(TINY), "--out", str(dp2)]
    sets = [a for s in base + ["cluster.devices_per_node=2", "parallel.optimizer_sharding=true",
                               "batching.micro_batch_size=2"] for a in ("--set", s)]
    res = CliRunner().invoke(main, args + sets)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in dp2.iterdir()) == ["layout.json", "rank_00000.safetensors",
                                                     "rank_00001.safetensors", "state.json"]
    assert json.loads((dp2 / "layout.json").read_text())["layout"]["zero"] == 1
    back = root / "back" / "checkpoints" / "step_2"
    res = CliRunner().invoke(main, ["ckpt", "reshard", str(dp2), "--to", str(TINY), "--out", str(back),
                                    *[a for s in base for a in ("--set", s)]])
    assert res.exit_code == 0, res.output
    train(load_recipe(TINY, _sets(*base, "schedule.max_steps=4")), root / "back", resume=True, echo=False)
    a, b = (ckpt_read.open_checkpoint(latest(r / "checkpoints")[1])[0] for r in (root / "ref", root / "back"))
    for kind in ("param", "adam_m", "adam_v"):
        for p in a.layout.params:
            assert np.array_equal(a.full(kind, p.name), b.full(kind, p.name)), (kind, p.name)
    res = CliRunner().invoke(main, args + sets)   # never over an existing directory
    assert res.exit_code != 0 and "exists" in res.output


@pytest.mark.parametrize("shape,axis", [((6, 8), 1), ((8, 6), 0), ((4, 8, 3), 1), ((2, 3, 8), 2), ((12,), None)])
def test_range_mapping_equals_the_global_index_arrays(shape, axis):
    """``ckpt_read._blocks`` (arithmetic) maps every element exactly as explicit global index arrays do, for
    every pair of TP sizes and 40 random ranges on each side."""
    from porting.train.run.checkpoint.read import _blocks, _run

    spec = ParamSpec("x", shape, axis, "F32")
    full = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    rng = np.random.default_rng(1)
    row = int(np.prod(shape[axis:])) if axis is not None else full.size
    for tp0, tp1 in [(1, 2), (2, 1), (2, 2), (2, 4), (4, 2), (1, 1)]:
        if axis is None and (tp0, tp1) != (1, 1):
            continue
        for _ in range(40):
            t0, t1 = int(rng.integers(tp0)), int(rng.integers(tp1))
            old = split_shard(full, axis, t0, tp0).ravel()
            new = split_shard(full, axis, t1, tp1).ravel()
            a0, b0 = sorted(int(x) for x in rng.integers(0, old.size + 1, 2))
            a1, b1 = sorted(int(x) for x in rng.integers(0, new.size + 1, 2))
            if a0 == b0 or a1 == b1:
                continue
            got = np.full(b1 - a1, -1.0, np.float32)
            have = (*_run(spec, axis, tp0, t0, row), a0, b0)
            want = (*_run(spec, axis, tp1, t1, row), a1, b1)
            for r, n, s, w in _blocks(have, want):
                for k in range(r):
                    got[w - a1 + k * want[0]:w - a1 + k * want[0] + n] = old[s + k * have[0]:s + k * have[0] + n]
            both = np.intersect1d(old[a0:b0], new[a1:b1])   # the elements (unique values) both ranges hold
            expect = np.where(np.isin(new[a1:b1], both), new[a1:b1], -1.0)
            assert np.array_equal(got, expect), (shape, axis, tp0, tp1, t0, t1, (a0, b0), (a1, b1))


@pytest.mark.slow
def test_merge_ms_loads_strictly_into_the_zoo_cell_with_the_optimizer_state(runs, model_dir):
    """`port ckpt merge --ms`: MindSpore-named full weights that ``mindspore.load_checkpoint`` +
    ``load_param_into_net(strict_load=True)`` load into the zoo's cell with nothing missing or left over, and
    the optimizer state beside them equals the checkpoint's, tensor by tensor."""
    import mindspore as ms
    from safetensors.numpy import load_file

    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build
    from porting.cli import main

    root, _ = runs
    ck = root / "ref" / "checkpoints" / "step_4"
    out = root / "ms"
    res = CliRunner().invoke(main, ["ckpt", "merge", str(ck), "--ms", str(out), "--optimizer",
                                    "--model", str(model_dir), "--out", str(root / "hf_too")])
    assert res.exit_code == 0, res.output
    # both outputs from one pass over the rank files (porting/train/run/checkpoint/export.py merge)
    assert (root / "hf_too" / "port_manifest.json").is_file() and (root / "hf_too" / "tokenizer.json").is_file()
    assert "merge step_4: param layer 0:" in res.stderr   # one progress line per parameter group
    assert {"model.safetensors", "config.json", "tokenizer.json", "optimizer.safetensors",
            "optimizer.json"} <= {p.name for p in out.iterdir()}
    net = build(LlamaConfig.from_hf(out))
    loaded = ms.load_checkpoint(str(out / "model.safetensors"), format="safetensors")
    not_loaded, unused = ms.load_param_into_net(net, loaded, strict_load=True)
    assert not not_loaded and not unused, (not_loaded, unused)
    src, _ = ckpt_read.open_checkpoint(ck)
    for p in net.trainable_params():
        assert np.array_equal(p.asnumpy(), src.full("param", p.name)), p.name
    opt = load_file(str(out / "optimizer.safetensors"))
    kinds = src.layout.kinds[1:]
    assert set(opt) == {f"{k}.{p.name}" for k in kinds for p in src.layout.params}
    for k in kinds:
        for p in src.layout.params:
            assert np.array_equal(opt[f"{k}.{p.name}"], src.full(k, p.name)), (k, p.name)
    assert json.loads((out / "optimizer.json").read_text())["updates"] == 4


def test_the_free_space_check_counts_bytes_not_rounded_gib(tmp_path):
    """A need 64 MB above the free space is refused and named in bytes (it once read "0.00 GiB")."""
    import shutil

    from converters.atomic import check_free_space
    from model_zoo.errors import CheckpointError

    need = shutil.disk_usage(tmp_path).free + (64 << 20)   # a margin for other writers on this disk
    with pytest.raises(CheckpointError, match=f"needs {need} bytes"):
        check_free_space(tmp_path / "out", need)
    check_free_space(tmp_path / "out", 1 << 20)


def test_a_record_from_before_chunk_digests_is_checked_whole(tmp_path):
    """layout.json written before per-chunk digests carries each file's whole sha256: it is still read, the
    whole file is checked when first opened, and one flipped bit is refused."""
    import hashlib

    from model_zoo.errors import CheckpointError

    truth = _truth()
    saved = _layout(4, 2, True)
    _write(tmp_path, saved, truth)
    doc = json.loads((tmp_path / "layout.json").read_text())
    for name, entry in doc["files"].items():
        doc["files"][name] = {"rank": entry["rank"], "bytes": entry["bytes"],
                              "sha256": hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()}
    (tmp_path / "layout.json").write_text(json.dumps(doc))
    src, _ = ckpt_read.open_checkpoint(tmp_path)
    assert np.array_equal(src.full("param", "wo"), truth["param", "wo"])
    opened = [n for n in doc["files"] if n in src.files._fds]
    assert opened and src.files.hashed_bytes == sum(doc["files"][n]["bytes"] for n in opened)   # each file it opened, whole
    src.files.close()
    raw = bytearray((tmp_path / "rank_00001.safetensors").read_bytes())
    raw[-1] ^= 1
    (tmp_path / "rank_00001.safetensors").write_bytes(bytes(raw))
    src, _ = ckpt_read.open_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="rank_00001.safetensors: its sha256 differs"):
        src.full("param", "emb")   # its TP slice 1 lives in rank 1: opening it checks the whole file
    src.files.close()


@pytest.mark.parametrize("slice_bytes", [4099, 1 << 20])
def test_a_rank_file_written_in_slices_has_the_chunk_digests_of_its_bytes(tmp_path, monkeypatch, slice_bytes):
    """write_rank hashes each piece slice by slice (ckpt_shards.SLICE_BYTES) on its second thread: with slices
    that straddle pieces and 4 MiB chunks (4,099 bytes) and with the real slices, the sidecar's chunk digests
    are hashlib's over the file's own bytes, and the file is the pieces after its header."""
    import hashlib

    from porting.train.run.checkpoint import format as ckpt_shards

    monkeypatch.setattr(ckpt_shards, "SLICE_BYTES", slice_bytes)
    assert max(len(v) for v in ckpt_shards.slices(bytes(10_000))) == min(slice_bytes, 10_000)   # the size in use
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (5, 700_001, 1, 900_000)]   # 6.4 MB
    pieces = [(f"p{i}", "F32", len(a), lambda a=a: a) for i, a in enumerate(arrays)]
    n = write_rank(tmp_path, 3, pieces)
    data = (tmp_path / "rank_00003.safetensors").read_bytes()
    side = json.loads((tmp_path / ".rank_00003.json").read_text())
    chunk = ckpt_shards.CHUNK_BYTES
    assert n == len(data) == side["bytes"] and side["chunk_bytes"] == chunk and len(side["chunks"]) == 2
    assert side["chunks"] == [hashlib.sha256(data[i:i + chunk]).hexdigest() for i in range(0, len(data), chunk)]
    assert data.endswith(b"".join(a.tobytes() for a in arrays))
