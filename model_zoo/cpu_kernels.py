"""port's CPU kernels: causal attention, RMSNorm and RoPE as MindSpore ``ops.Custom`` AOT kernels,
forward and backward (the cells that call them are in :mod:`model_zoo.cpu_cells`).

* Attention (``csrc/causal_attention.cc``). The reference attention (BatchMatMul + mask + softmax +
  BatchMatMul) materialises the float32 B x N x S x S scores several times per step; on the CPU it
  took ~70% of a training step. The kernel keeps one block of score rows per thread and recomputes
  the probabilities in the backward pass from the saved log-sum-exp (the flash-attention recipe), with
  grouped-query attention native (k/v are never repeated). ``PackedAttention*`` is the same kernel for
  packed rows (``batching.packing``): an int32 segment-id input keeps each query to the keys of its own
  example (a block-diagonal causal mask).
* RMSNorm (``csrc/rms_norm.cc``) and rotate-half RoPE (``csrc/rope.cc``): one pass forward and one
  backward instead of about seven ops each.

Both split their work over plain threads started per call (``$PORT_CPU_KERNEL_THREADS``, default: the
CPUs this process may use); float32 only.

Code paths: the sources are compiled once per instruction set into separate libraries (``ISAS``:
avx512, avx2, generic = the x86-64 baseline), each with the vector width of its ISA, and the one used
is picked at run time: ``$PORT_CPU_ISA`` if set (tests and benchmarks force a path with it), else the
best this CPU has (its /proc/cpuinfo flags). An AVX-512 tile compiled for AVX2 spills its accumulators
and ran the attention 4-5x slower (BENCHMARKS.md, "On an AVX2 CPU"). A library is compiled on first use with the system C++
compiler (``$CXX`` or ``g++``) into a per-user cache, keyed by the source, the flags and the compiler,
and reused after that. Where no compiler works, :func:`status` says why and the model keeps the
reference attention (see :func:`model_zoo.kernels.select_kernels`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from model_zoo.errors import KernelError, PortingError
from model_zoo.files import write_atomic

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "causal_attention.cc", CSRC / "rms_norm.cc", CSRC / "rope.cc")
HEADERS = (CSRC / "cpu_common.h",)
# -ffast-math: reductions and exp vectorise only with it (3x on attention); that NaN and inf still
# propagate, which the training loop's NaN stop relies on, is tested.
FLAGS = ("-O3", "-ffast-math", "-pthread", "-shared", "-fPIC", "-std=c++17")
# Per code path: the compiler flags and the /proc/cpuinfo flags a CPU needs for them, best first. No
# -march=native: a library is then the same on every CPU with those flags (shared home directories).
ISAS = {
    "avx512": (("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma"),
               ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma")),
    "avx2": (("-mavx2", "-mfma"), ("avx2", "fma")),
    "generic": ((), ()),
}
ISA_ENV = "PORT_CPU_ISA"
X86 = ("x86_64", "amd64", "i686", "i386")
# Kernels with a CPU implementation, and what reports show for them.
OPS = {
    "attention": "port C++ causal attention (ops.Custom aot: fp32, flash-style backward; block-diagonal for "
                 "packed rows)",
    "rmsnorm": "port C++ RMSNorm (ops.Custom aot: fp32, one pass each way)",
    "rope": "port C++ rotate-half RoPE (ops.Custom aot: fp32, one pass each way)",
}
LIBRARY = "port_cpu_kernels"
CACHE_ENV = "PORT_KERNEL_CACHE"


def cache_dir() -> Path:
    """``$PORT_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/port/kernels``, else ``~/.cache/port/kernels``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "port" / "kernels"


def _compiler() -> str | None:
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


def _compiler_id(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else cxx


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def supported_isas() -> list[str]:
    """The code paths this CPU can run, best first (only generic off x86: the -m flags are x86's)."""
    if platform.machine().lower() not in X86:
        return ["generic"]
    return [isa for isa, (_, need) in ISAS.items() if set(need) <= cpu_flags()]


def cpu_model() -> str:
    """This CPU's model name (/proc/cpuinfo), for reports and benchmarks."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def selected_isa() -> str:
    """``$PORT_CPU_ISA`` if set, else the best path this CPU has; KernelError for one it cannot run."""
    want = os.environ.get(ISA_ENV, "").strip().lower()
    have = supported_isas()
    if not want or want == "auto":
        return have[0]
    if want not in ISAS:
        raise KernelError(f"{ISA_ENV}={want!r}: expected one of {', '.join(ISAS)} or auto (unset: the best this "
                          f"CPU has, here {have[0]})")
    if want not in have:
        missing = sorted(set(ISAS[want][1]) - cpu_flags()) or [platform.machine()]
        raise KernelError(f"{ISA_ENV}={want}: this CPU lacks {', '.join(missing)}; use one of {', '.join(have)} "
                          "or unset it")
    return want


def describe(kernel: str) -> str:
    """What reports show for ``kernel``'s CPU implementation, with the code path in use."""
    return f"{OPS[kernel]} [{selected_isa()} code path]"


def status(isa: str | None = None) -> tuple[str | None, str]:
    """(path of the compiled library of code path ``isa`` (default :func:`selected_isa`) or None, why).
    KernelError for a path this CPU cannot run."""
    isa = isa or selected_isa()
    if isa not in supported_isas():
        raise KernelError(f"port's {isa} CPU kernels cannot run on this CPU (it has {', '.join(supported_isas())})")
    lib, why = _build(isa)
    if lib is not None:
        _HANDED_OUT.add(lib)
    return lib, why


_HANDED_OUT: set[str] = set()


def handed_out() -> list[str]:
    """The libraries :func:`status` gave this process (ops.Custom takes their paths, and a compiled graph keeps
    them: a graph compile cache is only valid where the same files are, porting/train/run/step/precompile.py)."""
    return sorted(_HANDED_OUT)


@functools.lru_cache(maxsize=None)
def _build(isa: str) -> tuple[str | None, str]:
    """Compiles at most once per machine, source, code path and compiler."""
    cxx = _compiler()
    if cxx is None:
        return None, f"no C++ compiler found ({os.environ.get('CXX') or 'g++'}); install g++ to use it"
    flags = (*FLAGS, *ISAS[isa][0])
    key = hashlib.sha256()
    for part in (*(f.read_bytes() for f in SOURCES + HEADERS), " ".join(flags).encode(), _compiler_id(cxx).encode()):
        key.update(part)
    out = cache_dir() / f"{LIBRARY}-{isa}-{key.hexdigest()[:16]}.so"
    if out.is_file():
        return str(out), f"compiled library {out} ({isa} code path)"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Compile in a private folder, then publish with write_atomic: concurrent msrun workers never
        # load a half-written library, and one that is already there stays until the new one is whole.
        with tempfile.TemporaryDirectory(prefix=f".{out.stem}.", dir=out.parent) as tmp:
            built = Path(tmp) / out.name
            proc = subprocess.run([cxx, *flags, "-o", str(built), *map(str, SOURCES)], capture_output=True,
                                  text=True, timeout=300)
            if proc.returncode != 0:
                first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
                return None, f"compiling {' '.join(f.name for f in SOURCES)} with {cxx} failed: {first}"
            write_atomic(out, built.read_bytes())
    except (OSError, subprocess.SubprocessError, PortingError) as exc:
        return None, f"could not build {LIBRARY} in {out.parent}: {exc}"
    return str(out), f"compiled library {out} ({isa} code path)"


def available() -> bool:
    return status()[0] is not None
