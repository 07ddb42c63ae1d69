"""Kernel dispatch: a fused Ascend path and a plain-op reference path for each hot kernel.

For each kernel (attention, RoPE, RMSNorm, SwiGLU: MindSpeed-LLM's Llama kernel set, each named with
its MindSpeed-LLM flag) :func:`select_kernels` picks ``fused`` or ``reference`` from the device, the
documented constraints of the fused op and the installed MindSpore's signature of it (version guards:
a mismatch falls back to the reference kernel with the reason), and says why. The choice can be
overridden per kernel. The fused paths call MindSpore's Ascend kernels:

* attention: ``ops.flash_attention_score`` in BNSD layout with the compressed 2048x2048 causal mask
  (sparse_mode 2 = left-up causal when query and key lengths match, 3 = right-down causal when a
  KV cache makes keys longer than queries). Documented: fp16/bf16 only, head_dim a multiple of 16
  and <= 512, N1 <= 256 and N2 a divisor of N1 (so GQA needs no repeat). Packed rows
  (``batching.packing``) use the TND layout (T = B*S tokens) with the cumulative example ends as
  ``actual_seq_qlen``/``actual_seq_kvlen`` (int64, non-decreasing, last = T, no empty key segment),
  sparse_mode 3 with the same compressed mask and next_tokens 0, as the TND contract says.
* RoPE: ``ops.rotary_position_embedding(x, cos, sin, mode=0)``; mode 0 is rotate-half, the layout
  HF Llama q/k weights are stored in. Documented: head_dim even and < 896, B and N < 1000, and not
  to be called for BNSD when B*N > 8*S with a 32-byte-aligned head_dim (poor performance).
* RMSNorm: ``ops.rms_norm(x, gamma, epsilon) -> (y, rstd)``, the signature up to MindSpore 2.10 (its
  docstring announces ``rms_norm(input, normalized_shape, weight=None, eps)`` returning y only).
* SwiGLU: ``ops.swiglu(input, dim=-1) = silu(first half) * second half``: the gate (w1) and up (w3)
  weights are concatenated [w1; w3] at compute time for one matmul, so checkpoints keep w1/w3 and the
  converters' name map stays one-to-one.

These kernels are registered only on Ascend; the fused paths are tested on CPU against NumPy models of
the documented kernel semantics, and compiled and trained in GRAPH_MODE with graph-safe stand-ins that
enforce each op's contract (tests/npu_models.py, put in place by ``llama.fused_ops_replaced``). On the CPU, attention and RMSNorm have a
third path, ``cpu``: port's own C++ kernels (:mod:`model_zoo.cpu_kernels`), compiled on first use;
float32 only, attention only where queries and keys have the same length (a KV-cache step runs the
reference). Everything else on CPU/GPU runs the reference path.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Mapping

import numpy as np

from model_zoo import cpu_kernels
from model_zoo.config import LlamaConfig
from model_zoo.errors import KernelError
from model_zoo.rope import rope_tables  # noqa: F401 (kernels.rope_tables, where callers have always found it)

KERNELS = ("attention", "rope", "rmsnorm", "swiglu")
CPU_IMPL = "cpu"
CHOICES = ("auto", "fused", "reference", CPU_IMPL)
FUSED_DTYPES_ATTENTION = ("float16", "bfloat16")

# Each entry: what the fused path calls. Shown in reports.
FUSED_OPS = {
    "attention": "ops.flash_attention_score(layout=BNSD, sparse_mode=2|3, 2048x2048 causal mask; packed rows: "
                 "layout=TND, actual_seq_qlen/kvlen)",
    "rope": "ops.rotary_position_embedding(mode=0, rotate-half)",
    "rmsnorm": "ops.rms_norm",
    "swiglu": "ops.swiglu(dim=-1) on x @ [w1; w3]^T",
}
REFERENCE_OPS = {
    "attention": "BatchMatMul + causal mask + fp32 softmax + BatchMatMul",
    "rope": "x*cos + rotate_half(x)*sin",
    "rmsnorm": "fp32 x*rsqrt(mean(x^2)+eps)*weight",
    "swiglu": "silu(x @ w1^T) * (x @ w3^T)",
}
# The MindSpeed-LLM (PyTorch + torch_npu) flag that turns on the same CANN kernel there.
MINDSPEED_FLAGS = {
    "attention": "--use-flash-attn",
    "rope": "--use-fused-rotary-pos-emb",
    "rmsnorm": "--use-fused-rmsnorm",
    "swiglu": "--use-fused-swiglu",
}
# The CANN operator behind each MindSpore op (what the MindSpeed flag calls through torch_npu too).
CANN_OPS = {
    "attention": "FlashAttentionScore",
    "rope": "RotaryPositionEmbedding",
    "rmsnorm": "RmsNorm",
    "swiglu": "SwiGlu",
}
# The signature port calls each MindSpore op with (MindSpore <= 2.10): the version guard's reference.
EXPECTED_SIGNATURES = {
    "attention": ("flash_attention_score", ("query", "key", "value", "head_num", "attn_mask", "scalar_value",
                                            "input_layout", "sparse_mode", "actual_seq_qlen", "actual_seq_kvlen",
                                            "next_tokens")),
    "rope": ("rotary_position_embedding", ("x", "cos", "sin", "mode")),
    "rmsnorm": ("rms_norm", ("x", "gamma", "epsilon")),
    "swiglu": ("swiglu", ("input", "dim")),
}


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    kernel: str
    impl: str  # "fused" (Ascend), "cpu" (attention on the CPU) or "reference"
    op: str
    reason: str

    @property
    def fused(self) -> bool:
        return self.impl == "fused"

    @property
    def mindspeed_flag(self) -> str:
        return MINDSPEED_FLAGS[self.kernel]

    def row(self, layer) -> dict:
        return {"layer": layer, "kernel": self.kernel, "impl": self.impl, "op": self.op, "reason": self.reason,
                "mindspeed_flag": self.mindspeed_flag, "cann_op": CANN_OPS[self.kernel]}


@dataclasses.dataclass(frozen=True)
class KernelSelection:
    """Which implementation every layer's kernels run, and why. Same for all layers of a model."""

    attention: KernelChoice
    rope: KernelChoice
    rmsnorm: KernelChoice
    swiglu: KernelChoice
    device: str
    compute_dtype: str
    mindspeed_available: bool
    qk_norm: bool = False   # Qwen3: the per-head q/k RMSNorm runs the RMSNorm choice too (one more row a layer)

    def choices(self) -> list[KernelChoice]:
        return [self.attention, self.rope, self.rmsnorm, self.swiglu]

    def rows(self, num_layers: int) -> list[dict]:
        """One row per layer and kernel (Qwen3: and one for the per-head q/k norms), then the final norm
        (model.kernel_report, `port ops zoo`)."""
        rows = []
        for i in range(num_layers):
            rows += [c.row(i) for c in self.choices()]
            if self.qk_norm:
                rows.append({**self.rmsnorm.row(i), "site": "q/k heads (q_layernorm, k_layernorm before RoPE)"})
        return rows + [self.rmsnorm.row("final")]

    def as_dict(self) -> dict:
        return {
            "device": self.device, "compute_dtype": self.compute_dtype,
            "mindspeed_available": self.mindspeed_available, "mindspeed": mindspeed_note(self.mindspeed_available),
            "kernels": {c.kernel: {**dataclasses.asdict(c), "mindspeed_flag": c.mindspeed_flag,
                                   "cann_op": CANN_OPS[c.kernel]} for c in self.choices()},
        }


