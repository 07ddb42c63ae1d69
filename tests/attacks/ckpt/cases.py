"""`port ckpt` and `port train --resume` on damaged per-rank checkpoints (porting/train/run/ckpt_shards.py):
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


# -- issue 40: --out of `port ckpt` under the converters' rule; bounded recipes
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
