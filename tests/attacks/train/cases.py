"""`port train`: recipes (numbers out of range, YAML bombs, --set tricks), data files (encoding, depth,
templates), run directories and resume state."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case


def _recipe_case(name: str, key: str, value, *expect: str):
    def gen(d: Path) -> list[str]:
        return ["train", str(I.recipe(d, I.set_key(key, value)))]
    gen.__name__ = name
    globals()[name] = case(*expect)(gen)


# -- every number has a finite range
INF, NAN = float("inf"), float("nan")
for _name, _key, _value, _expect in [
    ("lr_inf", "optimizer.lr", INF, "optimizer.lr"),
    ("lr_nan", "optimizer.lr", NAN, "optimizer.lr"),
    ("lr_negative", "optimizer.lr", -1e-3, "optimizer.lr"),
    ("lr_1e300", "optimizer.lr", 1e300, "optimizer.lr: Input should be less than or equal to"),
    ("beta1_is_1", "optimizer.betas", [1.0, 0.95], "optimizer.betas.0"),
    ("beta2_above_1", "optimizer.betas", [0.9, 1.5], "optimizer.betas.1"),
    ("beta_negative", "optimizer.betas", [-0.1, 0.95], "optimizer.betas.0"),
    ("beta_inf", "optimizer.betas", [0.9, INF], "optimizer.betas.1"),
    ("betas_three", "optimizer.betas", [0.9, 0.95, 0.99], "optimizer.betas"),
    ("eps_inf", "optimizer.eps", INF, "optimizer.eps"),
    ("eps_zero", "optimizer.eps", 0.0, "optimizer.eps"),
    ("weight_decay_inf", "optimizer.weight_decay", INF, "optimizer.weight_decay"),
    ("weight_decay_negative", "optimizer.weight_decay", -0.1, "optimizer.weight_decay"),
    ("grad_clip_inf", "optimizer.grad_clip", INF, "optimizer.grad_clip"),
    ("grad_clip_zero", "optimizer.grad_clip", 0, "optimizer.grad_clip"),
    ("max_steps_1e12", "schedule.max_steps", 10 ** 12, "schedule.max_steps"),
    ("epochs_zero", "schedule.epochs", 0, "schedule.epochs"),
    ("warmup_past_max_steps", "schedule.warmup_steps", 100, "schedule.warmup_steps"),
    ("min_lr_ratio_nan", "schedule.min_lr_ratio", NAN, "schedule.min_lr_ratio"),
    ("micro_batch_1e9", "batching.micro_batch_size", 10 ** 9, "batching.micro_batch_size"),
    ("grad_accum_zero", "batching.grad_accum_steps", 0, "batching.grad_accum_steps"),
    ("seq_length_1e9", "data.max_seq_length", 10 ** 9, "data.max_seq_length"),
    ("bucket_boundary_huge", "batching.bucketing.boundaries", [16, 10 ** 12], "batching.bucketing.boundaries"),
    ("pad_multiple_1e9", "batching.bucketing.pad_to_multiple_of", 10 ** 9, "pad_to_multiple_of"),
    ("loss_scale_inf", "precision.loss_scale.init", INF, "precision.loss_scale.init"),
    ("loss_scale_factor_1", "precision.loss_scale.factor", 1.0, "precision.loss_scale.factor"),
    ("hbm_nan", "cluster.device_hbm_gib", NAN, "cluster.device_hbm_gib"),
    ("devices_1e6", "cluster.devices_per_node", 10 ** 6, "cluster.devices_per_node"),
    ("port_below_1024", "cluster.master_port", 80, "cluster.master_port"),
    ("seed_negative", "seed", -1, "seed"),
    ("seed_2_64", "seed", 2 ** 64, "seed"),
    ("keep_last_zero", "checkpointing.keep_last", 0, "checkpointing.keep_last"),
    ("allreduce_size_inf", "parallel.comm_fusion", {"allreduce_mode": "size", "allreduce_config": INF},
     "allreduce_config"),
    ("lr_is_a_string", "optimizer.lr", "fast", "optimizer.lr"),
    ("unknown_key", "optimizer.lr_warmup", 3, "optimizer.lr_warmup: unknown key"),
    ("execution_eager", "execution", "eager", "execution"),          # issue 23: graph | pynative only
    ("execution_a_list", "execution", ["graph", "pynative"], "execution"),
    ("determinism_unknown_value", "determinism", "exact", "determinism: Input should be 'default' or 'bitwise'"),  # issue 49
    ("determinism_a_bool", "determinism", True, "determinism"),
    # -- prompt_template with {nonexistent} or {0}
    ("template_unknown_field", "data.prompt_template", "Q: {nonexistent}\nA:", "{nonexistent} is not a field"),
    ("template_positional", "data.prompt_template", "Q: {0}\nA:", "{0} is not a field"),
    ("template_empty_field", "data.prompt_template", "Q: {}\nA:", "{} is not a field"),
    ("template_attribute", "data.prompt_template", "{instruction.__class__}", "is not a field"),
    ("template_unmatched_brace", "data.prompt_template_with_input", "{instruction} {input", "brace"),
    ("template_input_in_plain_template", "data.prompt_template", "{instruction}{input}", "{input} is not a field"),
    ("template_too_long", "data.prompt_template", "{instruction}" + "x" * 70_000, "data.prompt_template"),
]:
    _recipe_case(_name, _key, _value, _expect)


# -- recipe files
@case("recipe.yaml", "not valid UTF-8")
def recipe_not_utf8(d):
    return ["train", str(I.recipe_text(d, I.NOT_UTF8))]


@case("recipe.yaml", "aliases are expanded")
def recipe_alias_bomb(d):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return ["train", str(I.recipe_text(d, "\n".join(lines) + "\nmodel: {source: x}\n"))]


@case("recipe.yaml", "more than 100 aliases")
def recipe_many_aliases(d):
    return ["train", str(I.recipe_text(d, "a: &a 1\nb: [" + ",".join(["*a"] * 500) + "]\n"))]


@case("recipe.yaml", "nesting deeper than")
def recipe_nested_100000_levels(d):
    return ["train", str(I.recipe_text(d, "x: " + I.deep_json()))]


@case("recipe.yaml", "nesting deeper than")
def recipe_block_nesting(d):
    return ["train", str(I.recipe_text(d, "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n"))]


@case("recipe.yaml", "more than")
def recipe_of_2_mb(d):
    return ["train", str(I.recipe_text(d, "# " + "x" * (2 << 20) + "\n"))]


@case("recipe.yaml", "not valid YAML")
def recipe_bad_yaml(d):
    return ["train", str(I.recipe_text(d, "model: [unclosed\n"))]


@case("recipe.yaml", "not valid YAML")
def recipe_python_object_tag(d):
    return ["train", str(I.recipe_text(d, "model: !!python/object/apply:os.system ['touch pwned']\n"))]


@case("recipe.yaml", "expected a YAML mapping", "got list")
def recipe_is_a_list_with_set(d):
    return ["train", str(I.recipe_text(d, "- a\n- b\n")), "--set", "optimizer.lr=1e-4"]


@case("recipe.yaml", "expected a YAML mapping", "got str")
def recipe_is_a_scalar(d):
    return ["train", str(I.recipe_text(d, "just text\n"))]


@case("recipe.yaml", "expected a regular file")
def recipe_is_a_fifo(d):
    os.mkfifo(d / "recipe.yaml")
    return ["train", str(d / "recipe.yaml")]


# -- --set
@case("--set '=3'", "empty part")
def set_empty_key(d):
    return ["train", str(I.recipe(d)), "--set", "=3"]


@case("empty part")
def set_leading_dot(d):
    return ["train", str(I.recipe(d)), "--set", ".lr=3"]


@case("empty part")
def set_double_dot(d):
    return ["train", str(I.recipe(d)), "--set", "optimizer..lr=3"]


@case("expected key.path=value")
def set_without_equals(d):
    return ["train", str(I.recipe(d)), "--set", "optimizer.lr"]


@case("optimizer.lr")
def set_lr_inf(d):
    return ["train", str(I.recipe(d)), "--set", "optimizer.lr=.inf"]


@case("is not a section")
def set_into_a_scalar(d):
    return ["train", str(I.recipe(d)), "--set", "seed.x=1"]


@case("optimizer")
def set_value_alias_bomb(d):
    bomb = "[" + ",".join(["&a [1,2,3]"] + ["*a"] * 200) + "]"
    return ["train", str(I.recipe(d)), "--set", f"optimizer={bomb}"]


# -- data files
def _data_case(name: str, write, *expect: str, fmt: str = "alpaca", fail: bool = True):
    def gen(d: Path) -> list[str]:
        p = write(d)
        edits = [I.set_key("data.format", fmt), I.set_key("data.on_bad_row", "fail" if fail else "skip")]
        return ["train", str(I.recipe(d, lambda r: [e(r) for e in edits], data=p))]
    gen.__name__ = name
    globals()[name] = case(*expect, timeout=60)(gen)


def _bytes(name, raw):
    def write(d: Path) -> Path:
        (d / name).write_bytes(raw)
        return d / name
    return write


ROW = {"instruction": "Say hi", "input": "", "output": "hi"}
_data_case("data_jsonl_not_utf8", _bytes("data.jsonl", I.NOT_UTF8), "data.jsonl", "not valid UTF-8")
_data_case("data_txt_not_utf8", _bytes("data.txt", b"story \xff\xfe one"), "data.txt", "not valid UTF-8", fmt="text")
_data_case("data_json_not_utf8", _bytes("data.json", b'[{"text": "\xe9"}]'), "data.json", "not valid UTF-8",
           fmt="text")
_data_case("data_row_nested_100000", _bytes("data.jsonl", (json.dumps(ROW) + "\n" + I.deep_object() + "\n").encode()),
           "row 2", "nested deeper than")
_data_case("data_row_nested_skip_all_bad", _bytes("data.jsonl", (I.deep_json() + "\n").encode()),
           "no usable example", fail=False)
_data_case("data_json_list_nested", _bytes("data.json", ("[" + I.deep_json() + "]").encode()), "data.json",
           "nested at most")
_data_case("data_json_invalid", _bytes("data.json", b'[{"text": '), "data.json", "not valid JSON", fmt="text")
_data_case("data_empty", _bytes("data.jsonl", b""), "no usable example", fail=False)
_data_case("data_rows_all_wrong_type", _bytes("data.jsonl", b'1\n"x"\nnull\n'), "no usable example", fail=False)
_data_case("data_row_output_not_string", _bytes("data.jsonl", json.dumps(dict(ROW, output=[1])).encode() + b"\n"),
           "row 1", "must be a string")
_data_case("data_chat_role_unknown", _bytes("data.jsonl", json.dumps(
    {"messages": [{"role": "root", "content": "x"}]}).encode() + b"\n"), "row 1", fmt="chat")


def _template_row_case(name: str, template: str, *expect: str):
    """A template that only fails on a row (the recipe check is bypassed by a hand-built recipe key set
    through --set, which validates the same way)."""
    def gen(d: Path) -> list[str]:
        p = I.alpaca_file(d, [ROW])
        r = I.recipe(d, I.set_key("data.format", "alpaca"), data=p)
        return ["train", str(r), "--set", f"data.prompt_template='{template}'"]
    gen.__name__ = name
    globals()[name] = case(*expect)(gen)


_template_row_case("set_template_nonexistent", "{nonexistent}", "{nonexistent} is not a field")
_template_row_case("set_template_index", "{instruction[0]}", "is not a field")


@case("data.path", timeout=30)
def data_is_a_fifo(d):
    os.mkfifo(d / "data.jsonl")
    return ["train", str(I.recipe(d, data=d / "data.jsonl"))]


@case("data.path")
def data_is_a_directory(d):
    (d / "data.jsonl").mkdir()
    return ["train", str(I.recipe(d, data=d / "data.jsonl"))]


@case("data.path: file not found")
def data_missing(d):
    return ["train", str(I.recipe(d, data=d / "nope.jsonl"))]


# -- the model the recipe names
def _model_case(name: str, mutate, *expect: str):
    def gen(d: Path) -> list[str]:
        src = I.hf(d)
        mutate(src)
        return ["train", str(I.recipe(d, I.set_key("model.source", str(src))))]
    gen.__name__ = name
    globals()[name] = case(*expect)(gen)


_model_case("model_config_not_utf8", lambda s: (s / "config.json").write_bytes(I.NOT_UTF8), "not valid UTF-8")
_model_case("model_config_layers_1e8", lambda s: I.edit_config(s, num_hidden_layers=100_000_000),
            "num_hidden_layers: found 100,000,000")
_model_case("model_config_layers_1e6", lambda s: I.edit_config(s, num_hidden_layers=1_000_000),
            "num_hidden_layers: found 1,000,000")
_model_case("model_config_nested", lambda s: (s / "config.json").write_text(I.deep_json()), "deeper than")
# a key port does not implement is refused by name, never ignored: the zoo's cell has no dropout
_model_case("model_config_attention_dropout", lambda s: I.edit_config(s, attention_dropout=0.1),
            "config.json asks for training dropout (attention_dropout=0.1)")


@case("model.source: directory not found")
def model_source_relative_missing(d):
    return ["train", str(I.recipe(d, I.set_key("model.source", "./no/such/model")))]


# -- run directories (the destination)
@case("exists and is not a directory", dest=None)
def output_dir_is_a_file(d):
    (d / "rd").write_text("a file")
    return ["train", str(I.recipe(d, I.set_key("output_dir", str(d / "rd"))))]


@case("cannot create the run directory", dest=None)
def run_dir_under_a_file(d):
    (d / "f").write_text("a file")
    return ["train", str(I.recipe(d)), "--run-dir", str(d / "f" / "run")]


@case("cannot create the run directory", dest=None)
def run_dir_under_proc(d):
    return ["train", str(I.recipe(d)), "--run-dir", "/proc/port-attack-run"]


@case("holds checkpoints of an earlier run")
def run_dir_with_checkpoints_without_resume(d):
    (d / "out" / "checkpoints" / "step_2").mkdir(parents=True)
    return ["train", str(I.recipe(d))]


# -- resume state (owned with the run directory; issue 15: malformed state.json on --resume)
def _resume_case(name: str, state: bytes, *expect: str):
    def gen(d: Path) -> list[str]:
        ck = d / "out" / "checkpoints" / "step_2"
        ck.mkdir(parents=True)
        (ck / "state.json").write_bytes(state)
        return ["train", str(I.recipe(d)), "--resume"]
    gen.__name__ = name
    globals()[name] = case(*expect, timeout=60)(gen)


_resume_case("resume_state_is_a_list", b"[1, 2]", "state.json")
_resume_case("resume_state_nested_100000", I.deep_json().encode(), "state.json")
_resume_case("resume_state_not_utf8", I.NOT_UTF8, "state.json")
_resume_case("resume_state_shards_string", b'{"step": 2, "shards": "many"}', "state.json")
_resume_case("resume_state_step_string", b'{"step": "two", "shards": 1}', "step_2")


# -- tables: a Parquet file is bounded by its footer before any row is decoded (porting/train/data/formats.py)
@case("rows.parquet", "rows 60,000,000, more than the 50,000,000", "MAX_TABLE_ROWS", timeout=60)
def parquet_row_bomb(d):
    """100 KB on disk, 60 million null rows: decoding them all would take gigabytes of Python objects."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": pa.nulls(60_000_000, pa.string())}), d / "rows.parquet", row_group_size=64 << 20)
    return ["train", str(I.recipe(d, I.set_key("data.format", "text"), data=d / "rows.parquet"))]


