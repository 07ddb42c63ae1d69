"""`port train`: the recipe's non-finite step caps and data windows (porting/train/recipe/nonfinite.py): counts are
strict bounded integers (a YAML `true` is not 1), windows are ordered, bounded pairs of steps; the test hook that
injects non-finite steps, and the other fault hooks, refuse a value that does not parse in one line."""

from __future__ import annotations

from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case


def _recipe_case(name: str, key: str, value, *expect: str):
    def gen(d: Path) -> list[str]:
        return ["train", str(I.recipe(d, I.set_key(key, value)))]
    gen.__name__ = name
    globals()[name] = case(*expect)(gen)


for _name, _key, _value, _expect in [
    ("consecutive_skips_is_true", "nonfinite.max_consecutive_skips", True, "nonfinite.max_consecutive_skips"),
    ("total_skips_is_a_float", "nonfinite.max_total_skips", 5.0, "nonfinite.max_total_skips"),
    ("total_skips_1e12", "nonfinite.max_total_skips", 10 ** 12, "nonfinite.max_total_skips"),
    ("consecutive_skips_negative", "nonfinite.max_consecutive_skips", -1, "nonfinite.max_consecutive_skips"),
    ("window_reversed", "nonfinite.skip_steps", [[9, 3]], "first <= last"),
    ("window_step_zero", "nonfinite.skip_steps", [[0, 3]], "nonfinite.skip_steps.0.0"),
    ("window_of_three_steps", "nonfinite.skip_steps", [[1, 2, 3]], "nonfinite.skip_steps.0"),
    ("window_bool_step", "nonfinite.skip_steps", [[True, 3]], "expected a number, got a boolean"),
    ("windows_257", "nonfinite.skip_steps", [[i, i] for i in range(1, 258)], "nonfinite.skip_steps"),
    ("unknown_key", "nonfinite.max_skips", 3, "nonfinite.max_skips: unknown key"),
]:
    _recipe_case(_name, _key, _value, _expect)


# -- the fault-injection hooks (porting/train/run/faults.py, docs/test-hooks.md): a value that does not parse is one
# line before the run directory is made or a worker starts
def _hook_case(name: str, env: str, value: str):
    def gen(d: Path) -> list[str]:
        return ["train", str(I.recipe(d))]
    gen.__name__ = name
    globals()[name] = case(f"{env}=", "expected", "unset it for a real run", env={env: value})(gen)


for _name, _env, _value in [
    ("hook_nonfinite_shell", "PORT_TEST_NONFINITE", "3;rm -rf /"),
    ("hook_comm_delay_huge", "PORT_TEST_COMM_DELAY", "1:1e9"),
    ("hook_crash_rank_word", "PORT_TEST_CRASH_AT_EXIT", "rank1"),
    ("hook_bad_devices_range", "PORT_TEST_BAD_DEVICES", "0-7"),
    ("hook_refuse_static_parallel_word", "PORT_TEST_REFUSE_STATIC_PARALLEL", "yes"),
    ("hook_collective_trace_relative", "PORT_TEST_COLLECTIVE_TRACE", "../../etc/trace"),
    ("hook_plant_divergence_no_phase", "PORT_TEST_PLANT_DIVERGENCE", "3:model.layers.1:0.01"),
    ("hook_plant_divergence_huge", "PORT_TEST_PLANT_DIVERGENCE", "3:model.layers.1:forward:1e9"),
    ("hook_plant_divergence_shell", "PORT_TEST_PLANT_DIVERGENCE", "3:$(rm -rf ~):update:0.1"),
]:
    _hook_case(_name, _env, _value)


@case("PORT_TEST_PLANT_DIVERGENCE=", "expected", "unset it for a real run", dest=None,
      env={"PORT_TEST_PLANT_DIVERGENCE": "step3:model.norm.weight:update:0.1"})
def hook_plant_divergence_in_the_baseline(d):
    return ["baseline", "run", "--recipe", str(I.recipe(d)), "--out", str(d / "base.json")]


@case("PORT_TEST_PLANT_DIVERGENCE", "phase collective is not observable", "data-parallel port train", dest=None,
      env={"PORT_TEST_PLANT_DIVERGENCE": "2:model.norm.weight:collective:0.1"})
def hook_plant_a_collective_in_the_baseline(d):
    return ["baseline", "run", "--recipe", str(I.recipe(d)), "--set", "logging.fingerprint_every=1",
            "--out", str(d / "base.json")]
