"""The local directory a user's model argument names: an HF directory, or a zoo name (built-in, or one
the user added with `port zoo add`) found on disk or in the local HF cache. (Not to be confused with
``converters/sources.py``, which reads the tensor files inside such a directory.)

Nothing is downloaded: `port` never touches the network at run time.
"""

from __future__ import annotations

import os
from pathlib import Path

from model_zoo import families, presets
from model_zoo.errors import UnknownModelError


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def find_in_hf_cache(repo_id: str) -> Path | None:
    """The newest local snapshot of ``repo_id`` that has a config.json, or None."""
    snaps = hf_cache_dir() / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    if not snaps.is_dir():
        return None
    found = [p for p in snaps.iterdir() if (p / "config.json").is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def resolve_hf(src: str | os.PathLike) -> Path:
    """A local HF model directory for ``src`` (a path, or a zoo name such as 'llama-7b' or a user's own)."""
    path = Path(src).expanduser()
    if path.exists():
        if not path.is_dir():
            raise UnknownModelError(f"{path}: is a file; expected an HF model directory holding config.json")
        return path
    name = presets.by_hf_repo(str(src)) or str(src)   # an HF repo id of a built-in size: that size
    if not presets.known(name):
        families.check_repo_id(name)   # a well-known MoE / hybrid model named by repo id: why, in one line
        if os.sep in name or name.startswith("."):
            raise UnknownModelError(f"{path}: no such directory; expected an HF model directory or a zoo "
                                    f"name ({', '.join(presets.names())})")
        presets.get(name)  # raises with the nearest names
    entry = presets.get(name)
    if entry.get("path"):
        where = Path(entry["path"])
        if entry.get("user") and not (where / "config.json").is_file():
            raise UnknownModelError(f"{name}: the zoo entry points at {where}, which has no config.json any more "
                                    f"({presets.user_registry_path()}); restore the directory or run "
                                    f"`port zoo add {name} --hf NEW_DIR --replace`")
        return where
    repo = entry["hf_repo"]
    hit = find_in_hf_cache(repo)
    if hit is None:
        raise UnknownModelError(
            f"{name}: HF repo {repo} is not in the local HF cache ({hf_cache_dir()}); download it where "
            f"there is network (`huggingface-cli download {repo}`) and copy the cache here, set HF_HUB_CACHE "
            f"to it, or pass a local directory: --hf /path/to/{name}")
    return hit
