"""Where each compared tensor sits: the sub-blocks of a Llama decoder layer in data-flow order, the
kernel that computes each, the parameters each owns, and the global order of every row.

Block names are framework-neutral. Which HF module computes each is :data:`MODULES`; which zoo cell
does is derived from the converters' name map (:func:`module_paths`), and :mod:`porting.bisect.taps_ms` and
:mod:`porting.bisect.taps_hf` hook what :func:`hooked` finds on each side. Forward rows come in layer order; backward rows
in reverse, each block's activation gradient followed by the gradients of the parameters it owns (the
order autograd computes them); AdamW updates come last, parameter by parameter in forward order.
"""

from __future__ import annotations

import functools
import re

from converters import names

# (block, kernel of model.kernel_report() or "matmul"/"gather"/"-"), in forward order within a layer.
LAYER_BLOCKS: tuple[tuple[str, str], ...] = (
    ("attention_norm", "rmsnorm"), ("q_proj", "matmul"), ("k_proj", "matmul"), ("v_proj", "matmul"),
    ("q_rope", "rope"), ("k_rope", "rope"), ("attention", "attention"), ("o_proj", "matmul"),
    ("mlp_norm", "rmsnorm"), ("gate_proj", "matmul"), ("up_proj", "matmul"), ("swiglu", "swiglu"),
    ("down_proj", "matmul"), ("output", "-"),
)
# Qwen3's per-head q/k RMSNorm (before RoPE): blocks of their own after v_proj, in models whose name map has them.
QK_NORM_BLOCKS: tuple[tuple[str, str], ...] = (("q_norm", "rmsnorm"), ("k_norm", "rmsnorm"))
TOP_BEFORE = (("embedding", "gather"),)
TOP_AFTER = (("final_norm", "rmsnorm"), ("logits", "matmul"), ("loss", "cross-entropy"))

# The HF module each weight-owning block computes with, inside a decoder layer ("{}": the layer) or at the
# top. The zoo's cell for each is derived from converters.names (the module of the weight's mapped name), so
# the correspondence HF module <-> zoo cell is written once, in the converters' name map.
MODULES: dict[str, str] = {
    "attention_norm": "model.layers.{}.input_layernorm", "q_proj": "model.layers.{}.self_attn.q_proj",
    "k_proj": "model.layers.{}.self_attn.k_proj", "v_proj": "model.layers.{}.self_attn.v_proj",
    "o_proj": "model.layers.{}.self_attn.o_proj", "mlp_norm": "model.layers.{}.post_attention_layernorm",
    "gate_proj": "model.layers.{}.mlp.gate_proj", "up_proj": "model.layers.{}.mlp.up_proj",
    "down_proj": "model.layers.{}.mlp.down_proj",
    "embedding": "model.embed_tokens", "final_norm": "model.norm", "logits": "lm_head",
}
OPTIONAL_MODULES = {"q_norm": "model.layers.{}.self_attn.q_norm", "k_norm": "model.layers.{}.self_attn.k_norm"}
# Blocks seen as another block's input: attention's output is o_proj's input, SwiGLU's is down_proj's.
INPUT_OF = {"attention": "o_proj", "swiglu": "down_proj"}
_LAYER = "model.layers.{}"   # a decoder layer: its output is the block "output"


@functools.lru_cache(maxsize=None)
def module_paths(model_type: str) -> dict[str, tuple[str, str]]:
    """block -> (HF module path, zoo cell path), "{}" standing for the layer index; the layer itself under
    "output"."""
    table = names.NAME_MAPS[model_type]
    present = {**MODULES, **{b: hf for b, hf in OPTIONAL_MODULES.items() if f"{hf}.weight" in table}}
    out = {block: (hf, table[f"{hf}.weight"].rsplit(".", 1)[0]) for block, hf in present.items()}
    layer = {ms.rsplit(".", 1)[0] for hf, ms in out.values() if hf.startswith(_LAYER + ".")}
    layer = {p[:p.index("{}") + 2] for p in layer}
    if len(layer) != 1:
        raise AssertionError(f"{model_type}: the name map puts one decoder layer's weights under {sorted(layer)}")
    return {**out, "output": (_LAYER, layer.pop())}


@functools.lru_cache(maxsize=None)
def _param_owners(model_type: str) -> tuple[re.Pattern, dict[str, str], dict[str, str]]:
    """(a zoo layer parameter's pattern, layer cell -> block, top cell -> block)."""
    paths = module_paths(model_type)
    layer_prefix = paths["output"][1]
    in_layer = {ms[len(layer_prefix) + 1:]: b for b, (hf, ms) in paths.items() if ms.startswith(layer_prefix + ".")}
    top = {ms: b for b, (hf, ms) in paths.items() if "{}" not in ms}
    pattern = re.compile("^" + re.escape(layer_prefix).replace(r"\{\}", r"(\d+)") + r"\.(.+)\.[^.]+$")
    return pattern, in_layer, top


