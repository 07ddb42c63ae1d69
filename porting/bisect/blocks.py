"""Where each compared tensor sits: the sub-blocks of a Llama decoder layer in data-flow order, the
kernel that computes each, the parameters each owns, and the global order of every row.

Block names are framework-neutral; :mod:`porting.bisect.taps_ms` and :mod:`porting.bisect.taps_hf`
say which cell or module of each side produces them. Forward rows come in layer order; backward rows
in reverse, each block's activation gradient followed by the gradients of the parameters it owns (the
order autograd computes them); AdamW updates come last, parameter by parameter in forward order.
"""

from __future__ import annotations

import re

# (block, kernel of model.kernel_report() or "matmul"/"gather"/"-"), in forward order within a layer.
LAYER_BLOCKS: tuple[tuple[str, str], ...] = (
    ("attention_norm", "rmsnorm"), ("q_proj", "matmul"), ("k_proj", "matmul"), ("v_proj", "matmul"),
    ("q_rope", "rope"), ("k_rope", "rope"), ("attention", "attention"), ("o_proj", "matmul"),
    ("mlp_norm", "rmsnorm"), ("gate_proj", "matmul"), ("up_proj", "matmul"), ("swiglu", "swiglu"),
    ("down_proj", "matmul"), ("output", "-"),
)
# Qwen3's per-head q/k RMSNorm (before RoPE), after the projections, in models that have it.
QK_NORM_BLOCKS: tuple[tuple[str, str], ...] = (("q_norm", "rmsnorm"), ("k_norm", "rmsnorm"))
TOP_BEFORE = (("embedding", "gather"),)
TOP_AFTER = (("final_norm", "rmsnorm"), ("logits", "matmul"), ("loss", "cross-entropy"))

# Parameter (zoo name, layer part) -> the block that owns it.
_PARAM_BLOCK = {
    "attention_norm": "attention_norm", "attention.wq": "q_proj", "attention.wk": "k_proj",
    "attention.wv": "v_proj", "attention.wo": "o_proj", "ffn_norm": "mlp_norm",
    "feed_forward.w1": "gate_proj", "feed_forward.w3": "up_proj", "feed_forward.w2": "down_proj",
    "attention.q_layernorm": "q_norm", "attention.k_layernorm": "k_norm",
}
_LAYER_PARAM = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_TOP_PARAM = {"model.tok_embeddings.embedding_weight": "embedding", "model.norm_out.weight": "final_norm",
              "lm_head.weight": "logits"}


def param_block(ms_name: str) -> tuple[int | None, str]:
    """(layer, block) that owns a zoo parameter."""
    m = _LAYER_PARAM.match(ms_name)
    if m and m.group(2) in _PARAM_BLOCK:
        return int(m.group(1)), _PARAM_BLOCK[m.group(2)]
    if ms_name in _TOP_PARAM:
        return None, _TOP_PARAM[ms_name]
    raise KeyError(f"parameter {ms_name} belongs to no known block")


def layer_blocks(qk_norm: bool = False) -> tuple[tuple[str, str], ...]:
    """A layer's blocks in forward order; with ``qk_norm`` (Qwen3) the q/k norms follow v_proj."""
    if not qk_norm:
        return LAYER_BLOCKS
    at = [b for b, _ in LAYER_BLOCKS].index("v_proj") + 1
    return LAYER_BLOCKS[:at] + QK_NORM_BLOCKS + LAYER_BLOCKS[at:]


def forward_slots(n_layers: int, qk_norm: bool = False) -> list[tuple[int | None, str, str]]:
    """(layer, block, kernel) of every forward tensor, in data-flow order."""
    out: list[tuple[int | None, str, str]] = [(None, b, k) for b, k in TOP_BEFORE]
    for i in range(n_layers):
        out += [(i, b, k) for b, k in layer_blocks(qk_norm)]
    return out + [(None, b, k) for b, k in TOP_AFTER]


class Order:
    """The data-flow position of every row: ``key(phase, layer, block)`` for activations and their
    gradients, ``param(name)`` / ``update(name)`` for parameter gradients and AdamW updates."""

    def __init__(self, n_layers: int, param_names: list[str]):
        fwd = forward_slots(n_layers, qk_norm=any(".attention.q_layernorm." in n for n in param_names))
        self.slots = fwd
        owned: dict[tuple[int | None, str], list[str]] = {}
        for n in param_names:
            owned.setdefault(param_block(n), []).append(n)
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
