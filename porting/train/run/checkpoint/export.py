"""HF export of a trained model: the final training checkpoint, converted by the converters.

The export is the same conversion `port convert --ms` does (``converters.convert.ms_to_hf``: the
name-map registry, the coverage and shape checks, the staged output directory and
``port_manifest.json`` with every tensor's sha256 and the source checkpoint's digest), so `port
verify` checks it like any other conversion. Its source is the run's last checkpoint (per-rank,
porting/train/run/checkpoint/format.py): its full weights are assembled tensor by tensor offline
(porting/train/run/checkpoint/merge.py, `port ckpt merge`'s path) into a staging directory the converter reads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from converters import atomic
from model_zoo.errors import CheckpointError
from porting.env import versions
from porting.train.run.checkpoint.record import require_layout

MS_WEIGHTS = "model.safetensors"   # the MindSpore-named full weights of a per-rank checkpoint
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link costs nothing (same filesystem); a copy where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _stage(out: Path) -> Path:
    """The staging directory of the converter's source, named so ``converters.atomic.remove_stale`` finds it
    once its process is gone (a ``kill -9`` mid-export leaves it; the next export to ``out`` removes it)."""
    atomic.remove_stale(out)
    stage = out.parent / f".{out.name}.port-tmp-source-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    return stage


def export_hf(checkpoint: str | Path, model_dir: str | Path, out_dir: str | Path, *,
              command: list[str] | None = None, force: bool = True, user_out: bool = False, log=None) -> Path:
    """Convert the training checkpoint directory ``checkpoint`` to an HF directory at ``out_dir``.

    ``model_dir`` is the HF directory the run started from: its config.json describes the architecture
    and its tokenizer files are carried over. ``out_dir`` is replaced (it is the run's own ``hf/``); with
    ``force`` False (`port ckpt merge`) a non-empty ``out_dir`` is refused. ``user_out`` (`port ckpt merge
    --out`): the converters' rule for every --out first, with the checkpoint and the model directory as
    inputs (a W that holds the run being merged is refused, --force or not)."""
    from converters.convert import MANIFEST  # deferred: the converter loads torch and MindSpore readers; export runs once, at the end

    ckpt, model_dir, out = Path(checkpoint), Path(model_dir), Path(out_dir)
    if user_out:
        atomic.check_out(out, inputs=[ckpt, model_dir], force=force, ours=lambda d: (d / MANIFEST).is_file(),
                         what="a `port convert` output")
    require_layout(ckpt)   # one line for a directory that is not a per-rank checkpoint, before anything is staged
    return _export_ranks(ckpt, model_dir, out, command, force, log)


def _export_ranks(ckpt: Path, model_dir: Path, out: Path, command: list[str] | None, force: bool,
                  log=None) -> Path:
    """A per-rank checkpoint (porting/train/run/checkpoint/format.py): its full weights written tensor by tensor
    into a staging directory (porting/train/run/checkpoint/merge.py), then `port convert --ms`'s conversion."""
    from converters.convert import ms_to_hf  # deferred: the converter loads torch and MindSpore readers; export runs once, at the end

    stage = _stage(out)
    try:
        stage.mkdir(parents=True)
        _ms_files(ckpt, model_dir, stage, False, log)
        ms_to_hf(stage, out, force=force, versions=versions(), command=command, hash_source=True)
    except OSError as e:
        raise CheckpointError(f"{e.filename or stage}: cannot write the HF export ({e.strerror}); the training "
                              "checkpoints are intact") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out


def _ms_files(ckpt: Path, model_dir: Path | None, into: Path, optimizer: bool, log) -> None:
    """What a MindSpore directory holds: the MindSpore-named full weights, config.json, the tokenizer files
    and, with ``optimizer``, the optimizer state (ckpt_merge.py ``write_optimizer``)."""
    from porting.train.run.checkpoint.merge import write_optimizer, write_weights  # deferred: the merge imports the checkpoint reader, only an export needs it

    cfg = write_weights(ckpt, into / MS_WEIGHTS, log)
    (into / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in TOKENIZER_FILES if model_dir is not None else ():
        if (model_dir / name).is_file():
            _link_or_copy(model_dir / name, into / name)
    if optimizer:
        write_optimizer(ckpt, into, log)


def export_after_exit(recipe, run_dir: Path, log=None, command: list[str] | None = None) -> Path | None:
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
    """`port ckpt merge`: the MindSpore directory ``ms_out`` (kept: MindSpore-named full weights that
    ``mindspore.load_checkpoint(..., format="safetensors")`` + ``load_param_into_net(strict_load=True)`` load
    into the zoo cell, config.json, tokenizer files, optionally the optimizer state) and/or the HF directory
    ``hf_out`` converted from the same weights (assembled once). Each output is staged and renamed whole."""
    from converters.atomic import staged_dir  # deferred: the converters' staging rule, one for every --out
    from converters.convert import ms_to_hf  # deferred: the converter loads torch and MindSpore readers

    done = []
    if ms_out is not None:
        with staged_dir(ms_out, force) as tmp:
            _ms_files(ckpt, model_dir, tmp, optimizer, log)
        done.append(ms_out)
        if hf_out is not None:   # the converter reads one weights file: the MindSpore directory less the optimizer
            stage = hf_out.parent / f".{hf_out.name}-source.port-tmp-{os.getpid()}"
            shutil.rmtree(stage, ignore_errors=True)
            try:
                stage.mkdir(parents=True)
                for f in ms_out.iterdir():
                    if f.is_file() and not f.name.startswith("optimizer."):
                        _link_or_copy(f, stage / f.name)
                ms_to_hf(stage, hf_out, force=force, versions=versions(), command=command, hash_source=True)
            except OSError as e:
                raise CheckpointError(f"{e.filename or stage}: cannot write the HF export ({e.strerror}); {ms_out} "
                                      "is written") from None
            finally:
                shutil.rmtree(stage, ignore_errors=True)
            done.append(hf_out)
        return done
    if hf_out is not None:
        done.append(_export_ranks(ckpt, model_dir if model_dir is not None else ckpt, hf_out, command, force, log))
    return done