def current_device() -> str:
    import mindspore as ms

    return str(ms.get_context("device_target"))


def mindspeed_available() -> bool:
    # MindSpeed is installed from source on Ascend machines only; never required.
    return importlib.util.find_spec("mindspeed") is not None


def mindspeed_note(available: bool) -> str:
    """What an importable MindSpeed adds to a port run: nothing is taken from it, and it says so."""
    if not available:
        return ("mindspeed is not installed; port does not need it: its Llama kernel flags map onto the "
                "MindSpore ops above, which port calls natively")
    return ("mindspeed is importable, but port does not use it: MindSpeed patches Megatron/PyTorch through "
            "torch_npu, port calls the same CANN kernels through MindSpore. Relevant to a PyTorch baseline run "
            "on the same machine (porting/baseline), with the flags named per kernel here")


def signature_problem(kernel: str, namespace=None) -> str | None:
    """Why the installed MindSpore's op for ``kernel`` cannot be called the way port calls it (None: it can).

    ``namespace``: where the op is looked up, ``mindspore.ops`` unless a test passes another one.
    """
    import inspect

    if namespace is None:
        from mindspore import ops as namespace
    name, wanted = EXPECTED_SIGNATURES[kernel]
    fn = getattr(namespace, name, None)
    if fn is None:
        return f"this MindSpore has no ops.{name}"
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return f"ops.{name}'s signature cannot be read"
    if kernel == "rmsnorm":
        # (x, gamma, epsilon) -> (y, rstd); the announced (input, normalized_shape, weight, eps) returns y only.
        if params[:3] != list(wanted):
            return (f"ops.{name}{tuple(params)} is not the (x, gamma, epsilon) -> (y, rstd) form port indexes "
                    "(MindSpore > 2.10 changes its signature and return value)")
        return None
    missing = [p for p in wanted if p not in params]
    if missing:
        return f"ops.{name}{tuple(params)} lacks {missing}"
    positional = {"attention": 4, "rope": 4, "swiglu": 2}[kernel]   # the arguments port passes by position
    if params[:positional] != list(wanted[:positional]):
        return f"ops.{name}{tuple(params)}: its first arguments are not {wanted[:positional]}"
    return None


