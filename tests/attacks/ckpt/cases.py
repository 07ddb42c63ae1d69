"""`port ckpt` and `port train --resume` on damaged per-rank checkpoints (porting/train/run/checkpoint/format.py):
a truncated rank file, a layout record naming a file outside the directory, mismatched shapes, a
checkpoint of another model, an oversized or malformed record. Each is one error line; the checkpoint
is left as it was (outside ``dest`` for `port ckpt`, hashed before and after for `port train`)."""

from __future__ import annotations

import hashlib
import os
import json
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case

RANK0 = "rank_00000.safetensors"


def _record(ck: Path, fn) -> None:
    doc = json.loads((ck / "layout.json").read_text())
    fn(doc)
    (ck / "layout.json").write_text(json.dumps(doc))


def _merge(d: Path, damage) -> list[str]:
    ck = I.train_checkpoint(d / "ck" / "step_2")
    damage(ck)
    return ["ckpt", "merge", str(ck), "--out", str(d / "out")]


def _sums(ck: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(ck.iterdir())}


def _untouched(line: str, d: Path) -> None:
    """`port train --resume` left the checkpoint it refused exactly as it was."""
    ck = d / "out" / "checkpoints" / "step_2"
    assert _sums(ck) == json.loads((d / "sums.json").read_text()), f"{ck} changed"


def _resume(d: Path, damage, model: Path | None = None) -> list[str]:
    ck = I.train_checkpoint(d / "out" / "checkpoints" / "step_2")
    damage(ck)
    (d / "sums.json").write_text(json.dumps(_sums(ck)))
    edit = I.set_key("model.source", str(model)) if model else None
    return ["train", str(I.recipe(d, edit)), "--resume"]


def _truncate(ck: Path) -> None:
    p = ck / RANK0
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


@case("rank_00000.safetensors", "truncated", timeout=120)
def merge_truncated_rank_file(d):
    return _merge(d, _truncate)


@case("rank_00000.safetensors", "truncated", timeout=120, check=_untouched)
def resume_truncated_rank_file(d):
    return _resume(d, _truncate)


@case("layout.json", "expected rank_<5 digits>.safetensors", timeout=120)
def merge_record_names_a_file_outside(d):
    (d / "secret.safetensors").write_bytes(b"\0" * 64)   # a canary: it must be neither read nor changed
    return _merge(d, lambda ck: _record(ck, lambda doc: doc["files"].update(
        {"../../secret.safetensors": doc["files"].pop(RANK0)})))


@case("layout.json", "expected rank_<5 digits>.safetensors", timeout=120, check=_untouched)
def resume_record_names_an_absolute_path(d):
    return _resume(d, lambda ck: _record(ck, lambda doc: doc["files"].update(
        {"/etc/passwd": doc["files"].pop(RANK0)})))


