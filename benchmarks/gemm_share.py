"""How much of a training step is GEMM, and how fast each library runs those GEMMs; the
``--part gemm`` of benchmarks/train_throughput.py.

Per shape, on ONE core (torch, MindSpore, OpenBLAS and port's kernels all limited to one thread), the
variants interleaved in one process, each timed by wall clock and by the process's CPU time (which other
jobs on a shared machine inflate far less than the wall time: caches and memory stay shared):

* ``torch_step`` / ``port_step``: the benchmark's torch step and `port train`'s one-graph step;
  ``port_step_blas``: the same with every x @ W^T on numpy's OpenBLAS (benchmarks/blas_linear.py);
* the same step's matmuls alone, forward and backward (y = x W^T, dx = dy W, dW = dy^T x per linear
  layer, the LM head included), each library on its own: ``torch_mkl`` (torch.mm, MKL),
  ``mindspore_split`` (a MindSpore graph of MatMul ops, oneDNN, one per layer as port's model runs them),
  ``mindspore_fused`` (the same with q/k/v and gate/up each as one wider matmul: fewer, larger oneDNN
  calls), ``numpy_openblas`` (numpy's matmul, the OpenBLAS its wheel bundles).

From those: each step's GEMM share, and the best step ratio against torch that port could reach if its
matmuls ran at MKL's speed with the rest of its step unchanged.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import numpy as np

from benchmarks import blas_linear

STEPS = ("torch_step", "port_step", "port_step_blas")


def linear_shapes(cfg: dict, fused: bool) -> dict[tuple[int, int], int]:
    """(in, out) -> count of the step's linear layers for HF config dict ``cfg``, q/k/v and gate/up as one
    each when ``fused``."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])
    per_layer = [(h, h + 2 * kv), (h, h), (h, 2 * inter), (inter, h)] if fused else \
        [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]
    out: dict[tuple[int, int], int] = {}
    for shape in per_layer:
        out[shape] = out.get(shape, 0) + layers
    out[(h, cfg["vocab_size"])] = out.get((h, cfg["vocab_size"]), 0) + 1
    return out