def _fused_constraints(kernel: str, cfg: LlamaConfig, compute_dtype: str) -> list[str]:
    """Documented constraints of the fused op that this model violates (empty = allowed)."""
    d, n, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    bad: list[str] = []
    if kernel == "attention":
        if compute_dtype not in FUSED_DTYPES_ATTENTION:
            bad.append(f"compute dtype {compute_dtype} (FlashAttentionScore takes float16/bfloat16)")
        if d % 16 or d > 512:
            bad.append(f"head_dim {d} (must be a multiple of 16 and <= 512)")
        if n > 256:
            bad.append(f"num_attention_heads {n} (must be <= 256)")
        if n % nkv:
            bad.append(f"num_key_value_heads {nkv} must divide num_attention_heads {n}")
    elif kernel == "swiglu":
        if cfg.hidden_act not in ("silu", "swish"):
            bad.append(f"hidden_act {cfg.hidden_act} (SwiGLU is silu-gated)")
    elif kernel == "rope":
        if d % 2 or d >= 896:
            bad.append(f"head_dim {d} (must be even and < 896)")
        if n >= 1000:
            bad.append(f"num_attention_heads {n} (must be < 1000)")
    return bad


def select_kernels(cfg: LlamaConfig, *, device: str | None = None, compute_dtype: str = "float32",
                   override: Mapping[str, str] | None = None, namespace=None) -> KernelSelection:
    """Pick fused (Ascend), cpu (port's C++ CPU kernels, float32) or reference for each kernel;
    ``override`` maps kernel -> auto|fused|reference|cpu. ``namespace``: where the version guards look
    the fused ops up (``mindspore.ops`` by default)."""
    device = device or current_device()
    override = dict(override or {})
    unknown = sorted(set(override) - set(KERNELS))
    if unknown:
        raise KernelError(f"kernel override: unknown kernel(s) {unknown}; expected some of {list(KERNELS)}")
    picks = {}
    for kernel in KERNELS:
        want = override.get(kernel, "auto")
        if want not in CHOICES:
            raise KernelError(f"kernel override {kernel}={want!r}: expected one of {list(CHOICES)}")
        bad = _fused_constraints(kernel, cfg, compute_dtype)
        guard = signature_problem(kernel, namespace) if device == "Ascend" and want in ("auto", "fused") else None
        if want == "reference":
            picks[kernel] = KernelChoice(kernel, "reference", REFERENCE_OPS[kernel], "forced by override")
        elif want == CPU_IMPL:
            picks[kernel] = _cpu_choice(kernel, device, compute_dtype, forced=True)
        elif want == "auto" and device == "CPU" and compute_dtype == "float32" and kernel in cpu_kernels.OPS \
                and cpu_kernels.available():
            picks[kernel] = _cpu_choice(kernel, device, compute_dtype, forced=False)
        elif want == "fused":
            if device != "Ascend":
                raise KernelError(
                    f"kernel override {kernel}=fused: {FUSED_OPS[kernel]} is registered only on Ascend, "
                    f"this device is {device}; use {kernel}=reference or auto")
            if bad:
                raise KernelError(f"kernel override {kernel}=fused: not allowed for this model: "
                                  + "; ".join(bad) + f"; use {kernel}=reference or auto")
            if guard:
                raise KernelError(f"kernel override {kernel}=fused: version guard: {guard}; use {kernel}=reference "
                                  "or auto")
            picks[kernel] = KernelChoice(kernel, "fused", FUSED_OPS[kernel], "forced by override")
        elif device != "Ascend":
            why = f"device is {device}; the fused kernel is registered only on Ascend"
            if device == "CPU" and kernel not in cpu_kernels.OPS:
                why += "; port has no CPU kernel for it"
            elif device == "CPU":
                why += (f"; port's CPU kernel takes float32, the compute dtype is {compute_dtype}"
                        if compute_dtype != "float32" else f"; port's CPU kernel: {cpu_kernels.status()[1]}")
            picks[kernel] = KernelChoice(kernel, "reference", REFERENCE_OPS[kernel], why)
        elif bad:
            picks[kernel] = KernelChoice(kernel, "reference", REFERENCE_OPS[kernel],
                                         "fused kernel constraints not met: " + "; ".join(bad))
        elif guard:
            picks[kernel] = KernelChoice(kernel, "reference", REFERENCE_OPS[kernel], f"version guard: {guard}")
        else:
            why = "Ascend, documented constraints met"
            if kernel == "rope":
                why += " (falls back per call when batch >= 1000 or BNSD with B*N > 8*S and 32-byte-aligned head_dim)"
            picks[kernel] = KernelChoice(kernel, "fused", FUSED_OPS[kernel], why)
    return KernelSelection(attention=picks["attention"], rope=picks["rope"], rmsnorm=picks["rmsnorm"],
                           swiglu=picks["swiglu"], device=device, compute_dtype=compute_dtype,
                           mindspeed_available=mindspeed_available(), qk_norm=bool(getattr(cfg, "qk_norm", False)))


