"""Benchmark only: `port train`'s step with every ``x @ W^T`` (the linear layers and the LM
head, forward and backward) through numpy's bundled OpenBLAS instead of MindSpore's MatMul (oneDNN), as
``ops.Custom`` AOT kernels (benchmarks/csrc/blas_linear.cc); ``--variants one_blas`` of
benchmarks/train_throughput.py runs it side by side with ``one``.

It answers whether an optimised GEMM already on a user's machine, without a new dependency, makes the
step faster than oneDNN; it is not used by port. The library and its symbols are found through numpy's
own files (numpy 1.x wheels: ``numpy.libs/libopenblas64_p*.so``, ``cblas_sgemm64_``; numpy 2.x:
``scipy_openblas64``); :func:`check` compares forward and backward with torch before any timing.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("csrc") / "blas_linear.cc"
SYMBOLS = (("cblas_sgemm64_", "openblas_set_num_threads64_"),
           ("scipy_cblas_sgemm64_", "scipy_openblas_set_num_threads64_"),
           ("cblas_sgemm", "openblas_set_num_threads"))


def find_openblas() -> tuple[str, str, str]:
    """(library path, sgemm symbol, set-threads symbol) of the OpenBLAS numpy's wheel ships."""
    import ctypes

    root = Path(np.__file__).resolve().parent
    for lib in sorted((*root.parent.joinpath("numpy.libs").glob("lib*openblas*.so*"),
                       *root.parent.joinpath("scipy_openblas64", "lib").glob("lib*openblas*.so*"))):
        handle = ctypes.CDLL(str(lib))
        for sgemm, threads in SYMBOLS:
            if hasattr(handle, sgemm):
                return str(lib), sgemm, threads
    raise SystemExit(f"error: no OpenBLAS with a cblas_sgemm found beside numpy ({root}); the one_blas variant "
                     "needs a numpy wheel that bundles OpenBLAS")


def openblas_call(symbols: tuple[str, ...], *args, restype=None):
    """Calls the first of ``symbols`` the bundled OpenBLAS has (its thread count, its core name)."""
    import ctypes

    handle = ctypes.CDLL(find_openblas()[0])
    fn = next(getattr(handle, s) for s in symbols if hasattr(handle, s))
    fn.restype = restype
    return fn(*args)


def library() -> str:
    """The kernel library, compiled once into port's kernel cache for this CPU's code path."""
    from model_zoo import cpu_kernels

    isa = cpu_kernels.selected_isa()
    flags = [*cpu_kernels.FLAGS, *cpu_kernels.ISAS[isa][0], f"-I{cpu_kernels.CSRC}"]
    key = hashlib.sha256(SOURCE.read_bytes() + (cpu_kernels.CSRC / "cpu_common.h").read_bytes()
                         + " ".join(flags).encode()).hexdigest()[:16]
    out = cpu_kernels.cache_dir() / f"bench-blas-linear-{isa}-{key}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([os.environ.get("CXX") or "g++", *flags, "-o", str(tmp), str(SOURCE), "-ldl"], check=True,
                       timeout=300)
        os.replace(tmp, out)
    lib, sgemm, threads = find_openblas()
    os.environ.update(PORT_BENCH_BLAS_LIB=lib, PORT_BENCH_BLAS_SGEMM=sgemm, PORT_BENCH_BLAS_THREADS=threads)
    return str(out)


def blas_linear():
    """A cell ``(x (M, K), w (N, K)) -> x @ w^T`` over OpenBLAS, differentiable (the backward is its bprop)."""
    from mindspore import nn, ops

    lib = library()

    class BlasLinear(nn.Cell):
        def __init__(self):
            super().__init__()
            backward = ops.Custom(f"{lib}:BlasLinearBackward", func_type="aot", out_shape=lambda x, w, dy: (x, w),
                                  out_dtype=lambda x, w, dy: (x, w))

            def bprop(x, w, out, dout):
                return backward(x, w, dout)

            self.forward = ops.Custom(f"{lib}:BlasLinearForward", func_type="aot",
                                      out_shape=lambda x, w: (x[0], w[0]), out_dtype=lambda x, w: x, bprop=bprop)

        def construct(self, x, w):
            return self.forward(x, w)

    return BlasLinear()


def patch(model) -> int:
    """Swaps every ``MatMul(transpose_b=True)`` of ``model``'s cells (Linear.matmul, the LM head's
    logits_matmul) for :func:`blas_linear`; how many were swapped."""
    from mindspore import ops

    swapped = 0
    for _, cell in model.cells_and_names():
        for attr in ("matmul", "logits_matmul"):
            prim = getattr(cell, attr, None)
            if isinstance(prim, ops.MatMul) and prim.transpose_b and not prim.transpose_a:
                setattr(cell, attr, blas_linear())
                swapped += 1
    if swapped == 0:
        raise SystemExit("error: the one_blas variant found no MatMul(transpose_b=True) in the model to swap")
    return swapped


def check(tol: float = 1e-4) -> dict:
    """Forward and both gradients of :func:`blas_linear` against torch's F.linear at an odd shape;
    SystemExit beyond ``tol`` (max abs, relative to the largest value)."""
    import mindspore as ms
    import torch

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    rng = np.random.default_rng(0)
    x, w, dy = (rng.standard_normal(s).astype(np.float32) for s in ((301, 67), (53, 67), (301, 53)))
    cell = blas_linear()
    fwd = ms.value_and_grad(lambda a, b: (cell(a, b) * ms.Tensor(dy)).sum(), (0, 1))
    y = cell(ms.Tensor(x), ms.Tensor(w)).asnumpy()
    _, (gx, gw) = fwd(ms.Tensor(x), ms.Tensor(w))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.linear(tx, tw)
    (ty * torch.from_numpy(dy)).sum().backward()
    errs = {name: float(np.abs(a - b.detach().numpy()).max() / np.abs(b.detach().numpy()).max())
            for name, a, b in (("y", y, ty), ("dx", gx.asnumpy(), tx.grad), ("dw", gw.asnumpy(), tw.grad))}
    if max(errs.values()) > tol:
        raise SystemExit(f"error: the OpenBLAS linear differs from torch beyond {tol}: {errs}")
    return errs
