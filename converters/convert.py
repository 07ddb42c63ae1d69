"""Streaming checkpoint conversion HF <-> MindSpore.

safetensors -> safetensors (HF -> MS and back, the usual case) goes through ``converters.shard_writer``:
the data of an output file is the source's bytes in the source's data order (cast only when a dtype
change is asked for), copied inside the kernel with ``copy_file_range`` while worker threads compute
the source files' sha256 and every output tensor's sha256 (read back from the output), all files and
all cores at once. ``.bin`` / ``.ckpt`` sources and ``.ckpt`` output go one tensor at a time through
torch / MindSpore. The output shard layout mirrors the source (one output file per source file,
tensors in the same order), which is what makes HF -> MS -> HF reproduce the original files. Before a
byte is written, the whole plan is checked: every source tensor used, every expected tensor present,
every shape equal to what config.json implies, every dtype convertible.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

from converters import atomic, dtypes, fused, names, shard_writer, tensor_writer
from converters.layout import ConversionLayout, Direction, PlannedFile
from converters.safetensors_io import OutTensor
from converters.sources import (
    MANIFEST,
    MS_INDEX,
    Source,
    known_sha256,
    open_hf,
    open_ms,
)
from model_zoo.config import LlamaConfig
from model_zoo.errors import CheckpointError
from model_zoo.files import plain_name, read_json_object, sha256_file

HF_INDEX = "model.safetensors.index.json"
# Files copied beside the weights so the output directory describes itself (config, tokenizer).
COMPANION_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer.model",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "LICENSE")
OUT_FORMATS = ("safetensors", "ckpt")
# The largest companion of a public Llama-family checkpoint is a tokenizer.json of a few tens of MB (Gemma 3's
# is ~33 MB, Llama 3's ~9 MB); a bigger one is not a tokenizer, and copying it would fill the output disk.
MAX_COMPANION_BYTES = 256 << 20


def _ms_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    table = names.NAME_MAPS[cfg.model_type]
    return {names.map_name(k, table): v for k, v in names.expected_hf_shapes(cfg).items()}


HF_TO_MS = Direction("hf->ms", lambda c: names.NAME_MAPS[c.model_type], names.is_ignored_hf,
                     names.expected_hf_shapes, {"format": "ms"}, open_hf, True)
MS_TO_HF = Direction("ms->hf", lambda c: {v: k for k, v in names.NAME_MAPS[c.model_type].items()},
                     names.is_ignored_ms, _ms_shapes, {"format": "pt"}, open_ms, False)


def _out_file_name(src_name: str, direction: Direction, out_format: str, restored: dict[str, str]) -> str:
    if src_name in restored:
        return restored[src_name]
    stem = src_name.rsplit(".", 1)[0]
    if stem.startswith("pytorch_model"):
        stem = "model" + stem[len("pytorch_model"):]
    return f"{stem}.{out_format}"


def _hf_layout_from_manifest(ms_dir: Path) -> dict:
    """The HF file names / metadata recorded when an MS directory was made from HF (empty if unknown).

    The names become output file names, so each must be a plain file name (never ``../x`` or an absolute
    path) and no two files may share one; anything else is refused with the key that is wrong. Names of
    other formats (a ``.bin`` source) are not restored: the output takes the derived ``*.safetensors`` name."""
    p = ms_dir / MANIFEST
    if not p.is_file():
        return {}
    layout = read_json_object(p, what="port manifest", error=CheckpointError).get("hf_layout") or {}
    if not isinstance(layout, dict) or not isinstance(layout.get("files", {}), dict):
        raise CheckpointError(f"{p}: hf_layout: expected an object with a files object; the manifest was edited "
                              "or is not one port convert wrote")
    seen: dict[str, str] = {}
    for ms_name, entry in layout.get("files", {}).items():
        key = f"hf_layout.files[{ms_name!r}]"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{p}: {key}: expected an object with name and metadata, found "
                                  f"{type(entry).__name__}")
        name = plain_name(entry.get("name"), where=str(p), key=f"{key}.name", error=CheckpointError)
        if not name.endswith(".safetensors"):  # a .bin source: the output takes the derived name
            continue
        if name in seen:
            raise CheckpointError(f"{p}: {key}.name: {name!r} is also the name of {seen[name]!r}; each output "
                                  "file needs its own name")
        seen[name] = ms_name
        meta = entry.get("metadata")
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                    for k, v in meta.items())):
            raise CheckpointError(f"{p}: {key}.metadata: expected an object of strings (safetensors metadata)")
    if layout.get("index_metadata") is not None and not isinstance(layout["index_metadata"], dict):
        raise CheckpointError(f"{p}: hf_layout.index_metadata: expected an object or null")
    return layout


def _check_choices(out_format: str, dtype: str) -> None:
    if out_format not in OUT_FORMATS:
        raise CheckpointError(f"--format {out_format!r}: expected one of {', '.join(OUT_FORMATS)}")
    if dtype not in dtypes.TARGETS:
        raise CheckpointError(f"--dtype {dtype!r}: expected one of {', '.join(dtypes.TARGETS)}")


def build_plan(src_dir: Path, direction: Direction, out_format: str = "safetensors", dtype: str = "keep",
               config: Path | None = None) -> ConversionLayout:
    """Read headers, check coverage / shapes / dtypes, and decide every output file and tensor.
    ``config`` is the config.json to use when ``src_dir`` has none (a MindSpore training checkpoint)."""
    _check_choices(out_format, dtype)
    config = Path(config) if config is not None else src_dir / "config.json"
    if config.is_dir():
        config = config / "config.json"
    cfg = LlamaConfig.from_hf(config)
    source = direction.opener(src_dir)
    layout = _hf_layout_from_manifest(src_dir) if direction is MS_TO_HF else {}
    return plan_source(source, direction, cfg, out_format, dtype, layout, config)


def plan_source(source: Source, direction: Direction, cfg: LlamaConfig, out_format: str = "safetensors",
                dtype: str = "keep", layout: dict | None = None, config: Path | None = None) -> ConversionLayout:
    """:func:`build_plan` of an opened ``source`` (also one that is not a file yet: converters/streamed.py);
    ``layout``: the HF file names an MS manifest recorded, ``config``: the config.json copied beside the output."""
    _check_choices(out_format, dtype)
    src_dir, layout = source.dir, layout or {}
    table = direction.table(cfg)
    shapes = direction.expected_shapes(cfg)
    target = dtypes.TARGETS[dtype]
    restored = {k: v["name"] for k, v in layout.get("files", {}).items() if v["name"].endswith(".safetensors")}
    seen: set[str] = set()
    unexpected: list[str] = []
    problems: list[CheckpointError] = []
    files = []
    for f in source.files:
        planned, skipped = [], []
        for t in f.tensors:
            if direction.ignored(t.name):
                skipped.append(t.name)
                continue
            out_name = names.map_name(t.name, table)
            if out_name is None or t.name not in shapes:
                unexpected.append(t.name)
                continue
            if t.name in seen:
                problems.append(CheckpointError(f"{f.path}: tensor {t.name}: also stored in another file; "
                                                "each tensor must appear once, fix the checkpoint's shards"))
            seen.add(t.name)
            if t.dtype not in dtypes.CONVERTIBLE:
                problems.append(CheckpointError(f"{f.path}: tensor {t.name}: unsupported dtype {t.dtype}; expected "
                                                f"one of {', '.join(dtypes.CONVERTIBLE)}"))
            elif t.shape != shapes[t.name]:
                problems.append(CheckpointError(
                    f"{f.path}: tensor {t.name}: shape {list(t.shape)} does not match config.json, which implies "
                    f"{list(shapes[t.name])}; the checkpoint and its config.json belong to different models"))
            planned.append((t, OutTensor(out_name, target or t.dtype, t.shape)))
        if direction is MS_TO_HF and cfg.model_type in fused.FUSED:   # the separate weights join into HF's fused ones
            planned = fused.fuse_planned(cfg, planned, OutTensor)
        meta = dict(layout.get("files", {}).get(f.name, {}).get("metadata") or direction.out_metadata)
        out_name = _out_file_name(f.name, direction, out_format, restored)
        if any(pf.out_name == out_name for pf in files):
            raise CheckpointError(f"{src_dir}: {f.name} and another file would both be written as {out_name}; "
                                  f"fix hf_layout in {MANIFEST}")
        files.append(PlannedFile(f, out_name, tuple(planned), tuple(skipped), meta,
                                 f.header_bytes if direction.align_headers else None))
    missing = sorted(set(shapes) - seen)
    if missing or unexpected:
        if direction is HF_TO_MS:   # name the tensors the file holds (Phi-3: qkv_proj), not the parts read from them
            missing, unexpected = fused.stored_names(cfg, missing), fused.stored_names(cfg, unexpected)
        raise names.coverage_error(str(src_dir), missing, unexpected)
    if problems:  # all of them in one line, the first ones in full
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointError(f"{len(problems)} problem(s): " + " | ".join(str(p) for p in problems[:3]) + more
                              if len(problems) > 1 else str(problems[0]))
    index_meta = layout.get("index_metadata") if direction is MS_TO_HF else source.index_metadata
    return ConversionLayout(direction, source, cfg, out_format, target, tuple(files), index_meta,
                config)


# ------------------------------------------------------------------------------------------ writing
def _file_jobs(plan: ConversionLayout, tmp: Path, out_dir: Path,
               hash_source: dict[str, bool]) -> list[shard_writer.FileJob]:
    jobs = []
    for pf in plan.files:
        header = pf.header
        spans, pos = [], len(header)
        for t, o in pf.tensors:
            spans.append(shard_writer.TensorSpan(o.name, t.begin, t.end, pos, t.dtype, o.dtype))
            pos += o.nbytes
        jobs.append(shard_writer.FileJob(pf.src.path, tmp / pf.out_name, out_dir / pf.out_name, header,
                                     pf.src.path.stat().st_size, tuple(spans), hash_source[pf.src.name]))
    return jobs


def _write_parallel(plan: ConversionLayout, tmp: Path, out_dir: Path, progress, hash_source: dict[str, bool]):
    """safetensors -> safetensors, every file at once on every core (converters.shard_writer)."""
    jobs = _file_jobs(plan, tmp, out_dir, hash_source)
    file_digests, tensor_digests, ways = shard_writer.copy_and_hash(jobs, progress)
    digests, records = {}, []
    for pf, fd, tds in zip(plan.files, file_digests, tensor_digests):
        digests[pf.src.name] = fd
        records.extend(tensor_writer.tensor_record(o, d, pf.out_name, t, pf.src.name) for (t, o), d in zip(pf.tensors, tds))
    return digests, records, ways


def _index_files(plan: ConversionLayout, records: list[dict]) -> dict[str, dict]:
    """The index file(s) to write: MindSpore's {param: file} map, or HF's model.safetensors.index.json."""
    weight_map = {r["name"]: r["file"] for r in records}
    if plan.direction is HF_TO_MS:
        return {MS_INDEX: dict(sorted(weight_map.items()))} if len(plan.files) > 1 else {}
    if len(plan.files) == 1:
        return {}
    meta = plan.index_metadata or {"total_size": sum(o.nbytes for pf in plan.files for _, o in pf.tensors)}
    return {HF_INDEX: {"metadata": meta, "weight_map": dict(sorted(weight_map.items()))}}


def _hf_layout(plan: ConversionLayout) -> dict | None:
    """Recorded in an MS manifest so MS -> HF can restore HF file names, metadata and index metadata."""
    if plan.direction is not HF_TO_MS:
        return None
    return {"index_name": plan.source.index_name, "index_metadata": plan.source.index_metadata,
            "files": {pf.out_name: {"name": pf.src.name, "metadata": pf.src.metadata} for pf in plan.files}}


def _companions(plan: ConversionLayout) -> list[Path]:
    """Files copied beside the weights; config.json is the one the plan was checked against."""
    d = plan.source.dir
    found = [d / n for n in COMPANION_FILES if n != "config.json" and (d / n).is_file()]
    out = ([plan.config_path] if plan.config_path else []) + found
    check_companions(out)
    return out


def check_companions(paths: list[Path]) -> None:
    """Refuse a file to copy beside the weights that is too big to be a config, tokenizer or licence."""
    for p in paths:
        size = p.stat().st_size
        if size > MAX_COMPANION_BYTES:
            raise CheckpointError(f"{p}: {size:,} bytes, more than the {MAX_COMPANION_BYTES:,} a file copied beside "
                                  "the weights may have (config, tokenizer, licence); replace it with the model's "
                                  "own file or remove it from the source directory")


def skipped_companions(src: Path) -> list[str]:
    """One note for each companion file present in ``src`` but not a regular file (a FIFO, socket, device or a
    folder): it is not copied, and never opened (a FIFO would block the copy), said instead of skipped silently."""
    out = []
    for n in COMPANION_FILES:
        try:
            mode = os.stat(src / n).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            what = "a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            out.append(f"{src / n}: {what}, not copied beside the weights (copy the model's own {n} there)")
    return out


def execute(plan: ConversionLayout, out_dir: Path, *, force: bool = False,
            progress: Callable[[int], None] | None = None, versions: dict | None = None,
            command: list[str] | None = None, hash_source: bool = False) -> dict:
    """Write ``plan`` to ``out_dir`` atomically; return the manifest (also written beside the weights).
    Every output tensor's sha256 is recorded (the one hashing pass). A source file's sha256 is recorded
    where it is free, from the HF cache / download metadata huggingface_hub keeps (``sha256_source``
    says which), and computed in the same pass as the copy, one more SHA-256 pass, only with
    ``hash_source`` (``port convert --source-hash``)."""
    # Resolved before any check: `x/../SRC` and symlinks name the directory they reach, so the overlap
    # check below compares like with like and nothing (not even x/) is created for a refused --out.
    companions = _companions(plan)
    out_dir = check_output(plan, out_dir, force, [plan.source.dir], companions)
    progress = progress or (lambda n: None)
    # digests the HF download tooling already recorded cost nothing: always used
    known = {pf.src.name: known_sha256(pf.src.path) for pf in plan.files}
    compute = {name: hash_source and k is None for name, k in known.items()}
    ways = None
    with atomic.staged_dir(out_dir, force) as tmp:
        digests: dict[str, str | None] = {}
        records: list[dict] = []
        gathered = any(isinstance(t, fused.FusedInfo) and not t.contiguous for pf in plan.files for t, _ in pf.tensors)
        if plan.source.kind == "safetensors" and plan.out_format == "safetensors" and not gathered:
            digests, records, ways = _write_parallel(plan, tmp, out_dir, progress, compute)
        else:
            for pf in plan.files:
                try:
                    if plan.out_format == "ckpt":
                        digest, recs = tensor_writer.write_ckpt(plan, pf, tmp / pf.out_name, progress, compute[pf.src.name])
                    else:
                        digest, recs = None, tensor_writer.write_loaded(plan, pf, tmp / pf.out_name, progress)
                except OSError as e:
                    raise OSError(e.errno, e.strerror, str(out_dir / pf.out_name)) from None
                if digest is None and compute[pf.src.name]:
                    digest = sha256_file(pf.src.path)
                digests[pf.src.name] = digest
                records.extend(recs)
        src_files = []
        for pf in plan.files:
            digest, how = (digests.get(pf.src.name), "computed") if known[pf.src.name] is None else known[pf.src.name]
            src_files.append(source_record(pf, pf.src.path.stat().st_size, digest, how))
        named = {"config.json" if p == plan.config_path else p.name: p for p in companions}
        manifest = finish(plan, out_dir, tmp, records, src_files, named, ways, command=command, versions=versions)
    return manifest


def source_record(pf: PlannedFile, size: int, digest: str | None, how: str) -> dict:
    """The manifest's record of one source file (its sha256 and how it is known, when it is)."""
    return {"name": pf.src.name, "bytes": size, "sha256": digest, "sha256_source": how if digest else None,
            "metadata": pf.src.metadata, "skipped_tensors": list(pf.skipped)}