# -- --shrink (porting/launch/shrink.py): refused before anything starts where it cannot work
@case("--shrink moves a supervised run onto fewer devices after a fault: add --supervise")
def shrink_without_supervise(d):
    return ["train", str(I.recipe(d)), "--shrink"]


@case("--shrink relaunches one node's ranks on fewer devices", "2-node run", timeout=60)
def shrink_on_two_nodes(d):
    return ["train", str(I.recipe(d)), "--supervise", "--shrink", "--launch-node", "0", "--no-preflight",
            "--set", "cluster.nodes=2"]


# -- --calibration REHEARSAL (porting/train/plan/calibrated.py load: a rehearsal folder's calibration.json)
@case("--calibration predicts a step for the plan: add --dry-run")
def calibration_without_dry_run(d):
    (d / "cal").mkdir()
    return ["train", str(I.recipe(d)), "--calibration", str(d / "cal")]


def _calibration_case(name: str, write, *expect: str):
    def gen(d: Path) -> list[str]:
        (d / "cal").mkdir()
        write(d, d / "cal" / "calibration.json")
        return ["train", str(I.recipe(d)), "--dry-run", "--calibration", str(d / "cal")]
    gen.__name__ = name
    globals()[name] = case(*expect, timeout=60)(gen)


_GOOD_CAL = {"format": "port-calibration/1", "shape": {}, "by_threads": {"2": {}}}
_calibration_case("calibration_absent", lambda d, p: None, "no calibration.json there", "port rehearse RECIPE --out")
_calibration_case("calibration_symlink_outside", lambda d, p: (d / "elsewhere.json").write_text("{}")
                  or p.symlink_to(d / "elsewhere.json"), "no calibration.json there")
