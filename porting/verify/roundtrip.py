"""Checks that a MindSpore checkpoint is a faithful conversion of its HF source.

``verify_checkpoint(hf_dir, ms_dir)`` returns one row per check and raises for none of them (the caller
turns a failed row into a non-zero exit):

1. ``ms-config``: the MindSpore directory's config.json describes the same model as the source's;
2. ``ms-coverage``: the MindSpore checkpoint holds exactly the tensors the config implies, shapes and
   dtypes readable (the checks ``port convert`` runs before writing);
3. ``ms-manifest``: the manifest beside it names the source files with their current sizes, and their
   sha256 where it was taken from the HF cache rather than computed (every one with ``rehash_source``);
   every tensor record's sha256, file, dtype and shape equal what is stored now; the recorded name map is
   the converter's and every record follows it. The row's detail names the claim that failed;
4. ``ms-tensors``: every tensor equals its source through the name map: bitwise where no cast was asked,
   bitwise equal to the source cast to the stored dtype otherwise;
5. ``roundtrip``: converting back MindSpore -> HF (into a temporary directory) gives the source's file
   names, tensor names and order per file, dtypes, shapes and bytes, and the same index.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from converters import convert, dtypes, names
from converters.sources import (
    MANIFEST,
    Source,
    TensorReader,
    equal_bytes,
    files_equal,
    open_hf,
    open_ms,
)
from model_zoo.config import LlamaConfig
from model_zoo.errors import CheckpointError, PortingError
from model_zoo.files import read_json_object
from porting.verify.check import Check

_SHOW = 5


def _row(name: str, passed: bool, detail: str) -> Check:
    """A claim's row: ``detail`` is one line naming what failed (or what was proven, with its counts)."""
    return Check.claim(name, passed, detail)


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    """A check that hits bad input fails as a row with the error's one line, never as an exception."""
    try:
        return fn()
    except PortingError as e:
        return _row(name, False, str(e))
    except OSError as e:
        return _row(name, False, f"{e.filename or ''}: {e.strerror or e}")


def _check_config(hf_dir: Path, ms_dir: Path) -> Check:
    a, b = LlamaConfig.from_hf(hf_dir), LlamaConfig.from_hf(ms_dir)
    diff = sorted(k for k in a.__dataclass_fields__ if getattr(a, k) != getattr(b, k))
    if diff:
        return _row("ms-config", False, "config.json differs in " + ", ".join(
            f"{k} ({getattr(a, k)!r} vs {getattr(b, k)!r})" for k in diff[:_SHOW]))
    return _row("ms-config", True, f"same {a.model_type} config ({a.num_parameters():,} parameters)")


def _check_coverage(ms_dir: Path) -> Check:
    plan = convert.build_plan(ms_dir, convert.MS_TO_HF)
    n = sum(len(pf.tensors) for pf in plan.files)
    skipped = sum(len(pf.skipped) for pf in plan.files)
    return _row("ms-coverage", True, f"{n} tensors, all expected, none unexpected, shapes match config.json"
                + (f" ({skipped} training-state entries ignored)" if skipped else ""))


# Source digests port convert did not compute itself: taken from what the HF download tooling recorded.
TAKEN_DIGESTS = ("hf-cache-blob", "hf-local-dir-metadata")


def _digest_mismatches(hf: Source, files: list[dict], rehash: bool) -> tuple[int, list[str]]:
    """Recompute the recorded sha256 of the source files that need it (those taken from the HF cache, or
    all with ``rehash``), files side by side on worker threads; (how many recomputed, mismatches)."""
    import concurrent.futures as cf

    from model_zoo.files import sha256_file

    paths = {f.name: f.path for f in hf.files}
    todo = [f for f in files if f.get("sha256") and (rehash or f.get("sha256_source") in TAKEN_DIGESTS)]
    with cf.ThreadPoolExecutor(2) as pool:
        actual = list(pool.map(lambda f: sha256_file(paths[f["name"]]), todo))
    bad = [f"{paths[f['name']]}: sha256 {got[:12]}..., recorded {f['sha256'][:12]}... "
           f"({f.get('sha256_source') or 'computed'})" for f, got in zip(todo, actual) if got != f["sha256"]]
    return len(todo), bad