def param_block(ms_name: str, model_type: str) -> tuple[int | None, str]:
    """(layer, block) that owns a zoo parameter."""
    pattern, in_layer, top = _param_owners(model_type)
    for leaf in (".lora_A.weight", ".lora_B.weight"):   # a LoRA adapter belongs to the layer it adapts
        if ms_name.endswith(leaf):
            ms_name = ms_name[:-len(leaf)] + ".weight"
    m = pattern.match(ms_name)
    if m and m.group(2) in in_layer:
        return int(m.group(1)), in_layer[m.group(2)]
    if ms_name.rsplit(".", 1)[0] in top:
        return None, top[ms_name.rsplit(".", 1)[0]]
    raise KeyError(f"parameter {ms_name} belongs to no known block")


def attention_path(model_type: str, side: int) -> str:
    """The attention module (HF, ``side`` 0) or cell (zoo, 1) of a layer: the parent of q_proj's."""
    return module_paths(model_type)["q_proj"][side].rsplit(".", 1)[0]


def submodule(root, path: str):
    """The cell or module at a dotted path (``layers.3`` indexes a CellList / ModuleList)."""
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def hooked(root, model_type: str, side: int, n_layers: int, skip: tuple[str, ...] = ()):
    """(layer, block, cell or module) of every block computed by a module of its own, on the HF side
    (``side`` 0) or the zoo side (1), and (layer, block, module) of the blocks seen as another's input."""
    paths = module_paths(model_type)
    outs, ins = [], []
    for block, pair in paths.items():
        if block in skip:
            continue
        where = range(n_layers) if "{}" in pair[side] else [None]
        outs += [(i, block, submodule(root, pair[side].format(i))) for i in where]
    for block, owner in INPUT_OF.items():
        ins += [(i, block, submodule(root, paths[owner][side].format(i))) for i in range(n_layers)]
    return outs, ins


def layer_blocks(model_type: str | None = None) -> tuple[tuple[str, str], ...]:
    """A layer's blocks in forward order; a model with per-head q/k norms (Qwen3) has them after v_proj."""
    if model_type is None or "q_norm" not in module_paths(model_type):
        return LAYER_BLOCKS
    at = [b for b, _ in LAYER_BLOCKS].index("v_proj") + 1
    return LAYER_BLOCKS[:at] + QK_NORM_BLOCKS + LAYER_BLOCKS[at:]


def forward_slots(n_layers: int, model_type: str | None = None) -> list[tuple[int | None, str, str]]:
    """(layer, block, kernel) of every forward tensor, in data-flow order."""
    out: list[tuple[int | None, str, str]] = [(None, b, k) for b, k in TOP_BEFORE]
    for i in range(n_layers):
        out += [(i, b, k) for b, k in layer_blocks(model_type)]
    return out + [(None, b, k) for b, k in TOP_AFTER]


class Order:
    """The data-flow position of every row: ``key(phase, layer, block)`` for activations and their
    gradients, ``param(name)`` / ``update(name)`` for parameter gradients and AdamW updates."""

    def __init__(self, n_layers: int, param_names: list[str], model_type: str):
        fwd = forward_slots(n_layers, model_type)
        self.slots = fwd
        self.model_type = model_type
        owned: dict[tuple[int | None, str], list[str]] = {}
        for n in param_names:
            owned.setdefault(param_block(n, model_type), []).append(n)
        self._pos: dict[tuple, int] = {}
        for layer, block, _ in fwd:
            self._pos[("forward", layer, block)] = len(self._pos)
        for layer, block, _ in reversed(fwd):
            if block != "loss":
                self._pos[("backward", layer, block)] = len(self._pos)
            for n in owned.get((layer, block), []):
                self._pos[("param", n)] = len(self._pos)
        for layer, block, _ in fwd:
            for n in owned.get((layer, block), []):
                self._pos[("update", n)] = len(self._pos)
        self.kernels = {(layer, block): k for layer, block, k in fwd}

    def key(self, phase: str, layer: int | None, block: str) -> int:
        return self._pos[(phase, layer, block)]

    def param(self, name: str) -> int:
        return self._pos[("param", name)]

    def update(self, name: str) -> int:
        return self._pos[("update", name)]


def kernel_names(report: list[dict]) -> dict[tuple[int, str], str]:
    """(layer, kernel) -> "impl: op" from ``model.kernel_report()``."""
    return {(r["layer"], r["kernel"]): f"{r['impl']}" for r in report}


def kernel_of(kernels: dict[tuple[int, str], str], layer: int | None, kernel: str) -> str:
    """The implementation that computed a block: the kernel report's choice for RMSNorm, RoPE,
    attention and SwiGLU (the final norm uses the last layer's RMSNorm choice), else the plain op."""
    if kernel in ("rmsnorm", "rope", "attention", "swiglu"):
        lay = layer if layer is not None else max((k[0] for k in kernels if isinstance(k[0], int)), default=0)
        return f"{kernel}:{kernels.get((lay, kernel), '?')}"
    return kernel


def out_hook(tap, record, layer: int | None, block: str):
    """A forward hook (MindSpore ``Cell`` or torch ``Module``: same signature) tapping the output."""
    def hook(cell, inputs, output):
        tap(record, layer, block, output[0] if isinstance(output, tuple) else output)
    return hook


def in_hook(tap, record, layer: int | None, block: str):
    """A forward pre-hook tapping the first input (attention's output is o_proj's input, SwiGLU's down's)."""
    def hook(cell, inputs):
        tap(record, layer, block, inputs[0])
    return hook
