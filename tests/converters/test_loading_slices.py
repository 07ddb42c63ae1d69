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