def finish(plan: ConversionLayout, out_dir: Path, tmp: Path, records: list[dict], src_files: list[dict],
           companions: dict[str, Path | bytes], ways: dict | None, *, command: list[str] | None,
           versions: dict | None) -> dict:
    """After the weights: the index file(s), the companion files (``name``: a file to copy, or its bytes) and
    ``port_manifest.json`` into the staging directory ``tmp``; returns the manifest (one writer of it for
    every conversion, streamed or not: converters/streamed.py)."""
    for name, content in _index_files(plan, records).items():
        _write_output(out_dir, tmp / name, lambda t, c=content: t.write_text(json.dumps(c, indent=2) + "\n"))
    for name, src in companions.items():
        _write_output(out_dir, tmp / name, lambda t, src=src: t.write_bytes(src) if isinstance(src, bytes)
                      else shutil.copyfile(src, t))
    manifest = {
        "tool": "port convert", "direction": plan.direction.name,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or sys.argv,
        "source": {"dir": str(plan.source.dir.absolute()), "format": plan.source.kind,
                   "sha256_recorded": all(f["sha256"] for f in src_files),
                   "index": plan.source.index_name, "files": src_files},
        "output": {"format": plan.out_format, "dtype": {v: k for k, v in dtypes.TARGETS.items()}[plan.target_dtype],
                   "files": [pf.out_name for pf in plan.files],
                   "companion_files": sorted(companions),
                   "not_copied": skipped_companions(plan.source.dir),   # a FIFO tokenizer.json, said
                   # bytes copied inside the kernel vs written from user space (casts, other filesystems)
                   "bytes_written_by": ways},
        "model_type": plan.cfg.model_type,
        "name_map": plan.direction.table(plan.cfg),
        "fused": fused.manifest_entry(plan.cfg),   # how fused HF tensors split into the zoo's weights
        "tensors": records,
        "hf_layout": _hf_layout(plan),
        "versions": versions or {},
    }
    _write_output(out_dir, tmp / MANIFEST, lambda t: t.write_text(json.dumps(manifest, indent=1) + "\n"))
    return manifest


