"""The host a run happens on: versions of everything it depends on (for manifests and baselines;
`port doctor` builds on this), the CPU's name, and the one check that the PyTorch side is installed."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import stat
import subprocess
import sys
from pathlib import Path

from model_zoo.errors import ConfigError

PACKAGES = ("mindspore", "mindspeed", "torch", "torch_npu", "transformers", "safetensors", "numpy",
            "tokenizers", "port")


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


MAX_VERSION_FILE_BYTES = 64 << 10   # a version.cfg / version.info is a few hundred bytes; the version is at its top


def _version_in(files: list[Path], pattern: str = r"[Vv]ersion\s*[=:]\s*([\w.\-]{1,64})") -> str | None:
    """The first version string found in the first of ``files`` that is a readable regular file and holds one.
    Only the first :data:`MAX_VERSION_FILE_BYTES` of a file are read (a 3 GB version.cfg took doctor and convert past
    3 GB of memory); a path the system refuses (longer than the file-name limit, a FIFO, no permission) is
    passed over like an absent one."""
    for p in files:
        text = _head(p)
        m = re.search(pattern, text) if text is not None else None
        if m:
            return m.group(1)
    return None


def _head(p: Path) -> str | None:
    """The first bytes of a regular file as text, or None; the open never blocks (O_NONBLOCK: a FIFO)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MAX_VERSION_FILE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def cann_version() -> str | None:
    """CANN toolkit version from the install's version.cfg / *install.info, when present."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH") or "/usr/local/Ascend/ascend-toolkit/latest"
    return _version_in([Path(home) / c for c in ("version.cfg", "compiler/version.info", "runtime/version.info")])


def driver_version() -> str | None:
    return _version_in([Path("/usr/local/Ascend/driver/version.info")], r"Version\s*=\s*([\w.\-]{1,64})")


def firmware_version() -> str | None:
    """Ascend firmware version from the install's version.info, when present."""
    return _version_in([Path("/usr/local/Ascend/firmware/version.info")], r"Version\s*=\s*([\w.\-]{1,64})")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:   # bounded: a few KB a core
            lines = f.read(4 << 20).splitlines()
        for line in lines:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def require_torch(what: str) -> None:
    """One ConfigError line when torch or transformers is missing; ``what`` names who needs them."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"{what} needs PyTorch and transformers ({e}); install the torch extra: "
                          "pip install 'port[torch]' (or a CUDA build of torch on a GPU machine)") from None


def npu_smi() -> str | None:
    try:
        out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def versions() -> dict:
    """Framework, toolkit and host versions; None where a component is absent."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": {name: package_version(name) for name in PACKAGES},
        "cann": cann_version(),
        "ascend_driver": driver_version(),
        "npu_present": npu_smi() is not None,
    }