def _cpu_choice(kernel: str, device: str, compute_dtype: str, forced: bool) -> KernelChoice:
    """port's C++ CPU kernel, or a KernelError saying why it cannot run here."""
    bad = []
    if kernel not in cpu_kernels.OPS:
        bad.append(f"port has no CPU kernel for {kernel} (it has {sorted(cpu_kernels.OPS)})")
    if device != "CPU":
        bad.append(f"it runs on the CPU, this device is {device}")
    if compute_dtype != "float32":
        bad.append(f"it takes float32, the compute dtype is {compute_dtype}")
    if not bad:
        lib, why = cpu_kernels.status()
        if lib is None:
            bad.append(why)
    if bad:
        raise KernelError(f"kernel override {kernel}={CPU_IMPL}: " + "; ".join(bad)
                          + f"; use {kernel}=reference or auto")
    why = "forced by override" if forced else \
        "CPU, float32: port's C++ kernel (the fused kernel is registered only on Ascend)"
    return KernelChoice(kernel, CPU_IMPL, cpu_kernels.describe(kernel), why)


# ---------------------------------------------------------------------------------------------
# Argument construction for the fused ops: pure functions, so tests can check them against NumPy
# models of the documented kernel semantics without an NPU.

_CAUSAL_2048: np.ndarray | None = None


def compressed_causal_mask() -> np.ndarray:
    """The optimized 2048x2048 mask that sparse_mode 2/3/4 require: 1 (discard) above the diagonal."""
    global _CAUSAL_2048
    if _CAUSAL_2048 is None:
        _CAUSAL_2048 = np.triu(np.ones((2048, 2048), dtype=np.uint8), k=1)
    return _CAUSAL_2048


def attention_sparse_mode(q_len: int, kv_len: int) -> int:
    """2 (left-up causal) when queries and keys have the same length, 3 (right-down causal) when a KV
    cache makes the keys longer. Graph-safe (reached from ``construct`` with static lengths): it never
    raises; :func:`check_attention_lengths` is the host-side check, run before a graph is built."""
    return 2 if q_len == kv_len else 3


def check_attention_lengths(q_len: int, kv_len: int) -> None:
    """Host-side (PyNative / build time) check of a causal attention call's lengths."""
    if q_len > kv_len:
        raise KernelError(f"flash attention: query length {q_len} exceeds key length {kv_len}")


def flash_attention_kwargs(*, num_heads: int, head_dim: int, q_len: int, kv_len: int) -> dict:
    """Keyword arguments for ``ops.flash_attention_score`` on BNSD causal self-attention (host side:
    checks the lengths, so it is not for ``construct``; the cells use :func:`attention_sparse_mode`).

    Query and key of equal length use left-up causal (sparse_mode 2). With a KV cache the queries are
    the last ``q_len`` positions of ``kv_len`` keys, which is right-down causal (sparse_mode 3).
    """
    check_attention_lengths(q_len, kv_len)
    return {
        "head_num": num_heads,
        "attn_mask": compressed_causal_mask(),
        "scalar_value": float(head_dim) ** -0.5,
        "input_layout": "BNSD",
        "sparse_mode": attention_sparse_mode(q_len, kv_len),
        "keep_prob": 1.0,
    }


def rope_fused_allowed(batch: int, heads: int, seq: int, head_dim: int, itemsize: int) -> bool:
    """Per-call check of ops.rotary_position_embedding's documented limits for BNSD mode 0."""
    if batch >= 1000 or heads >= 1000:
        return False
    aligned = (head_dim * itemsize) % 32 == 0
    return not (batch * heads > 8 * seq and aligned)
