"""Small builders the attack generators share: real inputs (the embedded stories260K checkpoint, its
`port convert` output, the tiny recipe) copied into the case directory, then damaged by the case."""

from __future__ import annotations

import functools
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import yaml

from tests.attacks.harness import EMBEDDED, SAMPLE_TEXT, TINY_RECIPE

DEEP = 100_000          # nesting levels of the "deep JSON" attacks
NOT_UTF8 = b"\xff\xfe\x00bad \xc3\x28 bytes\n"


def hf(d: Path, name: str = "src") -> Path:
    """A copy of the embedded stories260K HF checkpoint at d/name."""
    dst = d / name
    shutil.copytree(EMBEDDED, dst)
    return dst


@functools.lru_cache(maxsize=None)
def _converted() -> Path:
    from converters import convert

    root = Path(tempfile.mkdtemp(prefix="port-attacks-ms-"))
    convert.hf_to_ms(EMBEDDED, root / "ms")
    return root / "ms"


def ms(d: Path, name: str = "ms") -> Path:
    """A copy of a real `port convert --hf stories260k` output at d/name."""
    dst = d / name
    shutil.copytree(_converted(), dst)
    for p in dst.iterdir():
        os.chmod(p, 0o644)
    return dst


@functools.lru_cache(maxsize=None)
def _trained() -> Path:
    """A real run of the tiny recipe (2 steps, stories260K) whose last checkpoint is per-rank (format 2)."""
    from porting.train import train
    from porting.train import load_recipe

    root = Path(tempfile.mkdtemp(prefix="port-attacks-ckpt-"))
    train(load_recipe(recipe(root)), root / "out", echo=False)
    return root / "out" / "checkpoints" / "step_2"


def train_checkpoint(dst: Path) -> Path:
    """A copy of that run's ``step_2`` at ``dst`` (layout.json, rank_00000.safetensors, state.json)."""
    shutil.copytree(_trained(), dst)
    return dst


def manifest(msdir: Path) -> dict:
    return json.loads((msdir / "port_manifest.json").read_text())


def edit_manifest(msdir: Path, fn) -> None:
    m = manifest(msdir)
    fn(m)
    (msdir / "port_manifest.json").write_text(json.dumps(m))


def update_json(path: Path, **fields) -> None:
    """Set ``fields`` at the top level of the JSON object in ``path``."""
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def edit_config(model: Path, **fields) -> Path:
    update_json(model / "config.json", **fields)
    return model


def deep_json(levels: int = DEEP, inner: str = "1") -> str:
    return "[" * levels + inner + "]" * levels


def deep_object(levels: int = DEEP) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def canary(d: Path, name: str = "canary.safetensors") -> Path:
    p = d / name
    p.write_bytes(b"canary: port must never touch this file")
    return p


def big_sparse(p: Path, size: int) -> Path:
    with open(p, "wb") as f:
        f.truncate(size)
    return p


def raw_safetensors(p: Path, header: bytes | dict, body: bytes = b"", length: int | None = None) -> Path:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    p.write_bytes(struct.pack("<Q", len(h) if length is None else length) + h + body)
    return p


def recipe_dict(d: Path, data: Path | None = None) -> dict:
    """The tiny CPU recipe made absolute (model, data) and small, writing under d/out."""
    r = yaml.safe_load(TINY_RECIPE.read_text())
    r["model"]["source"] = str(EMBEDDED)
    r["data"]["path"] = str(data or SAMPLE_TEXT)
    r["data"]["max_seq_length"] = 64
    r["data"]["long_text"] = "truncate"
    r["batching"]["bucketing"]["enabled"] = False
    r["checkpointing"]["export_hf"] = False
    r["schedule"] = {"max_steps": 2, "warmup_steps": 0}
    r["output_dir"] = str(d / "out")
    return r


def recipe(d: Path, edit=None, *, data: Path | None = None, name: str = "recipe.yaml") -> Path:
    """d/recipe.yaml: the tiny recipe with ``edit(r)`` applied to its dict."""
    r = recipe_dict(d, data)
    if edit:
        edit(r)
    p = d / name
    p.write_text(yaml.safe_dump(r, sort_keys=False))
    return p


def recipe_text(d: Path, text: str | bytes, name: str = "recipe.yaml") -> Path:
    p = d / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def set_key(path: str, value):
    """An edit for :func:`recipe`: r[a][b] = value for path 'a.b'."""
    def edit(r: dict) -> None:
        node = r
        *parents, last = path.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[last] = value
    return edit


def alpaca_file(d: Path, rows: list, name: str = "data.jsonl") -> Path:
    p = d / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p
