"""HF export of a trained model: the final training checkpoint, converted by the converters in one pass.

The export is the conversion `port convert --ms` makes (the name-map registry, the coverage and shape checks,
the fused Phi-3 layouts, the staged output directory and ``port_manifest.json`` with every tensor's sha256 and
the source's digest), so `port verify` checks it like any other conversion. Its source is the run's last
checkpoint (per-rank, porting/train/run/checkpoint/format.py): each weight is assembled whole from the rank
files (porting/train/run/checkpoint/merge.py ``Whole``, every chunk checked against its recorded sha256) and
streamed once through the name map into the HF file (converters/streamed.py); no MindSpore-named copy is
staged and read back. The source the manifest records is the MindSpore-named file ``port ckpt merge --ms``
writes (its sha256 is that file's), which ``merge`` writes in the same pass when both outputs are asked for.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from converters import atomic
from model_zoo.errors import CheckpointError, PortingError
from porting.env import versions
from porting.train.run.checkpoint.format import LAYOUT_FILE
from porting.train.run.checkpoint.record import read_record, require_layout

if TYPE_CHECKING:   # hints only: a merge and an export load no recipe schema (pydantic, 0.13 CPU-s)
    from porting.train.recipe.schema import Recipe

MS_WEIGHTS = "model.safetensors"   # the MindSpore-named full weights of a per-rank checkpoint
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link costs nothing (same filesystem); a copy where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _tokenizers(model_dir: Path | None) -> dict[str, Path]:
    return {n: model_dir / n for n in TOKENIZER_FILES if model_dir is not None and (model_dir / n).is_file()}


def _one_disk(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` (or their nearest existing ancestors) are on one filesystem."""
    dev = [os.stat(next(q for q in [p, *p.parents] if q.exists())).st_dev for p in (a, b)]
    return dev[0] == dev[1]


def _config_text(cfg: dict) -> bytes:
    return (json.dumps(cfg, indent=2) + "\n").encode()


def check_apart(hf_out: Path | None, ms_out: Path | None) -> None:
    """`--out` and `--ms` are two directories, neither inside the other (one would be written, then refused or
    replaced by the other); refused before anything is written."""
    if hf_out is None or ms_out is None:
        return
    a, b = Path(hf_out).resolve(), Path(ms_out).resolve()
    if a == b or a in b.parents or b in a.parents:
        raise CheckpointError(f"{hf_out}: --out and --ms {ms_out} name the same directory or one inside the other; "
                              "each output needs a directory of its own: choose two apart")


def export_hf(checkpoint: str | Path, model_dir: str | Path, out_dir: str | Path, *,
              command: list[str] | None = None, force: bool = True, user_out: bool = False, log=None) -> Path:
    """Convert the training checkpoint directory ``checkpoint`` to an HF directory at ``out_dir``.

    ``model_dir`` is the HF directory the run started from: its tokenizer files are carried over (config.json
    is the checkpoint's own record). ``out_dir`` is replaced (it is the run's own ``hf/``); with ``force``
    False (`port ckpt merge`) a non-empty ``out_dir`` is refused. ``user_out`` (`port ckpt merge --out`): the
    converters' rule for every --out first, with the checkpoint and the model directory as inputs (a W that
    holds the run being merged is refused, --force or not)."""
    from converters.convert import MANIFEST  # deferred: the converter loads its readers; export runs once, at the end

    ckpt, model_dir, out = Path(checkpoint), Path(model_dir), Path(out_dir)
    if user_out:
        atomic.check_out(out, inputs=[ckpt, model_dir], force=force, ours=lambda d: (d / MANIFEST).is_file(),
                         what="a `port convert` output")
    require_layout(ckpt)   # one line for a directory that is not a per-rank checkpoint, before anything is written
    stream_hf(ckpt, model_dir, out, command=command, force=force, log=log)
    return out