def _manifest(ms_dir: Path) -> dict:
    """The manifest beside a conversion (one-line CheckpointError when missing, unreadable or not JSON)."""
    path = ms_dir / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; port convert writes it beside every output")
    return read_json_object(path, what="port manifest", error=CheckpointError)


def _check_manifest(hf: Source, ms_dir: Path, rehash: bool = False) -> Check:
    path = ms_dir / MANIFEST
    manifest = _manifest(ms_dir)
    try:
        files = manifest["source"]["files"]
        recorded = {f["name"]: f["bytes"] for f in files}
    except (KeyError, TypeError) as e:
        return _row("ms-manifest", False, f"{path}: source.files: unreadable ({type(e).__name__}: {e}); "
                    "expected the list port convert writes")
    malformed = [f["name"] for f in files if f.get("sha256") is not None and not _is_sha256(f["sha256"])]
    if malformed:
        return _row("ms-manifest", False, f"{path}: source.files: sha256 of {malformed[:_SHOW]} is not a "
                    "64-digit hex digest")
    actual = {f.name: f.path.stat().st_size for f in hf.files}
    if recorded != actual:
        diff = sorted(set(recorded.items()) ^ set(actual.items()))
        return _row("ms-manifest", False, f"{path}: source files recorded differ from {hf.dir}: "
                    f"{diff[:_SHOW]}")
    checked, bad = _digest_mismatches(hf, files, rehash)
    if bad:
        return _row("ms-manifest", False, f"{len(bad)} source file(s) do not match the sha256 recorded in {path}: "
                    + "; ".join(bad[:_SHOW]))
    return _row("ms-manifest", True, f"{len(actual)} source file(s) recorded with matching sizes"
                + (f", {checked} sha256 recomputed and equal" if checked else ""))


def _is_sha256(v: object) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _check_digests(ms: Source, manifest: dict, path: Path) -> Check:
    """Every tensor's sha256 recorded in the manifest equals the sha256 of the bytes stored now, each record
    names the file, dtype and shape the tensor has, and every stored tensor has a record."""
    import hashlib

    records = manifest.get("tensors")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        return _row("tensor digests", False, f"{path}: tensors: expected a list of tensor records")
    bad: list[str] = []
    with TensorReader(ms) as b:
        by_name = {r.get("name"): r for r in records}
        missing = sorted(n for n in b.where if n not in by_name)
        unknown = sorted(str(n) for n in by_name if n not in b.where)
        if missing or unknown:
            return _row("tensor digests", False, f"{path}: tensors: records do not cover the checkpoint (no record for "
                        f"{missing[:_SHOW]}, records of absent tensors {unknown[:_SHOW]})")
        for name in sorted(b.where):
            r, info = by_name[name], b.info(name)
            claimed = (r.get("file"), r.get("dtype"), r.get("shape"))
            actual = (b.file_of(name).name, info.dtype, list(info.shape))
            if claimed != actual:
                bad.append(f"{name}: recorded file/dtype/shape {claimed}, stored {actual}")
                continue
            h = hashlib.sha256()
            for chunk in b.chunks(name):
                h.update(chunk)
            if h.hexdigest() != r.get("sha256"):
                bad.append(f"{name}: sha256 {h.hexdigest()[:12]}..., recorded {str(r.get('sha256'))[:12]}...")
    if bad:
        return _row("tensor digests", False, f"{len(bad)} of {len(records)} tensor(s) do not match their record in "
                    f"{path}: " + "; ".join(bad[:_SHOW]))
    return _row("tensor digests", True, f"{len(records)} tensor sha256 digests recorded and equal")


