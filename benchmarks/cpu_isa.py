"""The CPU a benchmark ran on, and an AVX2-only CPU emulated on an AVX-512 one (benchmarks/train_throughput.py
--emulate).

Emulation ``avx2`` limits every library on both sides to AVX2 + FMA, each through its own switch, and
reports what each one says it runs (all read when the library loads, so every emulation runs in a fresh
child process):

* torch's ATen kernels: ``ATEN_CPU_CAPABILITY=avx2`` (``torch.backends.cpu.get_cpu_capability()``);
* MKL, torch's float32 matmuls: ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (the ``MKL_VERBOSE`` banner);
* oneDNN, MindSpore's matmuls (and torch's mkldnn ops): ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN 3 also reads
  ``DNNL_MAX_CPU_ISA``; the ``ONEDNN_VERBOSE`` isa line);
* OpenBLAS, the one numpy's wheel bundles (benchmarks/gemm_share.py times numpy's matmul):
  ``OPENBLAS_CORETYPE=Haswell`` (its ``openblas_get_corename``);
* MindSpore's nnacl kernels (element-wise ops, small matmuls) have no switch: they ask
  ``X86_Avx512_Support()`` (a cpuid test) through the PLT, so a one-function library preloaded with
  ``LD_PRELOAD`` answers no, and counts the questions;
* port's own kernels: ``PORT_CPU_ISA=avx2`` (model_zoo/cpu_kernels.py).

What it cannot emulate: the CPU itself (clock, caches, memory, another vendor's cores). It shows what
the AVX2 code paths cost on this core, not the speed of any AVX2 machine.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell", "PORT_CPU_ISA": "avx2"}
EMULATIONS = {"native": {}, "avx2": AVX2}
EMULATION_ENV = "PORT_BENCH_EMULATION"
CHILD_TAG = "CHILD-RESULT "
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile")
# nnacl's own test (mindspore/ops/kernel/cpu/nnacl/intrinsics/ms_simd_cpu_info.c) answers whether AVX-512
# may be used; this one says no and counts how often it was asked.
SHIM_SRC = """static long port_asked;
int X86_Avx512_Support(void) { __atomic_add_fetch(&port_asked, 1, __ATOMIC_RELAXED); return 0; }
long PortAvx512Asked(void) { return __atomic_load_n(&port_asked, __ATOMIC_RELAXED); }
"""
PROBE = f"import sys; sys.path.insert(0, {str(ROOT)!r})" + """
import ctypes, json, os, torch, numpy as np
from benchmarks.blas_linear import openblas_call
a = torch.randn(64, 64); (a @ a).sum()
import mindspore as ms
ms.set_context(mode=ms.PYNATIVE_MODE); ms.set_device("CPU")
x = ms.Tensor(np.ones((64, 64), np.float32)); ms.ops.matmul(x, x).asnumpy()
print("PROBE " + json.dumps({"torch_aten": torch.backends.cpu.get_cpu_capability(),
                             "numpy_openblas": openblas_call(("openblas_get_corename64_", "scipy_openblas_get_corename64_",
                                                              "openblas_get_corename"), restype=ctypes.c_char_p).decode()}),
      flush=True)
"""


def cpu_summary() -> dict:
    """Model, CPUs and vector extensions of this machine (and the load around the run)."""
    from model_zoo import cpu_kernels

    flags = cpu_kernels.cpu_flags()
    return {"model": cpu_kernels.cpu_model(), "cpus": len(os.sched_getaffinity(0)),
            "vector_extensions": [f for f in VECTOR_FLAGS if f in flags],
            "port_code_paths": cpu_kernels.supported_isas()}


def shim_path() -> str:
    """The nnacl shim, compiled once into port's kernel cache."""
    from model_zoo import cpu_kernels

    out = cpu_kernels.cache_dir() / f"bench-nnacl-no-avx512-{hashlib.sha256(SHIM_SRC.encode()).hexdigest()[:12]}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        src = out.with_suffix(".c")
        src.write_text(SHIM_SRC)
        cc = os.environ.get("CC") or shutil.which("gcc") or "cc"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True, timeout=120)
    return str(out)


def emulation_env(emu: str) -> dict[str, str]:
    env = dict(EMULATIONS[emu])
    if emu != "native":
        env["LD_PRELOAD"] = " ".join(filter(None, (shim_path(), os.environ.get("LD_PRELOAD"))))
    return env


def probe(env: dict[str, str]) -> dict:
    """What torch's ATen, MKL and MindSpore's oneDNN say they run under ``env`` (a child process)."""
    full = {**os.environ, **env, "ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    got = {"torch_aten": None, "torch_mkl": None, "mindspore_onednn": None, "numpy_openblas": None}
    for line in out.splitlines():
        if line.startswith("PROBE "):
            got.update(json.loads(line[6:]))
        elif "MKL_VERBOSE oneMKL" in line and got["torch_mkl"] is None:
            m = re.search(r"architecture (.*?)(?: enabled processors|,| with support)", line)
            got["torch_mkl"] = m.group(1) if m else line[:120]
        elif ",cpu,isa:" in line and got["mindspore_onednn"] is None:
            got["mindspore_onednn"] = line.split(",cpu,isa:", 1)[1].strip()
    return got


def describe(emu: str | None) -> dict:
    """The emulation and the code paths this process runs (torch's ATen and port's kernels)."""
    import torch

    from model_zoo import cpu_kernels

    info = {"emulation": emu or "none (this process's environment)", "cpu": cpu_kernels.cpu_model(),
            "torch_aten": torch.backends.cpu.get_cpu_capability(), "port_cpu_isa": cpu_kernels.selected_isa(),
            "limits": {k: os.environ[k] for k in AVX2 if k in os.environ}}
    asked = getattr(ctypes.CDLL(None), "PortAvx512Asked", None) if "LD_PRELOAD" in os.environ else None
    if asked is not None:
        asked.restype = ctypes.c_long
        info["nnacl_avx512_asked_and_refused"] = asked()
    return info


def child_result(raw: dict) -> dict:
    return {"raw": raw, "info": describe(os.environ.get(EMULATION_ENV))}


_PROBED: dict[str, dict] = {}


def run_child(script: Path, part: str, emu: str, args) -> dict:
    """One round of ``part`` under emulation ``emu`` in a fresh process: its timed runs and what ran."""
    env = emulation_env(emu)
    if emu not in _PROBED:
        _PROBED[emu] = probe(env)
        print(json.dumps({"emulation": emu, "limits": env, "libraries_report": _PROBED[emu]}), flush=True)
    cmd = [sys.executable, str(script), "--part", part, "--child", "--rounds", "1", "--batch", str(args.batch),
           "--seq", str(args.seq), "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--variants", ",".join(args.variants), "--torch-attn", args.torch_attn]
    proc = subprocess.run(cmd, env={**os.environ, **env, EMULATION_ENV: emu}, capture_output=True, text=True,
                          timeout=3600, cwd=ROOT)
    lines = [l for l in proc.stdout.splitlines() if l.startswith(CHILD_TAG)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"error: the {emu} child of --part {part} failed (exit {proc.returncode}): {tail}")
    got = json.loads(lines[-1][len(CHILD_TAG):])
    got["info"]["libraries_report"] = _PROBED[emu]
    return got
