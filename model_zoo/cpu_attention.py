"""Causal attention for the CPU as a MindSpore ``ops.Custom`` AOT kernel, forward and backward.

The reference attention (BatchMatMul + mask + softmax + BatchMatMul) materialises the float32
B x N x S x S scores several times per step; on the CPU it took ~70% of a training step. The C++
kernels in ``csrc/causal_attention.cc`` keep one block of score rows per thread and recompute the
probabilities in the backward pass from the saved log-sum-exp (the flash-attention recipe), with
grouped-query attention native (k/v are never repeated) and threads over (batch, head)
(``$PORT_CPU_ATTENTION_THREADS``, default: the CPUs this process may use).

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

SOURCE = Path(__file__).with_name("csrc") / "causal_attention.cc"
FLAGS = ("-O3", "-march=native", "-ffast-math", "-pthread", "-shared", "-fPIC", "-std=c++17")
OP = "port C++ causal attention (ops.Custom aot: fp32, threads over heads, flash-style backward)"
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
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), _compiler_id(cxx).encode(), _cpu_flags().encode()):
        key.update(part)
    out = cache_dir() / f"causal_attention-{key.hexdigest()[:16]}.so"
    if out.is_file():
        return str(out), f"compiled library {out}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Compile to a private name, then rename: concurrent msrun workers never load a half-written file.
        fd, tmp = tempfile.mkstemp(prefix=out.stem + ".", suffix=".tmp.so", dir=out.parent)
        os.close(fd)
        proc = subprocess.run([cxx, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            os.unlink(tmp)
            first = (proc.stderr.strip().splitlines() or ["(no output)"])[0]
            return None, f"compiling {SOURCE.name} with {cxx} failed: {first}"
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"could not build {SOURCE.name} in {out.parent}: {exc}"
    return str(out), f"compiled library {out}"


def available() -> bool:
    return status()[0] is not None