def check_output(plan: ConversionLayout, out_dir: Path, force: bool, inputs: list[Path],
                 companions: list[Path | bytes]) -> Path:
    """Every check on ``out_dir`` before a byte is written (the --out rule, with ``inputs`` protected; --force
    replaces only what port wrote; writable; room for the weights and ``companions``, files or their bytes);
    returns it resolved."""
    atomic.check_out(out_dir, inputs=inputs, force=force, ours=lambda d: True)   # a link is refused
    out_dir = Path(out_dir).resolve()
    check_replaceable(out_dir, force, [p for p in companions if isinstance(p, Path)])
    need = sum(pf.out_bytes for pf in plan.files) + sum(len(p) if isinstance(p, bytes) else p.stat().st_size
                                                        for p in companions)
    check_writable(out_dir)
    atomic.check_free_space(out_dir, need)
    return out_dir


def _write_output(out_dir: Path, tmp_file: Path, write: Callable[[Path], object]) -> None:
    """Run ``write(tmp_file)``; an OSError names the output file, never the source it was copied from (a
    full disk while copying generation_config.json is the destination's problem, not the source's)."""
    try:
        write(tmp_file)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(out_dir / tmp_file.name)) from None


def check_replaceable(dest: Path, force: bool, inputs: list[Path]) -> None:
    """--force replaces only what port wrote: a non-empty ``dest`` must hold a port manifest, and it may
    not be (or contain) any input file, such as a --config read from inside it."""
    for p in inputs:
        p = p.resolve()
        if dest == p.parent or dest in p.parents:
            raise CheckpointError(f"{dest}: holds the input {p}; choose an --out that does not contain an input")
    if force and dest.is_dir() and any(dest.iterdir()) and not (dest / MANIFEST).is_file():
        raise CheckpointError(f"{dest}: exists, is not empty and is not a `port convert` output (no {MANIFEST}); "
                              "--force replaces only directories port wrote. Remove it yourself or choose another "
                              "--out")


