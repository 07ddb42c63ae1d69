"""LoRA (issue 52): hostile ``lora`` sections (a bad r or alpha, a target naming no module, a regex, DoRA), hostile
PEFT adapter folders as ``lora.init_from`` (wrong shapes, extra keys, code-like values in adapter_config.json, a
linked weights file, a config that disagrees with the recipe) and a LoRA checkpoint merged without its base. Each
is one error line, runs nothing it read, and writes nothing outside ``dest``."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import EMBEDDED, case

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _lora(**fields):
    def edit(r: dict) -> None:
        r["lora"] = {**LORA, **fields}
        r["lora"] = {k: v for k, v in r["lora"].items() if v is not None}
    return edit


def _section_case(name: str, fields: dict, *expect: str):
    def gen(d: Path) -> list[str]:
        return ["train", str(I.recipe(d, _lora(**fields)))]
    gen.__name__ = name
    globals()[name] = case(*expect)(gen)


for _name, _fields, _expect in [
    ("r_zero", {"r": 0}, "lora.r"),
    ("r_huge", {"r": 10 ** 6}, "lora.r"),
    ("r_bool", {"r": True}, "lora.r", ),
    ("r_float", {"r": 4.5}, "lora.r"),
    ("alpha_inf", {"alpha": float("inf")}, "lora.alpha"),
    ("alpha_nan", {"alpha": float("nan")}, "lora.alpha"),
    ("alpha_negative", {"alpha": -8}, "lora.alpha"),
    ("dropout_one", {"dropout": 1.0}, "lora.dropout"),
    ("target_empty_list", {"target_modules": []}, "lora.target_modules"),
    ("target_regex", {"target_modules": ".*_proj"}, "lora.target_modules"),
    ("target_code", {"target_modules": ["__import__('os').system('touch pwned')"]}, "lora.target_modules"),
    ("target_names_no_module", {"target_modules": ["qkv"]}, "'qkv' names no module"),
    ("target_not_linear", {"target_modules": ["input_layernorm"]}, "is not a linear layer"),
    ("target_lm_head", {"target_modules": ["lm_head"]}, "lm_head"),
    ("save_tied_embedding", {"modules_to_save": ["embed_tokens"]}, "tied embedding"),
    ("dora", {"use_dora": True}, "DoRA is not implemented"),
    ("loraplus", {"loraplus_lr_ratio": 16.0}, "LoRA+ is not implemented"),
    ("unknown_key", {"rank": 8}, "lora.rank: unknown key"),
]:
    _section_case(_name, _fields, *_expect)


# ------------------------------------------------------------------------------------------ lora.init_from
def _adapter(d: Path, edit_config=None, edit_tensors=None) -> Path:
    """A PEFT adapter folder for the embedded model, written by port's writer, then damaged."""
    import numpy as np

    from converters import lora_names, peft_adapter
    from model_zoo.config import LlamaConfig
    from model_zoo.lora_spec import draw_initial

    cfg = LlamaConfig.from_hf(EMBEDDED)
    t = lora_names.resolve(cfg, LORA["target_modules"])
    conf = peft_adapter.AdapterConfig(4, 8.0, target_modules=tuple(LORA["target_modules"]))
    tensors = draw_initial(peft_adapter.expected_shapes(cfg, t, 4), 0)
    folder = d / "adapter"
    folder.mkdir()
    peft_adapter.write_adapter(folder, conf, t, tensors)
    if edit_tensors is not None:
        edit_tensors(tensors, np)
        with_keys = lora_names.Targets(t.adapted, {k: k for k in tensors if k not in t.adapter_keys()})
        peft_adapter.write_adapter(folder, conf, with_keys, tensors)
    if edit_config is not None:
        doc = json.loads((folder / peft_adapter.CONFIG_FILE).read_text())
        edit_config(doc)
        (folder / peft_adapter.CONFIG_FILE).write_text(json.dumps(doc))
    return folder