def stream_hf(ckpt: Path, model_dir: Path | None, out: Path, *, command: list[str] | None, force: bool, log=None,
              copy: Path | None = None) -> dict:
    """The HF directory ``out`` from the per-rank checkpoint ``ckpt`` in one pass (converters/streamed.py), with
    ``model_dir``'s tokenizer files; ``copy``: also the MindSpore-named weights file there. Returns the model's
    config.json (from the checkpoint's record)."""
    from converters import streamed  # deferred: the launcher imports this module; an export runs once, at the end
    from converters.convert import MS_TO_HF, plan_source  # deferred: as above
    from converters.safetensors_io import OutTensor  # deferred: as above
    from model_zoo.config import LlamaConfig  # deferred: as above
    from porting.train.run.checkpoint.merge import Whole, config_of  # deferred: the merge and the reader, only an export
    from porting.train.run.checkpoint.progress import Progress  # deferred: as above
    from porting.train.run.checkpoint.read import open_checkpoint  # deferred: as above

    src, ident = open_checkpoint(ckpt)
    try:
        cfg = config_of(ckpt, ident)
        try:
            model = LlamaConfig.from_hf(cfg)
        except PortingError as e:
            raise CheckpointError(f"{ckpt / LAYOUT_FILE}: identity.model_config: {e}") from None
        tensors = [OutTensor(p.name, p.dtype, p.shape) for p in src.layout.params]
        source, header = streamed.described(ckpt, MS_WEIGHTS, tensors, {"format": "ms"}, ckpt / LAYOUT_FILE)
        plan = plan_source(source, MS_TO_HF, model)
        if copy is not None:   # the HF file is as large again; converters.convert.check_output counts it alone
            size = len(header) + sum(t.nbytes for t in tensors)
            atomic.check_free_space(copy, size * (2 if _one_disk(copy, out) else 1))
        whole = Whole(src, "param", Progress(log, f"merge {ckpt.name}", lambda: src.files.bytes_read))
        streamed.write(plan, header, lambda t: whole(t.name), out, inputs=[ckpt], force=force, command=command,
                       companions={"config.json": _config_text(cfg), **_tokenizers(model_dir)},
                       versions=versions(), copy=copy)
        whole.bar.done()
    finally:
        src.files.close()
    return cfg


def export_after_exit(recipe: Recipe, run_dir: Path, log=None, command: list[str] | None = None) -> Path | None:
    """The HF export of a multi-worker run, made by the launcher once msrun's workers have exited (none is
    made inside the job: there rank 0 would assemble every tensor from every rank file while the other
    workers had gone, for minutes at 13B): ``port ckpt merge``'s path from the run's newest checkpoint
    into ``RUN/hf``. None when the recipe says ``checkpointing.export_hf: false`` or there is no checkpoint."""
    from porting.model_paths import resolve_hf  # deferred: resolving a zoo name reads the user registry
    from porting.train.run.checkpoint.save import latest  # deferred: the launcher imports this module lazily too

    if recipe.lora is not None:   # the adapter always, the merged base with export_hf (porting/train/run/lora.py)
        from porting.train.run.checkpoint.lora_export import export_final  # deferred: only a LoRA run reaches it

        last = latest(Path(run_dir) / "checkpoints")
        if last is not None:
            export_final(recipe, last[1], resolve_hf(recipe.model.source), Path(run_dir), log or (lambda s: None),
                         command)
        return Path(run_dir) / "hf" if last is not None and recipe.checkpointing.export_hf else None
    if not recipe.checkpointing.export_hf:
        return None
    last = latest(Path(run_dir) / "checkpoints")
    if last is None:
        return None
    final = last[1]
    if log is not None:
        log(f"HF export: merging {final} into {Path(run_dir) / 'hf'} now that the workers have exited")
    out = export_hf(final, resolve_hf(recipe.model.source), Path(run_dir) / "hf", command=command, log=log)
    if log is not None:
        log(f"HF export {out} (from {final}, with port_manifest.json)")
    return out


def merge(ckpt: Path, model_dir: Path | None, *, hf_out: Path | None, ms_out: Path | None, optimizer: bool = False,
          command: list[str] | None = None, force: bool = False, log=None) -> list[Path]:
    """`port ckpt merge`: the MindSpore directory ``ms_out`` (MindSpore-named full weights that
    ``mindspore.load_checkpoint(..., format="safetensors")`` + ``load_param_into_net(strict_load=True)`` load
    into the zoo cell, config.json, tokenizer files, optionally the optimizer state) and/or the HF directory
    ``hf_out``, both from one pass over the rank files. Each output is staged and renamed whole."""
    from porting.train.run.checkpoint.merge import config_of, write_optimizer, write_weights  # deferred: as in stream_hf

    check_apart(hf_out, ms_out)
    if ms_out is None:
        if hf_out is None:
            return []
        stream_hf(ckpt, model_dir if model_dir is not None else ckpt, hf_out, command=command, force=force, log=log)
        return [hf_out]
    with atomic.staged_dir(ms_out, force) as tmp:   # the small files and the optimizer first: the weights' pass
        cfg = config_of(ckpt, read_record(ckpt)[1])  # renames the HF directory into place, the MindSpore one next
        (tmp / "config.json").write_bytes(_config_text(cfg))
        for name, path in _tokenizers(model_dir).items():
            _link_or_copy(path, tmp / name)
        if optimizer:
            write_optimizer(ckpt, tmp, log)
        if hf_out is None:
            write_weights(ckpt, tmp / MS_WEIGHTS, log)
        else:
            stream_hf(ckpt, model_dir, hf_out, command=command, force=force, log=log, copy=tmp / MS_WEIGHTS)
    return [ms_out] + ([hf_out] if hf_out is not None else [])
