"""`port bisect`: hostile checkpoints, run directories and arguments are one line, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case


def _bisect(d: Path, ms: Path, *extra: str) -> list[str]:
    return ["bisect", "--hf", str(I.hf(d)), "--ms", str(ms), "--seq", "8", *extra]


def _edit_tensors(m: Path, fn) -> Path:
    from safetensors.numpy import load_file, save_file

    t = load_file(m / "model.safetensors")
    fn(t)
    save_file(t, m / "model.safetensors")
    return m


@case("missing 1 tensor(s)", "model.layers.2.feed_forward.w2.weight", dest=None, timeout=60)
def checkpoint_missing_a_tensor(d):
    return _bisect(d, _edit_tensors(I.ms(d), lambda t: t.pop("model.layers.2.feed_forward.w2.weight")))


@case("model.layers.1.attention.wq.weight has shape [32, 64]", "config.json implies [64, 64]", dest=None, timeout=60)
def checkpoint_tensor_of_the_wrong_shape(d):
    def cut(t):
        t["model.layers.1.attention.wq.weight"] = t["model.layers.1.attention.wq.weight"][:32].copy()
    return _bisect(d, _edit_tensors(I.ms(d), cut))


@case("a different model from the HF directory's", "hidden_size", dest=None, timeout=60)
def checkpoint_config_of_another_shape(d):
    return _bisect(d, I.edit_config(I.ms(d), hidden_size=128))


@case("a run directory without checkpoints", "checkpointing.every_steps", dest=None)
def run_directory_without_checkpoints(d):
    run = d / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "step", "step": 0}) + "\n")
    return _bisect(d, run)


@case("neither a `port convert` output", dest=None)
def ms_directory_of_something_else(d):
    (d / "junk").mkdir()
    (d / "junk" / "notes.txt").write_text("hello")
    return _bisect(d, d / "junk")


@case("--ms expects a directory", dest=None)
def ms_path_missing(d):
    return _bisect(d, d / "nope")


@case("token id 9999 is outside the vocabulary [0, 512)", dest=None, timeout=60)
def ids_outside_the_vocabulary(d):
    return _bisect(d, I.ms(d), "--ids", "1 2 9999")


@case("--ids", "expected token ids", dest=None, timeout=60)
def ids_not_numbers(d):
    return _bisect(d, I.ms(d), "--ids", "1 two 3")


@case("--dump-layer 9: expected 0 to 4", dest=None, timeout=60)
def dump_layer_out_of_range(d):
    (d / "dump").mkdir()
    return _bisect(d, I.ms(d), "--dump-layer", "9", "--dump-dir", str(d / "dump"))


@case("already exists; port does not overwrite it", dest=None, timeout=60)
def msprobe_mapping_over_an_existing_file(d):
    I.canary(d, "mapping.yaml")
    return ["bisect", "--hf", str(I.hf(d)), "--msprobe-mapping", str(d / "mapping.yaml")]


# -- `port report --bisect FILE`: the evidence file is read bounded and checked for its shape
def _report(d: Path, raw: str | bytes) -> list[str]:
    from tests.attacks.report.cases import run_dir

    p = d / "b.json"
    p.write_bytes(raw.encode() if isinstance(raw, str) else raw)
    return ["report", str(run_dir(d)), "--bisect", str(p), "--out", str(d / "out")]


@case("b.json", "expected the JSON of `port bisect --json`")
def report_bisect_file_of_another_shape(d):
    return _report(d, json.dumps({"rows": 3, "verdict": "x"}))


@case("b.json", "nests deeper")
def report_bisect_file_nested_100000_levels(d):
    return _report(d, '{"rows": ' + I.deep_json() + "}")


@case("b.json")
def report_bisect_file_not_utf8(d):
    return _report(d, I.NOT_UTF8)


@case("nope.json", "bisect report not found")
def report_bisect_file_missing(d):
    from tests.attacks.report.cases import run_dir

    return ["report", str(run_dir(d)), "--bisect", str(d / "nope.json"), "--out", str(d / "out")]


@case("--ids: 60,000 ids, more than the model's max_position_embeddings 512", dest=None, timeout=60)
def ids_60000_refused_against_max_position_embeddings(d):
    """Was killed for memory (a 60,000 x 60,000 attention) instead of refused."""
    return _bisect(d, I.ms(d), "--ids", " ".join(["1"] * 60_000))


@case("--ids", "expected token ids", dest=None)
def ids_past_int64(d):
    return _bisect(d, d / "nope", "--ids", "1 2 " + "9" * 30)