_calibration_case("calibration_nested_100000", lambda d, p: p.write_text(I.deep_json()), "calibration.json")
_calibration_case("calibration_not_utf8", lambda d, p: p.write_bytes(I.NOT_UTF8), "calibration.json")
_calibration_case("calibration_2_mib", lambda d, p: p.write_text('{"x": "' + "a" * (2 << 20) + '"}'),
                  "calibration.json")
_calibration_case("calibration_other_format", lambda d, p: p.write_text(json.dumps({"format": "x"})),
                  "not a port calibration")
_calibration_case("calibration_pieces_not_numbers", lambda d, p: p.write_text(json.dumps(_GOOD_CAL)),
                  "by_threads.2 lacks one of layer_a_s")
# the shape a prediction scales from, without its keys (a KeyError in the middle of the plan before), or a load that
# is not a number (the plan repeats it)
_PIECES = dict.fromkeys(("layer_a_s", "layer_s_per_flop", "ends_a_s", "ends_s_per_flop", "update_per_param_s",
                         "update_fixed_s", "fused_delta_layer_s", "fused_delta_fixed_s"), 1e-7)   # in every bound
_calibration_case("calibration_shape_without_its_keys", lambda d, p: p.write_text(json.dumps(
    {**_GOOD_CAL, "by_threads": {"2": _PIECES}, "shape": {"hidden": [64]}})), "calibration.json: shape must hold hidden")