def _init_from(d: Path, folder: Path) -> list[str]:
    return ["train", str(I.recipe(d, _lora(init_from=str(folder))))]


@case("has shape", "this model and r 4 need")
def adapter_wrong_shape(d):
    def edit(t, np):
        k = next(k for k in t if "lora_A" in k)
        t[k] = np.zeros((4, 7), np.float32)
    return _init_from(d, _adapter(d, edit_tensors=edit))


@case("adapter_model.safetensors", "unexpected", "base_model.model.extra.weight")
def adapter_extra_key(d):
    return _init_from(d, _adapter(d, edit_tensors=lambda t, np: t.update({"base_model.model.extra.weight":
                                                                            np.zeros((2,), np.float32)})))


@case("adapter_config.json", "not a module name")
def adapter_config_code_in_targets(d):
    return _init_from(d, _adapter(d, lambda c: c.update(target_modules=["__import__('os').system('touch pwned')"])))


@case("adapter_config.json", "auto_mapping", "runs no code from a file")
def adapter_config_auto_mapping_classes(d):
    return _init_from(d, _adapter(d, lambda c: c.update(auto_mapping={"base_model_class": "os.system",
                                                                      "parent_library": "subprocess"})))


@case("adapter_config.json", "key 'r'", "expected an integer")
def adapter_config_r_is_a_command(d):
    return _init_from(d, _adapter(d, lambda c: c.update(r="8; rm -rf ~")))


@case("adapter_config.json", "not a LoRA setting port knows")
def adapter_config_unknown_option_set(d):
    return _init_from(d, _adapter(d, lambda c: c.update(eval_hook="lambda: __import__('os')")))


@case("adapter_config.json", "nests deeper than")
def adapter_config_deep_json(d):
    folder = _adapter(d)
    (folder / "adapter_config.json").write_text(I.deep_json())
    return _init_from(d, folder)


@case("adapter_model.safetensors", "symbolic link")
def adapter_weights_linked(d):
    folder = _adapter(d)
    (folder / "adapter_model.safetensors").rename(d / "elsewhere.safetensors")
    os.symlink(d / "elsewhere.safetensors", folder / "adapter_model.safetensors")
    return _init_from(d, folder)


@case("differs from the recipe's lora section", "r 8")
def adapter_config_disagrees_with_recipe(d):
    return _init_from(d, _adapter(d, lambda c: c.update(r=8)))


@case("adapter_config.json", "not found")
def adapter_folder_empty(d):
    (d / "adapter").mkdir()
    return _init_from(d, d / "adapter")


# ------------------------------------------------------------------------------------------ port ckpt merge
@functools.lru_cache(maxsize=None)
def _trained_lora() -> Path:
    """A real LoRA run of the tiny recipe (2 steps, stories260K); its last checkpoint holds the adapters only."""
    from porting.train import load_recipe, train

    root = Path(tempfile.mkdtemp(prefix="port-attacks-lora-"))
    train(load_recipe(I.recipe(root, _lora())), root / "out", echo=False)
    return root / "out" / "checkpoints" / "step_2"


def _lora_ck(d: Path) -> Path:
    dst = d / "run" / "checkpoints" / "step_2"
    shutil.copytree(_trained_lora(), dst)
    return dst


@case("holds the adapters only", "pass --model BASE_DIR")
def merge_without_its_base(d):
    return ["ckpt", "merge", str(_lora_ck(d)), "--out", str(d / "out")]


@case("was trained over another model")
def merge_over_another_base(d):
    other = I.edit_config(I.hf(d, "other"), num_hidden_layers=4)
    return ["ckpt", "merge", str(_lora_ck(d)), "--out", str(d / "out"), "--model", str(other)]


@case("--adapter-only", "holds no adapter")
def adapter_only_of_a_full_checkpoint(d):
    return ["ckpt", "merge", str(I.train_checkpoint(d / "ck" / "step_2")), "--out", str(d / "out"), "--adapter-only"]