def _check_name_map(manifest: dict, cfg: LlamaConfig, path: Path) -> Check:
    """The manifest's name map is the converter's map for this model type, and every tensor record maps its
    source name through it."""
    table = names.NAME_MAPS[cfg.model_type]
    if manifest.get("model_type") != cfg.model_type:
        return _row("name map", False, f"{path}: model_type {manifest.get('model_type')!r}, the source's "
                    f"config.json says {cfg.model_type!r}")
    if manifest.get("name_map") != table:
        return _row("name map", False, f"{path}: name_map differs from the {cfg.model_type} map port convert "
                    "uses; the manifest was edited or written by another tool")
    records = manifest.get("tensors") if isinstance(manifest.get("tensors"), list) else []
    bad = [f"{r.get('source_name')!r} -> {r.get('name')!r}" for r in records
           if not isinstance(r, dict) or not isinstance(r.get("source_name"), str)
           or names.map_name(r["source_name"], table) != r.get("name")]
    if bad:
        return _row("name map", False, f"{len(bad)} tensor record(s) in {path} do not follow the name map: "
                    + "; ".join(bad[:_SHOW]))
    return _row("name map", True, f"{len(records)} records follow the {cfg.model_type} name map "
                f"({len(table)} patterns)")


def _check_claims(hf: Source, ms_dir: Path, cfg: LlamaConfig, rehash: bool) -> Check:
    """Every claim of the manifest, in one ``ms-manifest`` row whose detail names the claim that failed:
    the source files (sizes, sha256), every tensor record (file, dtype, shape, sha256), the name map."""
    path = ms_dir / MANIFEST
    rows = [_check_manifest(hf, ms_dir, rehash)]
    if rows[-1].passed:
        rows.append(_check_digests(open_ms(ms_dir), _manifest(ms_dir), path))
    if rows[-1].passed:
        rows.append(_check_name_map(_manifest(ms_dir), cfg, path))
    last = rows[-1]
    if not last.passed:
        claim = CLAIMS[len(rows) - 1]
        return _row("ms-manifest", False, f"claim '{claim}' failed: {last.detail}")
    return _row("ms-manifest", True, "; ".join(r.detail for r in rows))


CLAIMS = ("source files", "tensor digests", "name map")


def _compare_tensor(a: TensorReader, a_name: str, b: TensorReader, b_name: str) -> str | None:
    """None when b's tensor equals a's (cast to b's dtype if they differ), else why not."""
    ta, tb = a.info(a_name), b.info(b_name)
    if ta.shape != tb.shape:
        return f"shape {list(ta.shape)} vs {list(tb.shape)}"
    if tb.dtype not in dtypes.CONVERTIBLE or ta.dtype not in dtypes.CONVERTIBLE:
        return f"dtype {ta.dtype} vs {tb.dtype}"
    for ca, cb in zip(a.chunks(a_name), b.chunks(b_name)):
        if not equal_bytes(dtypes.cast_bytes(ta.dtype, tb.dtype, ca), cb):
            return "bytes differ" if ta.dtype == tb.dtype else f"bytes differ from the {ta.dtype}->{tb.dtype} cast"
    return None


def _check_tensors(hf: Source, ms: Source, cfg: LlamaConfig) -> Check:
    table = names.NAME_MAPS[cfg.model_type]
    bad, casts, n, nbytes = [], set(), 0, 0
    with TensorReader(hf) as a, TensorReader(ms) as b:
        for name in hf.tensor_names():
            if names.is_ignored_hf(name):
                continue
            ms_name = names.map_name(name, table)
            if ms_name not in b.where:
                bad.append(f"{name} (no {ms_name})")
                continue
            why = _compare_tensor(a, name, b, ms_name)
            if why:
                bad.append(f"{name}: {why}")
            if a.info(name).dtype != b.info(ms_name).dtype:
                casts.add(f"{a.info(name).dtype}->{b.info(ms_name).dtype}")
            n += 1
            nbytes += a.info(name).nbytes
    how = "bitwise" if not casts else f"bitwise after the cast {', '.join(sorted(casts))}"
    detail = (f"{len(bad)} of {n} tensors differ from the source: " + "; ".join(sorted(bad)[:_SHOW]) if bad
              else f"{n} tensors equal the source ({how}), {nbytes:,} bytes compared")
    return Check.within("ms-tensors", "tensors_differing", len(bad), 0, detail)


def _layout(src: Source) -> dict[str, list[tuple[str, str, tuple[int, ...]]]]:
    return {f.name: [(t.name, t.dtype, t.shape) for t in f.tensors] for f in src.files}


