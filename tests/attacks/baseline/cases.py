"""`port baseline --recipe`: the same recipe bounds as `port train`, before torch runs a step."""

from __future__ import annotations

from tests.attacks import inputs as I
from tests.attacks.harness import case


def _run(d, recipe, *extra):
    return ["baseline", "--recipe", str(recipe), "--out", str(d / "out"), *extra]


@case("recipe.yaml", "not valid UTF-8")
def recipe_not_utf8(d):
    return _run(d, I.recipe_text(d, I.NOT_UTF8))


@case("recipe.yaml", "aliases are expanded")
def recipe_alias_bomb(d):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return _run(d, I.recipe_text(d, "\n".join(lines) + "\n"))


@case("optimizer.lr")
def lr_inf(d):
    return _run(d, I.recipe(d, I.set_key("optimizer.lr", float("inf"))))


@case("optimizer.betas.0")
def beta_is_1(d):
    return _run(d, I.recipe(d, I.set_key("optimizer.betas", [1.0, 0.9])))


@case("expected a YAML mapping")
def recipe_list_with_set(d):
    return _run(d, I.recipe_text(d, "- 1\n- 2\n"), "--set", "optimizer.lr=1e-4")


@case("empty part")
def set_empty_key(d):
    return _run(d, I.recipe(d), "--set", "=3")


@case("{nonexistent} is not a field")
def template_nonexistent(d):
    return _run(d, I.recipe(d, I.set_key("data.prompt_template", "{nonexistent}")))


@case("num_hidden_layers: found 100,000,000")
def model_layers_1e8(d):
    src = I.edit_config(I.hf(d), num_hidden_layers=100_000_000)
    return _run(d, I.recipe(d, I.set_key("model.source", str(src))))


@case(dest=None)
def out_under_proc(d):
    return ["baseline", "--recipe", str(I.recipe(d)), "--out", "/proc/port-attack/base.json", "--steps", "1"]