# the compute rung's collectives (a kind@group size and its (bytes, ms) points) and the pieces of other TPs, bounded
_calibration_case("calibration_collectives_not_points", lambda d, p: p.write_text(json.dumps(
    {**_GOOD_CAL, "by_threads": {"2": _PIECES}, "collectives": {"measured": {"AllReduce@2": {"points_bytes_ms": "x"}}},
     "shape": dict.fromkeys(("hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "seq", "micro", "tp"),
                            4) | {"recompute": False}})),
    "collectives.AllReduce@2.points_bytes_ms: expected 1 to 64 [bytes, ms] pairs")
_calibration_case("calibration_by_tp_not_pieces", lambda d, p: p.write_text(json.dumps(
    {**_GOOD_CAL, "by_threads": {"2": _PIECES}, "by_tp": {"4": {"x": {}}}})), "by_tp.4 key 'x' is not a thread count")
_calibration_case("calibration_load_not_a_number", lambda d, p: p.write_text(json.dumps(
    {**_GOOD_CAL, "by_threads": {"2": _PIECES}, "load_avg_1min": "high",
     "shape": dict.fromkeys(("hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "seq", "micro", "tp"),
                            4) | {"recompute": False}})), "load_avg_1min: found 'high', expected a load average")

from tests.attacks.train import cases_calibration  # noqa: E402,F401  (register issue 51's calibration cases)


# -- determinism: bitwise refuses what would undo it (issue 49), before anything starts
@case("recipe.yaml", "HCCL_DETERMINISTIC='false' in the environment undoes determinism: bitwise",
      env={"HCCL_DETERMINISTIC": "false"})
def determinism_with_hccl_deterministic_false(d):
    return ["train", str(I.recipe(d, I.set_key("determinism", "bitwise"))), "--run-dir", str(d / "out")]


@case("recipe.yaml", "--shrink relaunches on fewer devices")
def determinism_with_shrink(d):
    return ["train", str(I.recipe(d, I.set_key("determinism", "bitwise"))), "--supervise", "--shrink",
            "--run-dir", str(d / "out")]


# -- PORT_COMPILE_CACHE_SHARED (porting/train/run/step/shared_cache.py) that cannot be a folder: ignored silently
# before (issue 51), one line before anything is written now (porting/train/plan/execution.py shared_cache_problem)
@case("PORT_COMPILE_CACHE_SHARED=shared: not a folder", "unset it", env={"PORT_COMPILE_CACHE_SHARED": "shared"})
def shared_compile_cache_names_a_file(d):
    (d / "shared").write_text("a user's file")
    return ["train", str(I.recipe(d))]


@case("PORT_COMPILE_CACHE_SHARED=", "(10,000 characters): File name too long",
      env={"PORT_COMPILE_CACHE_SHARED": "s" * 10_000})
def shared_compile_cache_path_past_the_name_limit(d):
    return ["train", str(I.recipe(d))]
