"""The one typed reader of imported config values (porting/intake/typed.py, config_keys.TYPES), walked over
every key port maps: each wrong type, non-finite or oversized number, boolean-for-number, date and set is one
IntakeError line naming the file and the key, what was found and what was expected."""

from __future__ import annotations

import datetime

import pytest

from porting.intake import IntakeError, config_keys as K
from porting.intake.recipe_import import Job, _short, comment, take
from porting.intake.typed import Flag, Num, Pair, Text

SOURCE_KEY = {}
for _key, _field in K.FIELDS.items():
    SOURCE_KEY.setdefault(_field, _key)


def test_every_field_has_one_type_and_one_target():
    assert set(K.TYPES) == set(K.FIELDS.values()) == set(K.FIELD_TARGET)


def _bad_values(spec) -> list:
    big = 10 ** 5000
    if isinstance(spec, (Num, Pair)):
        return [True, False, "abc", "1", [1, 2], float("inf"), float("nan"), 1e999, big, {"a": 1},
                datetime.date(2020, 1, 1), {1, 2}]
    if isinstance(spec, Flag):
        return [1, 0, "true", "yes", 1.0, [True], datetime.date(2020, 1, 1)]
    assert isinstance(spec, Text)
    return [1, 1.5, True, {"a": 1}, "x" * 5000, datetime.date(2020, 1, 1), {1, 2}] + ([] if spec.many else [["a"]])


@pytest.mark.parametrize("field", sorted(K.TYPES))
def test_every_field_refuses_every_wrong_value_in_one_line(field):
    key = SOURCE_KEY[field]
    for value in _bad_values(K.TYPES[field]):
        with pytest.raises(IntakeError) as e:
            take(Job(), "job/args\nx.json", key, value)
        msg = str(e.value)
        assert msg.startswith("job/args\\nx.json: ") and f": {key}: found " in msg and "expected" in msg, msg
        assert "\n" not in msg and len(msg) < 400, msg


def test_numbers_in_range_are_taken_and_whole_floats_are_whole():
    job = Job()
    take(job, "a.json", "num_processes", 8.0)
    take(job, "a.json", "learning_rate", 2e-5)
    take(job, "a.json", "bf16", True)
    take(job, "a.json", "adam_epsilon", None)   # unset in the file: no value, no error
    assert job.fields == {"source_gpus": 8, "lr": 2e-5, "bf16": True}
    assert isinstance(job.fields["source_gpus"], int)


def test_ranges_are_the_recipes():
    for key, value in (("learning_rate", 0), ("adam_beta2", 1.0), ("seed", -1), ("seed", 2 ** 32),
                       ("cutoff_len", 4), ("fp16.initial_scale_power", 33), ("zero_optimization.stage", 4)):
        with pytest.raises(IntakeError, match=key.replace(".", r"\.")):
            take(Job(), "a.json", key, value)


def test_values_recorded_in_the_mapping_are_plain_json():
    import json

    for v in (float("nan"), float("inf"), 10 ** 5000, datetime.date(2020, 1, 1), {1, 2}, b"\0" * 9, "x" * 500):
        json.dumps(_short(v), allow_nan=False)


def test_a_comment_is_one_line_whatever_the_value():
    text = comment("REFUSED: optim = sgd\nexecution: {x: 1}\r\x85\u2028nonfinite: 1")
    assert text.count("\n") == 1 and text.startswith("# ") and text.endswith("\n")
