"""Recipe schema: strict keys, all errors at once with key paths, overrides, the shipped recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from model_zoo.errors import RecipeError
from porting.train.recipe.schema import apply_overrides, load_recipe, validate_recipe
from tests.train.conftest import ROOT, TINY, error_line
from tests.helpers import port

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


def numeric_fields(model=None, prefix: str = ""):
    """(key path, pydantic FieldInfo or item annotation metadata) of every number in the recipe schema."""
    import typing

    from pydantic import BaseModel

    from porting.train.recipe.schema import Recipe

    model = model or Recipe
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        union = typing.get_origin(ann) in (typing.Union, getattr(__import__("types"), "UnionType", None))
        inner = [a for a in typing.get_args(ann) if a is not type(None)][0] if union else ann
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from numeric_fields(inner, path + ".")
        elif inner in (int, float):
            yield path, info.metadata
        elif typing.get_origin(inner) in (tuple, list):
            for i, item in enumerate(typing.get_args(inner)):
                if typing.get_origin(item) is typing.Annotated:
                    yield f"{path}.{i}" if typing.get_origin(inner) is tuple else path, item.__metadata__[0].metadata


def test_every_number_has_a_finite_documented_range():
    """Issue 15 #4: `optimizer.lr: .inf` trained and exported NaN. Every int/float key is bounded on both
    sides, .inf/.nan are refused everywhere, and docs/promises.md lists each key with its range."""
    import math

    doc = (ROOT / "docs" / "promises.md").read_text()
    fields = list(numeric_fields())
    assert len(fields) > 25
    for path, meta in fields:
        lo = [m for m in meta if hasattr(m, "ge") or hasattr(m, "gt")]
        hi = [m for m in meta if hasattr(m, "le") or hasattr(m, "lt")]
        assert lo and hi, f"{path}: no lower or upper bound"
        bound = next(getattr(m, "le", None) if hasattr(m, "le") else m.lt for m in hi)
        assert math.isfinite(bound), path
        assert f"`{path.rsplit('.', 1)[0] if path.endswith(('.0', '.1')) else path}`" in doc, \
            f"{path} is missing from docs/promises.md"
    raw = {"model": {"source": "x"}, "data": {"path": "y"}}
    for key, bad in [("optimizer.lr", ".inf"), ("optimizer.betas", "[1.0, 0.9]"), ("optimizer.eps", ".inf"),
                     ("optimizer.weight_decay", ".inf"), ("optimizer.grad_clip", ".nan"),
                     ("precision.loss_scale.init", ".inf"), ("schedule.min_lr_ratio", ".nan")]:
        with pytest.raises(RecipeError, match=key.replace(".", r"\.")):
            validate_recipe(apply_overrides(raw, [f"{key}={bad}"]), check_files=False)


def test_yaml_bombs_and_deep_nesting_are_refused_fast(tmp_path):
    import time

    bomb = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    bomb += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    cases = {"bomb.yaml": ("\n".join(bomb), "aliases are expanded"),
             "deep.yaml": ("x: " + "[" * 100_000 + "]" * 100_000, "nesting deeper"),
             "many.yaml": ("a: &a 1\nb: [" + ",".join(["*a"] * 500) + "]", "more than 100 aliases"),
             "latin1.yaml": (b"model: caf\xe9\n", "not valid UTF-8"),
             "list.yaml": ("- a\n- b\n", "expected a YAML mapping")}
    for name, (text, needle) in cases.items():
        p = tmp_path / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        t0 = time.monotonic()
        with pytest.raises(RecipeError, match=needle):
            load_recipe(p, ["optimizer.lr=1e-4"])
        assert time.monotonic() - t0 < 2.0, name


def test_set_keys_and_templates_are_checked():
    raw = {"model": {"source": "x"}, "data": {"path": "y"}}
    for item in ("=3", ".lr=3", "optimizer..lr=3", "optimizer. lr=3"):
        with pytest.raises(RecipeError, match="empty part"):
            apply_overrides(raw, [item])
    for tmpl, needle in [("{nonexistent}", r"\{nonexistent\} is not a field"), ("{0}", r"\{0\} is not a field"),
                         ("{instruction", "brace"), ("{input}", r"\{input\} is not a field")]:
        with pytest.raises(RecipeError, match=needle):
            validate_recipe(dict(raw, data={"path": "y", "prompt_template": tmpl}), check_files=False)
    ok = validate_recipe(dict(raw, data={"path": "y", "prompt_template": "{{literal}} {instruction}"}),
                         check_files=False)
    assert ok.data.prompt_template.startswith("{{")


@pytest.mark.parametrize("compute,want", [("float16", "dynamic"), ("bfloat16", "none"), ("float32", "none")])
def test_loss_scale_auto_is_dynamic_for_float16_only(compute, want):
    """auto (the default) resolves as Megatron-LM builds its grad scaler: dynamic for fp16, none for bf16
    (megatron/core/optimizer/__init__.py); an explicit kind is kept as written."""
    r = load_recipe(ROOT / "recipes/tiny-cpu.yaml", ["cluster.device=ascend", f"precision.compute_dtype={compute}", f"precision.param_dtype={compute}"])
    assert r.precision.loss_scale.kind == want
    kept = load_recipe(ROOT / "recipes/tiny-cpu.yaml", ["cluster.device=ascend", f"precision.compute_dtype={compute}", "precision.loss_scale.kind=static"])
    assert kept.precision.loss_scale.kind == "static"


def _number_fields(model=None, prefix: str = ""):
    """(key path, annotation) of every field of the recipe schema that holds a number anywhere: an int or
    float, optional or not, alone or inside a list or tuple (every section walked)."""
    import typing

    from pydantic import BaseModel

    from porting.train.recipe.schema import Recipe

    def numbers_in(ann) -> bool:
        return ann in (int, float) or any(numbers_in(a) for a in typing.get_args(ann))

    for name, info in (model or Recipe).model_fields.items():
        ann = info.annotation
        inner = [a for a in typing.get_args(ann) if a is not type(None)] or [ann]
        if isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
            yield from _number_fields(inner[0], f"{prefix}{name}.")
        elif numbers_in(ann):
            yield f"{prefix}{name}", ann


def test_a_boolean_is_never_a_number():
    """Issue 27: `parallel.tensor_parallel: true` was taken as 1 (pydantic's lax mode). Every field that
    holds a number refuses true and false, alone or as an item of its list or tuple."""
    import typing

    raw = {"model": {"source": "x"}, "data": {"path": "y"}}
    fields = list(_number_fields())
    assert len(fields) >= 38 and ("parallel.tensor_parallel", int) in fields, fields
    for path, ann in fields:
        origin = typing.get_origin([a for a in typing.get_args(ann) if a is not type(None)][0]
                                   if typing.get_args(ann) and typing.get_origin(ann) is not tuple else ann)
        values = [[True], [0.9, False]] if origin in (list, tuple) else [True, False]
        if path == "nonfinite.skip_steps":   # a list of [first, last] windows: the boolean inside a window
            values = [[[True, 5]], [[2, 3], [4, False]]]
        for value in values:
            with pytest.raises(RecipeError, match=rf"{path.replace('.', '[.]')}: .*got a boolean"):
                validate_recipe(apply_overrides(raw, [f"{path}={str(value).lower()}"]), check_files=False)
    assert validate_recipe(apply_overrides(raw, ["parallel.tensor_parallel=1", "memory.recompute=true"]),
                           check_files=False).parallel.tensor_parallel == 1

def test_ascend_buckets_default_to_four_shapes_and_more_is_refused():
    """Issue 22: on Ascend every shape is a whole-model graph compiled on every rank before step 1, so
    bucketing defaults to 4 shapes there (16 on the CPU), more is refused in one line, packing is one shape."""
    import copy

    from porting.train.recipe.hardware import ASCEND_MAX_SHAPES

    raw = yaml.safe_load((ROOT / "recipes" / "7b-8card.yaml").read_text())
    assert validate_recipe(raw, check_files=False).batching.bucketing.max_shapes <= ASCEND_MAX_SHAPES   # the shipped recipe
    assert load_recipe(TINY).batching.bucketing.max_shapes == 4   # the CPU recipe keeps its own bucketing
    del raw["batching"]["bucketing"]["max_shapes"]
    assert validate_recipe(raw, check_files=False).batching.bucketing.max_shapes == ASCEND_MAX_SHAPES
    many = copy.deepcopy(raw)
    many["batching"]["bucketing"]["max_shapes"] = 16
    with pytest.raises(RecipeError, match=r"batching.bucketing.max_shapes: 16 on Ascend, expected at most 4"):
        validate_recipe(many, check_files=False)
    many["batching"]["packing"] = True
    assert validate_recipe(many, check_files=False).batching.packing
    cpu = {k: v for k, v in raw.items() if k != "cluster"}
    cpu["precision"] = {"param_dtype": "float32", "compute_dtype": "float32"}
    cpu["parallel"] = {**raw["parallel"], "tensor_parallel": 1}   # one CPU device
    assert validate_recipe(cpu, check_files=False).batching.bucketing.max_shapes == 16