def check_writable(dest: Path) -> None:
    """Refuse early, with the reason, when ``dest`` cannot be created: its nearest existing ancestor is a
    file, or creating a directory there fails (read-only disk, permissions, /proc)."""
    probe = next(p for p in [dest, *dest.parents] if p.exists())
    if probe == dest:
        probe = dest.parent
    if not probe.is_dir():
        raise CheckpointError(f"{probe}: is a file, so --out {dest} cannot be created under it; choose another "
                              "--out")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".port-probe-", dir=probe))  # made here, removed here
    except OSError as e:
        raise CheckpointError(f"{probe}: cannot create the output directory there ({e.strerror}); choose an "
                              "--out on a writable disk") from None


def hf_to_ms(hf_dir: Path, out_dir: Path, *, out_format: str = "safetensors", dtype: str = "keep",
             force: bool = False, progress=None, versions: dict | None = None, command=None,
             hash_source: bool = False) -> dict:
    plan = build_plan(Path(hf_dir), HF_TO_MS, out_format, dtype)
    return execute(plan, out_dir, force=force, progress=progress, versions=versions, command=command,
                   hash_source=hash_source)


def ms_to_hf(ms_dir: Path, out_dir: Path, *, dtype: str = "keep", force: bool = False, progress=None,
             versions: dict | None = None, command=None, config: Path | None = None,
             hash_source: bool = False) -> dict:
    """MindSpore -> HF. ``config``: the HF config.json when ``ms_dir`` has none (training checkpoints);
    ``hash_source``: also record the source files' sha256 (as ``--source-hash``)."""
    plan = build_plan(Path(ms_dir), MS_TO_HF, "safetensors", dtype, config)
    return execute(plan, out_dir, force=force, progress=progress, versions=versions, command=command,
                   hash_source=hash_source)