def _operands(shapes: dict[tuple[int, int], int], rows: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(x, w, dy) per linear layer; distinct weights and gradients per layer, as in the model (a graph
    of equal matmuls would be merged by MindSpore's common-subexpression pass)."""
    rng = np.random.default_rng(0)
    out = []
    for (k, n), count in shapes.items():
        x = rng.standard_normal((rows, k)).astype(np.float32)
        for _ in range(count):
            out.append((x, rng.standard_normal((n, k)).astype(np.float32),
                        rng.standard_normal((rows, n)).astype(np.float32)))
    return out


def _mindspore_gemms(ops_in: list) -> Callable[[], None]:
    import mindspore as ms
    from mindspore import nn, ops

    class Gemms(nn.Cell):
        """Forward and backward matmuls of every linear layer, as MindSpore's MatMul grad runs them."""

        def __init__(self, layers: int):
            super().__init__()
            self.layers = layers
            self.nt, self.nn, self.tn = ops.MatMul(transpose_b=True), ops.MatMul(), ops.MatMul(transpose_a=True)

        def construct(self, *args):
            outs = ()
            for i in range(self.layers):
                x, w, dy = args[3 * i], args[3 * i + 1], args[3 * i + 2]
                outs = outs + (self.nt(x, w), self.nn(dy, w), self.tn(dy, x))
            return outs

    cell = Gemms(len(ops_in))
    tensors = [ms.Tensor(a) for triple in ops_in for a in triple]
    return lambda: cell(*tensors)[-1].asnumpy()


def gemm_fns(cfg: dict, rows: int) -> tuple[dict[str, Callable[[], None]], float]:
    """The step's matmuls per library, and their floating-point operations."""
    import torch

    split = _operands(linear_shapes(cfg, False), rows)
    flops = float(sum(3 * 2 * x.shape[0] * x.shape[1] * w.shape[0] for x, w, _ in split))
    tops = [tuple(torch.from_numpy(a) for a in t) for t in split]
    outs = [(np.empty((rows, w.shape[0]), np.float32), np.empty(x.shape, np.float32), np.empty(w.shape, np.float32))
            for x, w, _ in split]

    def torch_mkl() -> None:
        for x, w, dy in tops:
            torch.nn.functional.linear(x, w), dy.mm(w), dy.t().mm(x)

    def numpy_openblas() -> None:
        for (x, w, dy), (y, dx, dw) in zip(split, outs):
            np.matmul(x, w.T, out=y), np.matmul(dy, w, out=dx), np.matmul(dy.T, x, out=dw)

    return {"torch_mkl": torch_mkl, "mindspore_split": _mindspore_gemms(split),
            "mindspore_fused": _mindspore_gemms(_operands(linear_shapes(cfg, True), rows)),
            "numpy_openblas": numpy_openblas}, flops


def one_thread() -> None:
    """Every library of this process on one thread (set before any of them runs)."""
    import mindspore as ms
    import torch

    os.environ["PORT_CPU_KERNEL_THREADS"] = "1"
    torch.set_num_threads(1)
    ms.set_context(runtime_num_threads=1)
    # numpy's OpenBLAS read OPENBLAS_NUM_THREADS when numpy was imported, before this: set it through its API
    blas_linear.openblas_call(tuple(t for _, t in blas_linear.SYMBOLS), 1)


def gemm_raw(args, shapes: dict, make_torch_step: Callable, make_ms_step: Callable) -> dict:
    """Wall and CPU seconds per call of every variant, per shape (benchmarks/train_throughput.py's step
    makers)."""
    one_thread()
    raw: dict[str, dict[str, list[dict]]] = {}
    for name, cfg in shapes.items():
        fns, flops = gemm_fns(cfg, args.batch * args.seq)
        b, s = args.batch, args.seq
        fns = {"torch_step": make_torch_step(cfg, b, s, args.torch_attn), "port_step": make_ms_step(cfg, b, s)[0],
               "port_step_blas": make_ms_step(cfg, b, s, blas=True)[0], **fns}
        for fn in fns.values():
            for _ in range(args.warmup):
                fn()
        runs = raw.setdefault(name, {k: [] for k in fns})
        for _ in range(args.rounds):
            for key, fn in fns.items():
                wall, cpu = [], []
                for _ in range(args.steps):
                    t, c = time.perf_counter(), time.process_time()
                    fn()
                    wall.append(time.perf_counter() - t)
                    cpu.append(time.process_time() - c)
                runs[key].append({"wall": wall, "cpu": cpu, "gflop": flops / 1e9})
    return raw


def gemm_rows(raw: dict, args, env: dict) -> list[dict]:
    """Per shape: best wall and CPU ms per variant, GEMM GFLOP/s per library (CPU time), each step's GEMM
    share, and port's step ratio if its matmuls ran at MKL's speed."""
    import json

    rows = []
    for name, runs in raw.items():
        best = {k: {m: min(t for r in v for t in r[m]) for m in ("wall", "cpu")} for k, v in runs.items()}
        med = {k: statistics.median(t for r in v for t in r["cpu"]) for k, v in runs.items()}
        gflop = next(iter(runs.values()))[0]["gflop"]
        cpu = {k: v["cpu"] for k, v in best.items()}
        row = {"gemm_share": name, "threads": 1, "emulation": env.get("emulation"), "gflop_per_step": round(gflop, 2),
               **{f"{k}_ms": {"best_wall": round(1e3 * v["wall"], 1), "best_cpu": round(1e3 * v["cpu"], 1),
                              "median_cpu": round(1e3 * med[k], 1)} for k, v in best.items()},
               **{f"{k}_gflops_cpu": round(gflop / cpu[k], 1) for k in runs if k not in STEPS},
               "torch_step_gemm_share": round(cpu["torch_mkl"] / cpu["torch_step"], 3),
               "port_step_gemm_share": round(cpu["mindspore_split"] / cpu["port_step"], 3),
               "port_vs_torch_step_cpu": round(cpu["torch_step"] / cpu["port_step"], 3),
               "port_blas_vs_torch_step_cpu": round(cpu["torch_step"] / cpu["port_step_blas"], 3)}
        for lib in ("torch_mkl", "mindspore_fused", "numpy_openblas"):
            row[f"port_vs_torch_if_gemm_{lib}"] = round(
                cpu["torch_step"] / (cpu["port_step"] - cpu["mindspore_split"] + cpu[lib]), 3)
        row["port_vs_torch_if_gemm_free"] = round(cpu["torch_step"] / (cpu["port_step"] - cpu["mindspore_split"]), 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows
