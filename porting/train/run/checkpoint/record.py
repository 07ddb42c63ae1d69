"""The layout record of a per-rank checkpoint (``layout.json``, porting/train/run/checkpoint/format.py), read and bounded.

:func:`read_record` checks every key's type and range, and bounds the work the record can ask for before
anything is allocated or looped over: the file's size (64 MiB), the world (2^16 ranks), the parameter
count (100,000), each parameter's elements (2^40) and the model's (2^42), the number of stored pieces
(2^20, counted by arithmetic: :func:`porting.train.run.checkpoint.format.count_ranges`), and the bytes the
layout puts in each rank file against the size the record gives it (so no read is larger than a file
on disk). Every file name is a plain ``rank_<r>.safetensors`` inside the checkpoint directory, and every
rank file carries the sha256 of each of its chunks (``chunks``; a record written before them carries the
whole file's ``sha256``), which the reader (porting/train/run/checkpoint/read.py) checks before using a byte.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

from model_zoo import files
from model_zoo.errors import CheckpointError
from porting.train.run.checkpoint.format import (CODES, FORMAT, LAYOUT_FILE, MAX_LAYOUT_BYTES, MAX_WORLD, RANK_FILE, Layout,
                                           ParamSpec, count_ranges, owned_ranges, owners)

MAX_PARAMS = 100_000
MAX_PARAM_ELEMENTS = 1 << 40     # 1.1 T: the largest tensor of a 13B model has 164 M
MAX_MODEL_ELEMENTS = 1 << 42     # 4.4 T parameters
MAX_PIECES = 1 << 20             # a 13B TP 8 x DP 8 ZeRO-1 checkpoint stores about 22,000
HEX64 = re.compile(r"^[0-9a-f]{64}$")
DAMAGED = "the checkpoint is damaged, resume from another one"


def _int(doc: dict, key: str, where: str, low: int, high: int) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise CheckpointError(f"{where}: key '{key}' is {str(v)[:40] if key in doc else 'missing'}, expected an "
                              f"integer in [{low}, {high}]; {DAMAGED}")
    return v


def _param(raw: Any, where: str) -> ParamSpec:
    ok = (isinstance(raw, dict) and isinstance(raw.get("name"), str) and 0 < len(raw["name"]) < 512
          and isinstance(raw.get("shape"), list) and len(raw["shape"]) <= 8
          and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < (1 << 40) for d in raw["shape"])
          and raw.get("dtype") in CODES
          and (raw.get("axis") is None or (isinstance(raw["axis"], int) and not isinstance(raw["axis"], bool)
                                           and 0 <= raw["axis"] < len(raw["shape"]))))
    if not ok:
        raise CheckpointError(f"{where}: entry {str(raw)[:80]} is not {{name, shape, axis, dtype}}; {DAMAGED}")
    spec = ParamSpec(raw["name"], tuple(raw["shape"]), raw["axis"], raw["dtype"])
    if spec.local_numel(1) > MAX_PARAM_ELEMENTS:
        raise CheckpointError(f"{where}: {spec.name} shape {list(spec.shape)} has {spec.local_numel(1)} elements, "
                              f"more than {MAX_PARAM_ELEMENTS} (2^40); {DAMAGED}")
    return spec


def _params(doc: dict, where: str, tp: int) -> tuple[ParamSpec, ...]:
    if not isinstance(doc.get("params"), list) or len(doc["params"]) > MAX_PARAMS:
        raise CheckpointError(f"{where}: key 'layout.params' is not a list of at most {MAX_PARAMS} entries; {DAMAGED}")
    params = tuple(_param(p, where) for p in doc["params"])
    seen: set[str] = set()
    for p in params:
        if p.name in seen:
            raise CheckpointError(f"{where}: parameter {p.name[:80]!r} is listed twice in 'layout.params'; {DAMAGED}")
        seen.add(p.name)
        if p.axis is not None and p.shape[p.axis] % tp:
            raise CheckpointError(f"{where}: {p.name} shape {list(p.shape)} does not split into tp {tp} on axis "
                                  f"{p.axis}; {DAMAGED}")
    total = sum(p.local_numel(1) for p in params)
    if total > MAX_MODEL_ELEMENTS:
        raise CheckpointError(f"{where}: the parameters hold {total} elements, more than {MAX_MODEL_ELEMENTS} (2^42); "
                              f"{DAMAGED}")
    return params


def _layout(doc: Any, where: str) -> Layout:
    if not isinstance(doc, dict):
        raise CheckpointError(f"{where}: key 'layout' is not an object; {DAMAGED}")
    world, tp = _int(doc, "world", where, 1, MAX_WORLD), _int(doc, "tp", where, 1, MAX_WORLD)
    zero = _int(doc, "zero", where, 0, 2)
    if world % tp or not isinstance(doc.get("masters"), bool) or not isinstance(doc.get("buckets"), list) \
            or len(doc["buckets"]) > MAX_PARAMS:
        raise CheckpointError(f"{where}: layout world {world}, tp {tp}, masters or buckets malformed; {DAMAGED}")
    params = _params(doc, where, tp)
    buckets, seen = [], []
    for b in doc["buckets"] if zero else []:
        idx = b.get("params") if isinstance(b, dict) else None
        if not isinstance(idx, list) or not idx or len(seen) + len(idx) > len(params) \
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(params) for i in idx):
            raise CheckpointError(f"{where}: bucket {str(b)[:80]} names parameters outside the list; {DAMAGED}")
        n = sum(params[i].local_numel(tp) for i in idx)
        padded = _int(b, "padded", where, n, n + world)
        if padded % (world // tp):
            raise CheckpointError(f"{where}: bucket padded {padded} is not a multiple of dp {world // tp}; {DAMAGED}")
        buckets.append((tuple(idx), padded))
        seen += idx
    if zero and sorted(seen) != list(range(len(params))):
        raise CheckpointError(f"{where}: the buckets do not hold every parameter exactly once; {DAMAGED}")
    layout = Layout(world, tp, zero, doc["masters"], params, tuple(buckets))
    pieces = count_ranges(layout) * tp * len(layout.kinds)
    if pieces > MAX_PIECES:
        raise CheckpointError(f"{where}: the layout stores {pieces} pieces, more than {MAX_PIECES}; {DAMAGED}")
    return layout


def _file_entry(name: Any, entry: Any, where: str) -> None:
    m = RANK_FILE.match(name) if isinstance(name, str) else None
    if m is None or not isinstance(entry, dict) or entry.get("rank") != int(m.group(1)):
        raise CheckpointError(f"{where}: key 'files' names {str(name)[:80]!r}, expected rank_<5 digits>"
                              ".safetensors (a file inside the checkpoint directory) with its rank; refused")
    size = _int(entry, "bytes", where, 8, 1 << 50)
    if "chunks" in entry:
        chunk = _int(entry, "chunk_bytes", where, 1 << 12, 1 << 30)
        digests = entry["chunks"]
        if not isinstance(digests, list) or len(digests) != -(-size // chunk) \
                or not all(isinstance(h, str) and HEX64.match(h) for h in digests):
            raise CheckpointError(f"{where}: {name}: key 'chunks' is not {-(-size // chunk)} sha256 digests (one per "
                                  f"{chunk}-byte chunk of its {size} bytes); {DAMAGED}")
    elif not (isinstance(entry.get("sha256"), str) and HEX64.match(entry["sha256"])):
        raise CheckpointError(f"{where}: {name}: neither 'chunks' nor 'sha256' is a sha256 digest; {DAMAGED}")


def _fits(layout: Layout, table: dict[str, dict], where: str) -> None:
    """Each rank file is at least as large as the pieces the layout puts in it (the bytes checked against the
    file on disk when it is opened), so no read the record asks for can be larger than a file."""
    data = [0] * layout.dp
    for d, i, a, b in owned_ranges(layout):
        data[d] += (b - a) * sum(CODES[layout.params[i].dtype] if k == "param" else 4 for k in layout.kinds)
    for name, entry in table.items():
        need = data[entry["rank"] // layout.tp]
        if need + 8 > entry["bytes"]:
            raise CheckpointError(f"{where}: the layout puts {need} bytes of pieces in {name}, whose size is "
                                  f"{entry['bytes']} bytes; {DAMAGED}")


EXPECTED = ("expected a per-rank `port train` checkpoint: layout.json, one rank_<5 digits>.safetensors per rank "
            "and state.json")
LISTED = 64   # entries of a directory named in the refusal's reasoning, at most (a directory may be huge)


def _holds(ckdir: Path) -> str:
    """What a directory without a layout record is, from the names of its first entries."""
    if not ckdir.is_dir():
        return "does not exist" if not ckdir.exists() else "is not a directory"
    with os.scandir(ckdir) as it:
        names = sorted(e.name for e in itertools.islice(it, LISTED))
    single = [n for n in names if n.endswith(".ckpt")]
    if single:   # train_state.ckpt / train_state.rank<r>.ckpt: MindSpore .ckpt files, never written by this port
        return (f"holds {single[0]} and no layout.json: a single-file MindSpore checkpoint (the format of earlier "
                "port builds), which this port does not read")
    return f"holds no layout.json ({', '.join(names[:4])[:160] or 'it is empty'})"


def require_layout(ckdir: Path) -> None:
    """Refuse in one line a directory that is not a per-rank checkpoint, naming what it is and what is expected."""
    path = ckdir / LAYOUT_FILE
    if path.is_file() or path.is_symlink():   # a link is refused by read_record, by name
        return
    raise CheckpointError(f"{ckdir}: {_holds(ckdir)}; {EXPECTED} (start a new run with --run-dir NEW_DIR, or "
                          "pass the step_N directory of a run this port wrote)")


def read_record(ckdir: Path) -> tuple[Layout, dict, dict[str, dict]]:
    """(layout, identity, files) of ``ckdir/layout.json``; every defect is one line naming the file and key."""
    require_layout(ckdir)
    path = ckdir / LAYOUT_FILE
    where = str(path)
    if path.is_symlink():
        raise CheckpointError(f"{where}: is a symbolic link; a checkpoint's files are its own, refused ({DAMAGED})")
    doc = files.read_json_object(path, what="checkpoint layout record", max_bytes=MAX_LAYOUT_BYTES,
                                 error=CheckpointError)
    if doc.get("format") != FORMAT:
        raise CheckpointError(f"{where}: key 'format' is {str(doc.get('format'))[:20]}, expected {FORMAT}; written "
                              "by another port version")
    layout = _layout(doc.get("layout"), where)
    ident, table = doc.get("identity"), doc.get("files")
    if not isinstance(ident, dict) or not isinstance(table, dict):
        raise CheckpointError(f"{where}: keys 'identity' and 'files' must be objects; {DAMAGED}")
    for name, entry in table.items():
        _file_entry(name, entry, where)
    want = {f"rank_{r:05d}.safetensors" for r in owners(layout)}
    if set(table) != want:
        raise CheckpointError(f"{where}: key 'files' lists {sorted(table)[:4]}, the layout needs {sorted(want)[:4]}"
                              f" ({len(table)} and {len(want)} files); {DAMAGED}")
    _fits(layout, table, where)
    return layout, ident, table


def trained_lora(ckdir: Path) -> bool:
    """Whether the checkpoint is a LoRA run's (its identity's recipe has a lora section): read from the record alone,
    so `port ckpt merge` of a full fine-tune does not load the recipe schema (pydantic: ~0.1 s of its start-up)."""
    ident = read_record(Path(ckdir))[1]
    rec = ident.get("recipe") if isinstance(ident.get("recipe"), dict) else {}
    return bool(rec.get("lora"))
