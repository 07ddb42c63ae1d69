"""LoRA adapters named as HF PEFT names them, derived from the weight-name maps (converters/names.py).

PEFT works on the HF model's module paths (``model.layers.0.self_attn.q_proj``); the zoo's cells have their
own (``model.layers.0.attention.wq``). Both tables here are derived from ``names.NAME_MAPS`` by dropping the
parameter leaf (``.weight`` / ``.bias``), never typed again: an HF module is one that holds parameters, a
*linear* module one whose weight is 2-D and is not the token embedding (``names.expected_hf_shapes``).

Which modules a LoRA config adapts follows PEFT (huggingface/peft ``src/peft/tuners/tuners_utils.py``,
v0.21): ``check_target_module_exists`` (a module is a target when its path equals a name of
``target_modules`` or ends with ``"." + name``; never a module of ``modules_to_save``, matched by
``(^|.*\\.)NAME($|\\..*)``), ``_maybe_include_all_linear_layers`` (``all-linear``: every ``nn.Linear`` but the
output embedding ``lm_head``), ``_set_trainable`` in ``utils/other.py`` (``modules_to_save``: a module whose
path ends with the name, as a plain suffix). A regular expression as ``target_modules`` (PEFT's ``re.fullmatch``)
is refused: a recipe's pattern would run unbounded over every module path; list the names instead.

What is saved (``get_peft_model_state_dict`` in ``utils/save_and_load.py``, checked with peft 0.21): the
adapters as ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``; a ``modules_to_save`` module's
parameters as ``base_model.model.<module>.<leaf>``; with ``bias: all`` every bias, with ``bias: lora_only``
the adapted layers' biases, a LoRA layer's bias as ``base_model.model.<module>.base_layer.bias``.

Phi-3's fused ``qkv_proj`` / ``gate_up_proj`` (converters/fused.py): PEFT adapts each as ONE layer, one
``lora_A`` shared by q, k and v. The zoo holds q, k and v apart, so that adapter is three LoRA layers with one
shared A, which the zoo's layers do not express (each has its own A, and after one step they differ): a target
that reaches a fused module is refused by name; ``o_proj`` and ``down_proj`` of Phi-3 are adapted as usual.
"""

from __future__ import annotations

import dataclasses
import re

from converters import fused, names
from model_zoo.config import LlamaConfig
from model_zoo.errors import ConfigError

ALL_LINEAR = "all-linear"          # PEFT's INCLUDE_LINEAR_LAYERS_SHORTHAND
PEFT_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the HF model
BIASES = ("none", "all", "lora_only")
OUTPUT_LAYER = "lm_head"
MAX_NAMES = 256                    # target_modules / modules_to_save entries


def _leaf(name: str) -> tuple[str, str]:
    module, _, leaf = name.rpartition(".")
    return module, leaf


@dataclasses.dataclass(frozen=True)
class ModuleTable:
    """The HF model's parameter-holding modules for one config: HF path -> zoo path, which are linear, and
    the fused Phi-3 modules (HF path -> the zoo paths of its parts)."""

    modules: dict[str, str]
    linear: frozenset[str]
    fused: dict[str, tuple[str, ...]]
    params: dict[str, str]          # HF parameter name -> zoo parameter name

    @classmethod
    def of(cls, cfg: LlamaConfig) -> "ModuleTable":
        table = names.NAME_MAPS[cfg.model_type]
        shapes = names.expected_hf_shapes(cfg)
        modules, params, linear = {}, {}, set()
        for hf in names.expected_hf_names(cfg):
            zoo = names.map_name(hf, table)
            params[hf] = zoo
            module, _ = _leaf(hf)
            modules[module] = _leaf(zoo)[0]
            if len(shapes[hf]) == 2 and hf != "model.embed_tokens.weight":
                linear.add(module)
        fused_mods: dict[str, tuple[str, ...]] = {}
        for i in range(cfg.num_hidden_layers):
            for template, parts in fused.FUSED.get(cfg.model_type, {}).items():
                fmod = _leaf(template.replace("{}", str(i)))[0]
                part_mods = [_leaf(p.replace("{}", str(i)))[0] for p, _ in parts]
                fused_mods[fmod] = tuple(modules[m] for m in part_mods)
                for m in part_mods:    # PEFT sees the fused module, not its parts
                    linear.discard(m)
                linear.add(fmod)
        return cls(modules, frozenset(linear), fused_mods, params)

    def paths(self) -> list[str]:
        """Every module PEFT's matching sees (HF paths): a fused module instead of its parts."""
        parts = {z for zs in self.fused.values() for z in zs}
        return [m for m, z in self.modules.items() if z not in parts] + sorted(self.fused)


@dataclasses.dataclass(frozen=True)
class Targets:
    """What one LoRA config adapts and trains in one model: adapted layers (HF module -> zoo path), and the
    other trainable parameters (PEFT key -> zoo parameter name: modules_to_save, biases)."""

    adapted: dict[str, str]
    trainable: dict[str, str]

    def adapter_keys(self) -> dict[str, str]:
        """PEFT key -> zoo parameter name of every adapter matrix."""
        out = {}
        for hf, zoo in self.adapted.items():
            for leaf in ("lora_A", "lora_B"):
                out[f"{PEFT_PREFIX}{hf}.{leaf}.weight"] = f"{zoo}.{leaf}.weight"
        return out

    def keys(self) -> dict[str, str]:
        """PEFT key -> zoo name of everything an adapter file of this config holds."""
        return {**self.adapter_keys(), **self.trainable}