def _shrink_first(doc: dict) -> None:
    p = doc["layout"]["params"][0]
    p["shape"] = [p["shape"][0] // 2] + p["shape"][1:]


@case("rank_00000.safetensors", "the layout record needs", timeout=120)
def merge_record_shape_mismatches_the_rank_file(d):
    """`--ms` reads the rank file with the record's shape (no HF plan before it)."""
    args = _merge(d, lambda ck: _record(ck, _shrink_first))
    return args[:3] + ["--ms", args[-1]]


@case("layout.json", "does not match config.json", timeout=120)
def merge_hf_record_shape_mismatches_its_model_config(d):
    """The HF export plans every tensor against the record's config before it reads a rank file."""
    return _merge(d, lambda ck: _record(ck, _shrink_first))


@case("is a checkpoint of another model", timeout=120, check=_untouched)
def resume_record_shape_mismatches_the_model(d):
    return _resume(d, lambda ck: _record(ck, _shrink_first))


@case("is a checkpoint of another model", timeout=120, check=_untouched)
def resume_checkpoint_of_another_model(d):
    """The run's model is stories260K with 4 of its 5 layers: a real, different model."""
    from safetensors.numpy import load_file, save_file

    model = I.hf(d, "model4")
    I.edit_config(model, num_hidden_layers=4)
    keep = {k: v for k, v in load_file(str(model / "model.safetensors")).items() if ".layers.4." not in k}
    save_file(keep, str(model / "model.safetensors"))
    return _resume(d, lambda ck: None, model)


@case("cannot continue exactly: recipe.seed (checkpoint 0, this run 7)", timeout=120, check=_untouched)
def resume_with_another_seed(d):
    args = _resume(d, lambda ck: None)
    I.recipe(d, I.set_key("seed", 7))
    return args


@case("layout.json", "key 'tp'", timeout=120)
def merge_record_world_not_a_multiple_of_tp(d):
    return _merge(d, lambda ck: _record(ck, lambda doc: doc["layout"].update(tp=10 ** 9)))


@case("layout.json", "more than", timeout=120)
def merge_record_of_70_mb(d):
    return _merge(d, lambda ck: (ck / "layout.json").write_text('{"x": "' + "a" * (70 << 20) + '"}'))


@case("layout.json", "nests deeper than 64 levels", timeout=120)
def merge_record_nested_100000(d):
    return _merge(d, lambda ck: (ck / "layout.json").write_text(I.deep_json()))


@case("layout.json", "names parameters outside", timeout=120)
def merge_record_bucket_names_no_parameter(d):
    def fn(doc):
        doc["layout"].update(zero=1, buckets=[{"params": [10 ** 6], "padded": 1}])
    return _merge(d, lambda ck: _record(ck, fn))


# -- --out of `port ckpt` under the converters' rule; bounded recipes
@case("overlaps the input", dest=None, timeout=120)
def merge_force_into_a_port_folder_that_holds_the_run(d):
    """W holds port_manifest.json (port wrote it) and the run being merged: `--force` deleted the whole run,
    the source checkpoint included."""
    w = d / "W"
    ck = I.train_checkpoint(w / "run" / "checkpoints" / "step_2")
    (w / "port_manifest.json").write_text("{}")
    return ["ckpt", "merge", str(ck), "--out", str(w), "--force"]


@case("overlaps the input", dest=None, timeout=120)
def merge_out_inside_the_checkpoint(d):
    ck = I.train_checkpoint(d / "ck" / "step_2")
    return ["ckpt", "merge", str(ck), "--out", str(ck / "hf")]


@case("is a symbolic link", dest=None, timeout=120)
def reshard_out_is_a_link(d):
    ck = I.train_checkpoint(d / "ck" / "step_2")
    (d / "elsewhere").mkdir()
    os.symlink(d / "elsewhere", d / "out")
    return ["ckpt", "reshard", str(ck), "--to", str(I.recipe(d)), "--out", str(d / "out")]


@case("recipe.yaml", "seed: line", "an integer of 5,000 digits", timeout=120)
def reshard_to_a_recipe_with_a_5000_digit_integer(d):
    ck = I.train_checkpoint(d / "ck" / "step_2")
    r = I.recipe(d)
    r.write_text(r.read_text().replace("seed: 0", "seed: " + "9" * 5000))
    return ["ckpt", "reshard", str(ck), "--to", str(r), "--out", str(d / "out")]


# ------------------------------------------------------------------ verified before use, bounded
def _flip_a_bit(ck: Path) -> None:
    """One bit of the last byte of rank_00000's data flipped; the size is kept."""
    p = ck / RANK0
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0x01
    p.write_bytes(bytes(raw))


def _symlink_elsewhere(ck: Path) -> None:
    """rank_00000 replaced by a link to a same-sized file outside the checkpoint (a copy with a flipped bit)."""
    p = ck / RANK0
    other = ck.parent.parent / "elsewhere.safetensors"
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0x01
    other.write_bytes(bytes(raw))
    p.unlink()
    p.symlink_to(other)


def _reshard(d: Path, damage) -> list[str]:
    ck = I.train_checkpoint(d / "ck" / "step_2")
    damage(ck)
    return ["ckpt", "reshard", str(ck), "--to", str(I.recipe(d)), "--out", str(d / "out")]


def _bisect_run(d: Path, damage) -> list[str]:
    """`port bisect --ms RUNDIR`: the run's newest checkpoint is the damaged one."""
    run = d / "run"
    ck = I.train_checkpoint(run / "checkpoints" / "step_2")
    (run / "metrics.jsonl").write_text("")
    damage(ck)
    return ["bisect", "--hf", str(I.hf(d)), "--ms", str(run), "--seq", "8"]


FLIPPED = ("rank_00000.safetensors", "do not match the sha256 layout.json records")


@case(*FLIPPED, timeout=120)
def merge_rank_file_with_one_flipped_bit(d):
    return _merge(d, _flip_a_bit)


@case(*FLIPPED, timeout=120)
def reshard_rank_file_with_one_flipped_bit(d):
    return _reshard(d, _flip_a_bit)


@case(*FLIPPED, timeout=120, check=_untouched)
def resume_rank_file_with_one_flipped_bit(d):
    return _resume(d, _flip_a_bit)


@case(*FLIPPED, dest=None, timeout=120)
def bisect_run_whose_rank_file_has_one_flipped_bit(d):
    return _bisect_run(d, _flip_a_bit)


@case("rank_00000.safetensors", "symbolic link", timeout=120)
def merge_rank_file_is_a_symlink_to_a_same_sized_file(d):
    return _merge(d, _symlink_elsewhere)


@case("rank_00000.safetensors", "symbolic link", timeout=120)
def reshard_rank_file_is_a_symlink_to_a_same_sized_file(d):
    return _reshard(d, _symlink_elsewhere)


@case("rank_00000.safetensors", "symbolic link", timeout=120, check=_untouched)
def resume_rank_file_is_a_symlink_to_a_same_sized_file(d):
    return _resume(d, _symlink_elsewhere)


def _set_first_shape(shape: list[int]):
    def fn(doc: dict) -> None:
        doc["layout"]["params"][0]["shape"] = shape
    return fn


@case("layout.json", "more than 1099511627776", timeout=120)
def merge_record_shape_of_2_64_elements(d):
    return _merge(d, lambda ck: _record(ck, _set_first_shape([1 << 32, 1 << 32])))


@case("layout.json", "is not {name, shape, axis, dtype}", timeout=120)
def merge_record_shape_of_2_63_in_one_dimension(d):
    return _merge(d, lambda ck: _record(ck, _set_first_shape([1 << 63])))


def _huge_world(zero: int):
    """The 138 KB record of issue 40: world 65,536 with 2,000 one-element parameters (ZeRO over every rank,
    or replicated over 65,536 tensor-parallel ranks), rank_00000 the only file listed."""
    def fn(doc: dict) -> None:
        n = 2000
        doc["layout"] = {"world": 65536, "tp": 1 if zero else 65536, "zero": zero, "masters": False,
                         "params": [{"name": f"p{i}", "shape": [1], "axis": None, "dtype": "F32"} for i in range(n)],
                         "buckets": [{"params": list(range(n)), "padded": 65536}] if zero else []}
        doc["files"] = {RANK0: doc["files"][RANK0]}
    return fn


@case("layout.json", "the layout needs", timeout=10)
def merge_record_world_65536_with_2000_parameters(d):
    return _merge(d, lambda ck: _record(ck, _huge_world(1)))


@case("layout.json", "pieces, more than", timeout=10)
def merge_record_tp_65536_with_2000_parameters(d):
    return _merge(d, lambda ck: _record(ck, _huge_world(0)))


@case("layout.json", "the layout needs", timeout=10)
def reshard_record_world_65536_with_2000_parameters(d):
    return _reshard(d, lambda ck: _record(ck, _huge_world(1)))


@case("layout.json", "the layout needs", timeout=120, check=_untouched)
def resume_record_world_65536_with_2000_parameters(d):
    return _resume(d, lambda ck: _record(ck, _huge_world(1)))


@case("layout.json", "the layout needs", dest=None, timeout=60)
def bisect_run_record_world_65536_with_2000_parameters(d):
    return _bisect_run(d, lambda ck: _record(ck, _huge_world(1)))


@case("layout.json", "is listed twice", timeout=120)
def merge_record_two_parameters_with_one_name(d):
    def fn(doc: dict) -> None:
        doc["layout"]["params"][1]["name"] = doc["layout"]["params"][0]["name"]
    return _merge(d, lambda ck: _record(ck, fn))


def _no_outside_tokenizer(out: str, d: Path) -> None:
    assert "outside the run" in out and "pass --model DIR" in out, out
    assert not (d / "out" / "tokenizer.json").exists(), "a file from outside the run was copied"


@case(refusal=False, timeout=120, check=_no_outside_tokenizer)
def merge_manifest_model_dir_outside_the_run(d):
    """RUN/manifest.json names a folder outside the run as the model: `port ckpt merge` without --model does
    not read it (it writes the weights and says where tokenizer files would come from)."""
    src = I.train_checkpoint(d / "trained")
    run = d / "run"
    ck = run / "checkpoints" / "step_2"
    ck.parent.mkdir(parents=True)
    src.rename(ck)
    outside = I.hf(d, "outside")
    (outside / "tokenizer.json").write_text('{"planted": true}')
    import shutil

    shutil.copyfile(I._trained().parent.parent / "manifest.json", run / "manifest.json")
    doc = json.loads((run / "manifest.json").read_text())
    doc["model"].update(source=str(outside), dir=str(outside))
    (run / "manifest.json").write_text(json.dumps(doc))
    return ["ckpt", "merge", str(ck), "--out", str(d / "out")]


@case("disk full while writing", subprocess=True, fsize=200_000, timeout=120)
def merge_ms_disk_fills_while_writing(d):
    return ["ckpt", "merge", str(I.train_checkpoint(d / "ck" / "step_2")), "--ms", str(d / "out")]


@case("disk full while writing", "nothing was written to", subprocess=True, fsize=200_000, timeout=120)
def merge_hf_disk_fills_while_writing(d):
    """The HF file is written in the one pass (no MindSpore-named copy staged first): the limit is met there."""
    return ["ckpt", "merge", str(I.train_checkpoint(d / "ck" / "step_2")), "--out", str(d / "out")]


def _neither_written(line: str, d: Path) -> None:
    assert not (d / "out" / "hf").exists() and not (d / "out" / "ms").exists(), "one output was left"
    assert not [p.name for p in (d / "out").iterdir()], "a temporary was left"


@case(*FLIPPED, timeout=120, check=_neither_written)
def merge_hf_and_ms_refused_in_their_one_pass(d):
    """Both from one pass, refused inside it (config.json and the tokenizer files of --ms already staged): neither
    is left (the MindSpore directory is renamed in only after the HF one)."""
    ck = I.train_checkpoint(d / "ck" / "step_2")
    _flip_a_bit(ck)
    (d / "out").mkdir()
    return ["ckpt", "merge", str(ck), "--out", str(d / "out" / "hf"), "--ms", str(d / "out" / "ms"),
            "--model", str(I.EMBEDDED)]


def _nothing_written(line: str, d: Path) -> None:
    assert not (d / "out").exists(), f"{d / 'out'} was written before the refusal"


@case("--out and --ms", "name the same directory or one inside the other", timeout=120, check=_nothing_written)
def merge_out_and_ms_one_folder(d):
    """Issue 51: one folder for both was written with the MindSpore directory, then refused for the HF one."""
    ck = I.train_checkpoint(d / "ck" / "step_2")
    return ["ckpt", "merge", str(ck), "--out", str(d / "out"), "--ms", str(d / "out")]


@case("--out and --ms", "name the same directory or one inside the other", timeout=120, check=_nothing_written)
def merge_ms_inside_out(d):
    ck = I.train_checkpoint(d / "ck" / "step_2")
    return ["ckpt", "merge", str(ck), "--out", str(d / "out"), "--ms", str(d / "out" / "ms")]


@case("cannot write the resharded checkpoint", subprocess=True, fsize=200_000, timeout=120)
def reshard_disk_fills_while_writing(d):
    return _reshard(d, lambda ck: None)


# ------------------------------------------------------------------ a directory in the retired single-file format
def _single_file(ck: Path) -> None:
    """What an earlier port build wrote: train_state.ckpt beside state.json, no layout record, no rank files.
    Its bytes are never opened (the refusal comes from the names), so a stand-in body is the honest input."""
    (ck / "layout.json").unlink()
    (ck / RANK0).unlink()
    (ck / "train_state.ckpt").write_bytes(b"\x0a\x04name" + b"\0" * 60)


@case("step_2", "holds train_state.ckpt and no layout.json", "expected a per-rank `port train` checkpoint",
      timeout=120, check=_untouched)
def resume_a_single_file_checkpoint(d):
    return _resume(d, _single_file)


@case("step_2", "holds train_state.ckpt and no layout.json", "expected a per-rank `port train` checkpoint",
      timeout=120)
def merge_a_single_file_checkpoint(d):
    return _merge(d, _single_file)