def _index(src: Source) -> dict | None:
    if src.index_name is None:
        return None
    return read_json_object(src.dir / src.index_name, what="index", error=CheckpointError)


def _check_roundtrip(hf: Source, ms_dir: Path, work: Path) -> Check:
    source_dtypes = {t.dtype for f in hf.files for t in f.tensors}
    ms = open_ms(ms_dir)
    stored = {t.dtype for f in ms.files for t in f.tensors}
    lossy = [f"{s}->{d}" for s in source_dtypes for d in stored
             if dtypes.BY_CODE[d].itemsize < dtypes.BY_CODE[s].itemsize or {s, d} == {"F16", "BF16"}]
    if hf.kind != "safetensors":
        return _row("roundtrip", True, f"skipped: the source is {hf.kind}; the round trip writes safetensors, "
                    "so file layout cannot match")
    if lossy or len(source_dtypes) > 1:
        return _row("roundtrip", True, f"skipped: HF -> MS cast {', '.join(lossy) or 'mixed dtypes'} is not "
                    "reversible bit for bit")
    back = work / "hf"
    convert.ms_to_hf(ms_dir, back, dtype={v: k for k, v in dtypes.TARGETS.items() if v}[next(iter(source_dtypes))])
    rt = open_hf(back)
    problems = []
    if _layout(rt) != _layout(hf):
        files = sorted(set(_layout(rt)) ^ set(_layout(hf))) or sorted(
            k for k in _layout(hf) if _layout(hf)[k] != _layout(rt).get(k))
        problems.append(f"names/dtypes/shapes/shard layout differ in {files[:_SHOW]}")
    elif (_index(rt) or {}).get("weight_map") != (_index(hf) or {}).get("weight_map"):
        problems.append("index weight_map differs")
    else:
        with TensorReader(hf) as a, TensorReader(rt) as b:
            bad = [n for n in hf.tensor_names() if not names.is_ignored_hf(n) and _compare_tensor(a, n, b, n)]
        if bad:
            problems.append(f"{len(bad)} tensors differ: {', '.join(sorted(bad)[:_SHOW])}")
    if problems:
        return _row("roundtrip", False, "HF -> MS -> HF: " + "; ".join(problems))
    identical = sum(files_equal(f.path, back / f.name) for f in hf.files)
    return _row("roundtrip", True, f"HF -> MS -> HF: {len(hf.tensor_names())} tensors bitwise identical, same "
                f"names, dtypes and shard layout; {identical} of {len(hf.files)} file(s) byte-identical")


def verify_checkpoint(hf_dir: Path, ms_dir: Path, *, roundtrip: bool = True, rehash_source: bool = False) -> list[Check]:
    """One row per check (:class:`porting.verify.check.Check`) for a MindSpore checkpoint directory against its HF source.
    Source sha256 digests the converter took from the HF cache are recomputed; ``rehash_source``
    recomputes every recorded one."""
    hf_dir, ms_dir = Path(hf_dir), Path(ms_dir)
    rows = [_guard("ms-config", lambda: _check_config(hf_dir, ms_dir)),
            _guard("ms-coverage", lambda: _check_coverage(ms_dir))]
    try:
        hf = open_hf(hf_dir)
        cfg = LlamaConfig.from_hf(hf_dir)
    except PortingError as e:
        return rows + [_row("hf-source", False, str(e))]
    rows.append(_guard("ms-manifest", lambda: _check_claims(hf, ms_dir, cfg, rehash_source)))
    rows.append(_guard("ms-tensors", lambda: _check_tensors(hf, open_ms(ms_dir), cfg)))
    if roundtrip:
        rows.append(_guard("roundtrip", lambda: _roundtrip_in_tempdir(hf, ms_dir)))
    return rows


def _roundtrip_in_tempdir(hf: Source, ms_dir: Path) -> Check:
    """The round trip is written beside ms_dir (same disk, which has room for a copy) and removed after."""
    work = Path(tempfile.mkdtemp(prefix=".port-verify-", dir=ms_dir.absolute().parent))
    try:
        return _check_roundtrip(hf, ms_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