def _names(value, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or len(value) > MAX_NAMES or not all(
            isinstance(v, str) and 0 < len(v) <= 256 for v in value):
        raise ConfigError(f"{what}: expected a list of at most {MAX_NAMES} module names (strings of 1 to 256 "
                          "characters)")
    return tuple(value)


def check_plain(names_: tuple[str, ...], what: str) -> None:
    """Module names only: a regular expression would be matched unbounded (PEFT's string form is a regex)."""
    bad = [n for n in names_ if not re.fullmatch(r"[A-Za-z0-9_.\-]+", n)]
    if bad:
        raise ConfigError(f"{what}: {bad[0]!r} is not a module name; port matches PEFT's names only (q_proj, "
                          "self_attn.o_proj, model.layers.0.mlp.down_proj, all-linear), not regular expressions: "
                          "list the modules")


def _in_saved(path: str, saved: tuple[str, ...]) -> bool:
    """PEFT: an adapter never targets a modules_to_save module, ``(^|.*\\.)NAME($|\\..*)``."""
    return any(path == m or path.endswith("." + m) or path.startswith(m + ".") or f".{m}." in path for m in saved)


def resolve(cfg: LlamaConfig, target_modules, modules_to_save=(), bias: str = "none") -> Targets:
    """The layers a LoRA config adapts in ``cfg``'s model and the parameters it trains, PEFT's way; one
    ConfigError naming a target that reaches no module, a module that is not linear, lm_head, or a fused one."""
    table = ModuleTable.of(cfg)
    saved = _names(modules_to_save or (), "lora.modules_to_save")
    check_plain(saved, "lora.modules_to_save")
    if bias not in BIASES:
        raise ConfigError(f"lora.bias: {bias!r}, expected one of {', '.join(BIASES)}")
    paths = table.paths()
    if isinstance(target_modules, str) and target_modules.lower() == ALL_LINEAR:
        chosen = [m for m in paths if m in table.linear and m != OUTPUT_LAYER and not _in_saved(m, saved)]
    else:
        wanted = _names(target_modules, "lora.target_modules")
        check_plain(wanted, "lora.target_modules")
        chosen = []
        for name in wanted:
            hits = [m for m in paths if (m == name or m.endswith("." + name)) and not _in_saved(m, saved)]
            if not hits:
                raise ConfigError(f"lora.target_modules: {name!r} names no module of this {cfg.model_type} model "
                                  f"(its linear layers: {', '.join(sorted({m.rpartition('.')[2] for m in table.linear}))})")
            chosen += [m for m in hits if m not in chosen]
    for m in chosen:
        if m not in table.linear:
            raise ConfigError(f"lora.target_modules: {m} is not a linear layer (LoRA adapts linear layers); "
                              "train it whole with lora.modules_to_save")
        if m == OUTPUT_LAYER:
            raise ConfigError("lora.target_modules: lm_head (the output layer) is not adapted by port's LoRA (its "
                              "logits bypass the layer's forward); train it whole with lora.modules_to_save: [lm_head]")
        if m in table.fused:
            raise ConfigError(f"lora.target_modules: {m} is Phi-3's fused projection; PEFT adapts it as one layer "
                              "with one lora_A shared by its parts, which port's separate q/k/v (gate/up) layers do "
                              "not express; target o_proj and down_proj only")
    if not chosen:
        raise ConfigError("lora.target_modules: no layer to adapt (every match is in modules_to_save)")
    adapted = {m: table.modules[m] for m in chosen}
    return Targets(adapted, _trainable(cfg, table, adapted, saved, bias))


def _trainable(cfg: LlamaConfig, table: ModuleTable, adapted: dict[str, str], saved: tuple[str, ...],
               bias: str) -> dict[str, str]:
    """PEFT key -> zoo name of the modules_to_save parameters and the trained biases."""
    out: dict[str, str] = {}
    for name in saved:
        hits = [hf for hf in table.params if _leaf(hf)[0].endswith(name)]
        if cfg.tie_word_embeddings and (name.endswith(OUTPUT_LAYER) or "model.embed_tokens.weight" in hits):
            raise ConfigError(f"lora.modules_to_save: {name!r} is the tied embedding of this model "
                              "(tie_word_embeddings); PEFT keeps a second copy of it, port's tied model has one weight")
        if not hits:
            raise ConfigError(f"lora.modules_to_save: {name!r} names no module of this {cfg.model_type} model")
        for hf in hits:
            out[PEFT_PREFIX + hf] = table.params[hf]
    if bias != "none":
        for hf, zoo in table.params.items():
            module, leaf = _leaf(hf)
            if leaf != "bias" or (bias == "lora_only" and module not in adapted):
                continue
            key = f"{PEFT_PREFIX}{module}.base_layer.bias" if module in adapted else PEFT_PREFIX + hf
            out.setdefault(key, zoo)
    return out
