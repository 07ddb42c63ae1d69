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

The library is compiled on first use with the system C++ compiler (``$CXX`` or ``g++``) for this
machine (``-march=native``) into a per-user cache, keyed by the source, the flags and the compiler,
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

from model_zoo.errors import PortingError
from model_zoo.files import write_atomic

CSRC = Path(__file__).with_name("csrc")
SOURCES = (CSRC / "causal_attention.cc", CSRC / "rms_norm.cc", CSRC / "rope.cc")
HEADERS = (CSRC / "cpu_common.h",)
# -ffast-math: reductions and exp vectorise only with it (3x on attention); that NaN and inf still
# propagate, which the training loop's NaN stop relies on, is tested.
FLAGS = ("-O3", "-march=native", "-ffast-math", "-pthread", "-shared", "-fPIC", "-std=c++17")
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


def _cpu_flags() -> str:
    # -march=native: a library built on one CPU must not be reused on another (shared home dirs).
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def status() -> tuple[str | None, str]:
    """(path of the compiled library or None, why). Compiles at most once per machine and source."""
    cxx = _compiler()
    if cxx is None:
        return None, f"no C++ compiler found ({os.environ.get('CXX') or 'g++'}); install g++ to use it"
    key = hashlib.sha256()
    for part in (*(f.read_bytes() for f in SOURCES + HEADERS), " ".join(FLAGS).encode(),
                 _compiler_id(cxx).encode(), _cpu_flags().encode()):
        key.update(part)
    out = cache_dir() / f"{LIBRARY}-{key.hexdigest()[:16]}.so"
    if out.is_file():
        return str(out), f"compiled library {out}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Compile in a private folder, then publish with write_atomic: concurrent msrun workers never
        # load a half-written library, and one that is already there stays until the new one is whole.
        with tempfile.TemporaryDirectory(prefix=f".{out.stem}.", dir=out.parent) as tmp:
            built = Path(tmp) / out.name
            proc = subprocess.run([cxx, *FLAGS, "-o", str(built), *map(str, SOURCES)], capture_output=True,
                                  text=True, timeout=300)
            if proc.returncode != 0:
                first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
                return None, f"compiling {' '.join(f.name for f in SOURCES)} with {cxx} failed: {first}"
            write_atomic(out, built.read_bytes())
    except (OSError, subprocess.SubprocessError, PortingError) as exc:
        return None, f"could not build {LIBRARY} in {out.parent}: {exc}"
    return str(out), f"compiled library {out}"


def available() -> bool:
    return status()[0] is not None
