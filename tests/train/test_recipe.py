"""Recipe schema: strict keys, all errors at once with key paths, overrides, the shipped recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from model_zoo.errors import RecipeError
from porting.train.recipe import apply_overrides, load_recipe, validate_recipe
from tests.train.conftest import ROOT, error_line, port

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def test_all_problems_in_one_error_with_key_paths(tmp_path):
    bad = {"model": {"source": "stories260k"},
           "data": {"path": str(tmp_path / "nope.jsonl"), "max_seq_lenght": 128},
           "batching": {"micro_batch_size": "four", "grad_accum_steps": 0},
           "optimizer": {"lr": -1},
           "surprise": 1}
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(bad))
    r = port("train", str(p))
    assert r.returncode == 2
    line = error_line(r)
    for needle in ("data.max_seq_lenght: unknown key", "batching.micro_batch_size", "batching.grad_accum_steps",
                   "optimizer.lr", "surprise: unknown key", "data.path: file not found"):
        assert needle in line, (needle, line)
    assert "Traceback" not in r.stderr


def test_missing_files_listed_together(tmp_path):
    raw = {"model": {"source": str(tmp_path / "no_model")}, "data": {"path": str(tmp_path / "no.json")}}
    with pytest.raises(RecipeError) as e:
        validate_recipe(raw, "r.yaml", tmp_path)
    msg = str(e.value)
    assert "data.path: file not found" in msg and "model.source: directory not found" in msg


def test_missing_section_and_bad_yaml(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("data: {path: x.txt}\n")
    with pytest.raises(RecipeError, match="model: required key is missing"):
        load_recipe(p, check_files=False)
    p.write_text("model: [unclosed\n")
    with pytest.raises(RecipeError, match="not valid YAML at line"):
        load_recipe(p)


def test_overrides_typed_and_checked():
    raw = {"model": {"source": "x"}, "data": {"path": "y"}}
    out = apply_overrides(raw, ["optimizer.lr=3e-5", "batching.bucketing.boundaries=[64, 128]", "memory.recompute=true"])
    r = validate_recipe(out, check_files=False)
    assert r.optimizer.lr == 3e-5 and r.batching.bucketing.boundaries == [64, 128] and r.memory.recompute is True
    with pytest.raises(RecipeError, match="expected key.path=value"):
        apply_overrides(raw, ["optimizer.lr"])
    with pytest.raises(RecipeError, match="optimizer.lrr: unknown key"):
        validate_recipe(apply_overrides(raw, ["optimizer.lrr=1"]), check_files=False)


def test_cpu_refuses_half_precision_and_dp_mismatch():
    raw = {"model": {"source": "x"}, "data": {"path": "y"}, "precision": {"param_dtype": "bfloat16"},
           "parallel": {"data_parallel": 4}, "cluster": {"devices_per_node": 2}}
    with pytest.raises(RecipeError) as e:
        validate_recipe(raw, check_files=False)
    assert "float32" in str(e.value)


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_shipped_recipes_validate_and_header_shows_command(path: Path):
    text = path.read_text()
    assert f"recipes/{path.name}" in "\n".join(l for l in text.splitlines() if l.startswith("#")), \
        "the header comment must show the command that runs this recipe"
    r = load_recipe(path, check_files=False)
    assert r.world_size >= 1


def test_help_ends_with_examples():
    r = port("train", "--help")
    assert r.returncode == 0 and "Examples:" in r.stdout and "port train recipes/7b-8card.yaml --dry-run" in r.stdout
