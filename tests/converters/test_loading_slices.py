"""A tensor-parallel rank reads only its slice's byte ranges from safetensors (converters/loading.py
``read_slice``), and gets exactly the slice that cutting the whole tensor gives, on the real stories260K
checkpoint (fp32) and a bf16 copy of it, for every tensor, split axis and rank of TP 2 and 4."""

from __future__ import annotations

import numpy as np
import pytest

from converters.loading import read_slice, _read
from converters.sources import TensorReader, open_hf
from model_zoo.parallel import split_shard
from tests.attacks.harness import EMBEDDED


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("bf16")
    for f in EMBEDDED.iterdir():
        shutil.copyfile(f, d / f.name)
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(EMBEDDED / "model.safetensors")).items()},
              str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("which", ["fp32", "bf16"])
def test_each_rank_reads_exactly_its_slice(which, bf16_dir):
    src = open_hf(EMBEDDED if which == "fp32" else bf16_dir)
    with TensorReader(src) as reader:
        for name in src.tensor_names():
            t = reader.info(name)
            full = _read(reader, name)
            whole = t.end - t.begin
            for axis in range(len(t.shape)):
                for size in (2, 4):
                    if t.shape[axis] % size:
                        continue
                    for rank in range(size):
                        got, nbytes = read_slice(reader, name, axis, rank, size)
                        assert np.array_equal(got, split_shard(full, axis, rank, size)), (name, axis, size, rank)
                        assert nbytes == whole // size   # 1/size of the tensor's bytes, nothing more


def test_the_hf_load_logs_one_line_per_layer_with_its_bytes():
    """No silent window while a big model loads: a line per decoder layer (and the embedding, the final norm and
    head), whose bytes add up to what the load read."""
    from converters.loading import load_hf_dir
    from model_zoo.config import LlamaConfig
    from model_zoo.llama import build

    model = build(LlamaConfig.from_hf(EMBEDDED), defer_init=True)
    lines: list[str] = []
    total = load_hf_dir(model, EMBEDDED, log=lines.append)
    groups = [ln.split(": ")[1] for ln in lines]
    assert groups == ["embedding"] + [f"layer {i}" for i in range(5)] + ["final norm and head"], groups
    assert sum(int(ln.split(": ")[2].split(" bytes")[0]) for ln in lines) == total > 0
    assert not any(p.has_init for p in model.get_parameters())   # every deferred weight was given its value
