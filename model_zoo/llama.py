"""The Llama family as MindSpore cells.

Parameter names follow MindFormers' Llama (``model.tok_embeddings.embedding_weight``,
``model.layers.{i}.attention.wq.weight``, ``feed_forward.w1/w2/w3``, ``attention_norm``,
``ffn_norm``, ``model.norm_out.weight``, ``lm_head.weight``) so a converted checkpoint also loads in
MindFormers. Linear weights keep HF's (out_features, in_features) layout, and q/k rows stay in HF's
rotate-half order, which is what the fused RoPE's mode 0 expects: conversion is a rename.

The same cell runs in PyNative and graph mode. ``construct(input_ids)`` returns logits; generation
with a KV cache is :mod:`model_zoo.decode`, and the cells over port's CPU kernels are :mod:`model_zoo.cpu_cells`.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Mapping

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import Normal, initializer

from model_zoo import kernels, parallel, rope
from model_zoo.config import LlamaConfig, divisibility_problems
from model_zoo.cpu_cells import CpuCausalAttention, CpuPackedAttention, CpuRope
from model_zoo.errors import ConfigError
from model_zoo.fused_ops import FUSED_OPS, fused_ops_replaced  # noqa: F401 (the test hook, also as llama.*)
from model_zoo.kernels import KernelSelection
from model_zoo.linear import Linear, deferred_parameters
from model_zoo.norms import HeadNorm, RMSNorm, norm_for
from model_zoo.parallel import TensorParallel
from model_zoo.rope_packed import PackedRope

_DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


def ms_dtype(name: str) -> ms.Type:
    return _DTYPES[name]


def _column(tp: TensorParallel | None, *args) -> nn.Cell:
    return Linear(*args) if tp is None else parallel.ColumnParallelLinear(*args, tp=tp)


def _row(tp: TensorParallel | None, *args) -> nn.Cell:
    return Linear(*args) if tp is None else parallel.RowParallelLinear(*args, tp=tp)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return ops.cat((-x[..., half:], x[..., :half]), -1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, fused: bool, op: Callable | None = None) -> Tensor:
    """x: (B, N, S, D); cos/sin: (S, D) float32 tables, or (B, S, D) taken at each row's positions (packed
    rows). ``op``: the fused RoPE (default FUSED_OPS')."""
    b, n, s, d = x.shape
    rows = b if len(cos.shape) == 3 else 1
    cos = ops.cast(cos, x.dtype).reshape(rows, 1, s, d)
    sin = ops.cast(sin, x.dtype).reshape(rows, 1, s, d)
    if fused and kernels.rope_fused_allowed(b, n, s, d, _itemsize(x.dtype)):
        rope = FUSED_OPS["rotary_position_embedding"] if op is None else op
        return rope(x, cos, sin, 0)
    return x * cos + rotate_half(x) * sin


@ops.constexpr
def _rope_tables_of_length(args: tuple, s: int) -> tuple[Tensor, Tensor]:
    """cos and sin for a call over ``s`` positions past a length-dependent type's threshold (model_zoo/rope.py
    call_tables), run by Python when a graph compiles (``s`` is static there) and held as constants:
    ``ops.constexpr`` works on MindSpore 2.7, whose graph parser cannot run NumPy's operators on arrays
    itself (its multitype ``div`` of a float by an ndarray raises), as on 2.10, which folds them."""
    cos, sin = rope.call_tables(args, s)
    return Tensor(cos), Tensor(sin)


def _itemsize(dtype: ms.Type) -> int:
    return 4 if dtype == ms.float32 else 2


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    if n_rep == 1:
        return x
    b, nkv, t, d = x.shape
    x = ops.broadcast_to(ops.expand_dims(x, 2), (b, nkv, n_rep, t, d))
    return ops.reshape(x, (b, nkv * n_rep, t, d))


def reference_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, n_rep: int, q_offset: int,
                        segment_ids: Tensor | None = None) -> Tensor:
    """Causal attention in plain ops. q: (B, N, S, D); k, v: (B, Nkv, T, D); query i sits at position
    q_offset + i. Scores and softmax in float32, as HF's eager attention does. ``segment_ids`` (B, S)
    (packed rows, S == T): a query sees only keys of its own segment (a block-diagonal causal mask)."""
    k = repeat_kv(k, n_rep)
    v = repeat_kv(v, n_rep)
    s, t = q.shape[2], k.shape[2]
    scores = ops.BatchMatMul(transpose_b=True)(ops.cast(q, ms.float32), ops.cast(k, ms.float32)) * scale
    mask = ops.triu(ops.ones((s, t), ms.float32), diagonal=1 + q_offset)
    if segment_ids is not None:
        apart = ops.cast(ops.expand_dims(segment_ids, 2) != ops.expand_dims(segment_ids, 1), ms.float32)
        mask = ops.expand_dims(ops.maximum(mask, apart), 1)   # (B, 1, S, T)
    scores = scores - mask * 1e30
    probs = ops.cast(ops.softmax(scores, -1), v.dtype)
    return ops.BatchMatMul()(probs, v)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, num_heads: int) -> Tensor:
    """FlashAttentionScore in BNSD; GQA is native (N2 divides N1), so k/v are not repeated."""
    kw = kernels.flash_attention_kwargs(num_heads=num_heads, head_dim=q.shape[-1],
                                        q_len=q.shape[2], kv_len=k.shape[2])
    kw["attn_mask"] = _causal_mask_tensor()
    return FUSED_OPS["flash_attention_score"](q, k, v, **kw)


_MASK: list = []


def _causal_mask_tensor() -> Tensor:
    # One 4 MiB constant shared by every layer (and every graph) instead of one per call.
    if not _MASK:
        _MASK.append(Tensor(kernels.compressed_causal_mask()))
    return _MASK[0]


class Attention(nn.Cell):
    def __init__(self, cfg: LlamaConfig, plan: KernelSelection, param_dtype: ms.Type, compute_dtype: ms.Type,
                 tp: TensorParallel | None = None):
        super().__init__()
        h = cfg.hidden_size
        ways = tp.size if tp is not None else 1   # tensor parallel: this rank's heads and KV heads
        self.n_heads = cfg.num_attention_heads // ways
        self.n_kv = cfg.num_key_value_heads // ways
        self.head_dim = cfg.head_dim
        self.rotary_dim = cfg.rotary_dim   # Phi-4-mini: 96 of 128 (partial_rotary_factor); the rest passes through
        self.n_rep = self.n_heads // self.n_kv
        self.scale = float(self.head_dim) ** -0.5
        self.fused_attention = plan.attention.fused
        if self.fused_attention:  # ops and constants fixed at build time: nothing in construct can fail
            self.flash_attention = FUSED_OPS["flash_attention_score"]
            self.attn_mask = _causal_mask_tensor()
        self.cpu_attention = CpuCausalAttention() if plan.attention.impl == kernels.CPU_IMPL else None
        self.cpu_packed = CpuPackedAttention() if plan.attention.impl == kernels.CPU_IMPL else None
        self.fused_rope = plan.rope.fused
        self.cpu_rope = CpuRope() if plan.rope.impl == kernels.CPU_IMPL else None
        self.rope_op = FUSED_OPS["rotary_position_embedding"] if self.fused_rope else None
        self.wq = _column(tp, h, cfg.q_size, cfg.qkv_bias, param_dtype, compute_dtype)
        self.wk = _column(tp, h, cfg.kv_size, cfg.qkv_bias, param_dtype, compute_dtype)
        self.wv = _column(tp, h, cfg.kv_size, cfg.qkv_bias, param_dtype, compute_dtype)
        self.wo = _row(tp, cfg.q_size, h, cfg.o_bias, param_dtype, compute_dtype)
        # Qwen3: q/k RMSNorm per head before RoPE. Names from MindSpore Transformers' Qwen3
        # (mindformers/models/qwen3/utils.py weight_mapping: self_attn.q_norm -> self_attention.q_layernorm).
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_layernorm = HeadNorm(cfg.head_dim, cfg.rms_norm_eps, param_dtype, plan.rmsnorm.impl, tp)
            self.k_layernorm = HeadNorm(cfg.head_dim, cfg.rms_norm_eps, param_dtype, plan.rmsnorm.impl, tp)

    def _heads(self, x: Tensor, n: int, norm: nn.Cell | None = None) -> Tensor:
        b, s, _ = x.shape
        x = ops.reshape(x, (b, s, n, self.head_dim))
        if norm is not None:   # over head_dim, on the (B, S, N, D) view as transformers' Qwen3Attention
            x = norm(x)
        return ops.transpose(x, (0, 2, 1, 3))

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.rotary_dim != self.head_dim:   # transformers' Phi3 apply_rotary_pos_emb: rotate, then pass the rest
            return ops.cat((self._rotate(x[..., :self.rotary_dim], cos, sin), x[..., self.rotary_dim:]), -1)
        return self._rotate(x, cos, sin)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.cpu_rope is not None and x.dtype == ms.float32 and len(cos.shape) == 2:
            return self.cpu_rope(x, cos, sin)
        return apply_rope(x, cos, sin, self.fused_rope, self.rope_op)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q_norm = self.q_layernorm if self.qk_norm else None
        k_norm = self.k_layernorm if self.qk_norm else None
        q = self._rope(self._heads(self.wq(x), self.n_heads, q_norm), cos, sin)
        k = self._rope(self._heads(self.wk(x), self.n_kv, k_norm), cos, sin)
        v = self._heads(self.wv(x), self.n_kv)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_offset: int, segment_ids: Tensor | None = None,
               seq_ends: Tensor | None = None) -> Tensor:
        """Causal attention; with ``segment_ids`` (B, S) and ``seq_ends`` (packed rows) per example."""
        if segment_ids is not None:
            return self.wo(self._attend_packed(q, k, v, segment_ids, seq_ends))
        if self.fused_attention:
            # Static lengths in graph mode; the host checked them (decode.forward_cached) before any call.
            out = self.flash_attention(q, k, v, self.n_heads, attn_mask=self.attn_mask, scalar_value=self.scale,
                                       input_layout="BNSD",
                                       sparse_mode=kernels.attention_sparse_mode(q.shape[2], k.shape[2]))
        elif self.cpu_attention is not None and q_offset == 0 and q.shape[2] == k.shape[2]:
            out = self.cpu_attention(q, k, v)
        else:  # also the KV-cache path of the CPU kernel's models: queries shorter than keys
            out = reference_attention(q, k, v, self.scale, self.n_rep, q_offset)
        b, n, s, d = out.shape
        return self.wo(ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (b, s, n * d)))

    def _attend_packed(self, q: Tensor, k: Tensor, v: Tensor, segment_ids: Tensor, seq_ends: Tensor) -> Tensor:
        """(B, S, N*D) attention within each example of packed rows. Ascend: FlashAttentionScore in TND
        (T = B*S tokens) with ``seq_ends``, the cumulative example ends, as actual_seq_qlen/kvlen."""
        b, n, s, d = q.shape
        if self.fused_attention:
            def tnd(x):
                return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (b * s, x.shape[1], d))

            # TND contract: sparse_mode 2/3 with the compressed causal mask, next_tokens 0,
            # pre_tokens >= the longest example (the default INT_MAX).
            out = self.flash_attention(tnd(q), tnd(k), tnd(v), self.n_heads, attn_mask=self.attn_mask,
                                       actual_seq_qlen=seq_ends, actual_seq_kvlen=seq_ends,
                                       scalar_value=self.scale, next_tokens=0, input_layout="TND", sparse_mode=3)
            return ops.reshape(out, (b, s, n * d))
        if self.cpu_packed is not None:
            out = self.cpu_packed(q, k, v, segment_ids)
        else:
            out = reference_attention(q, k, v, self.scale, self.n_rep, 0, segment_ids)
        return ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (b, s, n * d))

    def construct(self, x: Tensor, cos: Tensor, sin: Tensor, segment_ids: Tensor | None = None,
                  seq_ends: Tensor | None = None) -> Tensor:
        q, k, v = self.project(x, cos, sin)
        return self.attend(q, k, v, 0, segment_ids, seq_ends)


class FeedForward(nn.Cell):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate_proj, w2 = down_proj, w3 = up_proj.

    Fused (Ascend, MindSpeed-LLM's --use-fused-swiglu): one matmul with [w1; w3] concatenated at compute
    time, then ``ops.swiglu`` (silu of the first half times the second); w1 and w3 stay separate
    parameters, so checkpoints and the converters' names do not change."""

    def __init__(self, cfg: LlamaConfig, param_dtype: ms.Type, compute_dtype: ms.Type, impl: str = "reference",
                 tp: TensorParallel | None = None):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.w1 = _column(tp, h, i, cfg.mlp_bias, param_dtype, compute_dtype)
        self.w2 = _row(tp, i, h, cfg.mlp_bias, param_dtype, compute_dtype)
        self.w3 = _column(tp, h, i, cfg.mlp_bias, param_dtype, compute_dtype)
        i = i // (tp.size if tp is not None else 1)   # this rank's intermediate rows (the fused path's reshape)
        self.fused = impl == "fused"
        self.swiglu_op = FUSED_OPS["swiglu"] if self.fused else None
        self.bias = cfg.mlp_bias
        self.hidden, self.inter, self.compute_dtype = h, i, compute_dtype
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, x: Tensor) -> Tensor:
        if self.fused:
            shape = x.shape
            x2 = ops.reshape(ops.cast(x, self.compute_dtype), (-1, self.hidden))
            if self.w1.lora_on or self.w3.lora_on:   # LoRA layers (model_zoo/lora.py): each its own forward
                gate_up = ops.cat((self.w1(x2), self.w3(x2)), -1)
            else:
                w = ops.cat((ops.cast(self.w1.weight, self.compute_dtype), ops.cast(self.w3.weight, self.compute_dtype)), 0)
                gate_up = self.matmul(x2, w)
                if self.bias:
                    gate_up = gate_up + ops.cast(ops.cat((self.w1.bias, self.w3.bias), 0), self.compute_dtype)
            y = self.swiglu_op(gate_up, -1)
            return self.w2(ops.reshape(y, shape[:-1] + (self.inter,)))
        return self.w2(ops.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: LlamaConfig, plan: KernelSelection, param_dtype: ms.Type, compute_dtype: ms.Type,
                 tp: TensorParallel | None = None):
        super().__init__()
        norm = plan.rmsnorm.impl
        self.attention_norm = norm_for(cfg, param_dtype, norm, tp)
        self.attention = Attention(cfg, plan, param_dtype, compute_dtype, tp)
        self.ffn_norm = norm_for(cfg, param_dtype, norm, tp)
        self.feed_forward = FeedForward(cfg, param_dtype, compute_dtype, plan.swiglu.impl, tp)

    def construct(self, x: Tensor, cos: Tensor, sin: Tensor, segment_ids: Tensor | None = None,
                  seq_ends: Tensor | None = None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, segment_ids, seq_ends)
        return h + self.feed_forward(self.ffn_norm(h))


class Embedding(nn.Cell):
    def __init__(self, vocab: int, dim: int, param_dtype: ms.Type, compute_dtype: ms.Type):
        super().__init__()
        self.embedding_weight = Parameter(initializer(Normal(0.02), (vocab, dim), param_dtype), name="embedding_weight")
        self.compute_dtype = compute_dtype

    def construct(self, ids: Tensor) -> Tensor:
        w = self.embedding_weight
        if w.dtype != self.compute_dtype:
            # Cast, then gather: the same numbers as gather-then-cast, and the CPU backend has no
            # bfloat16 Gather (bf16 parameters with fp16/fp32 compute run there).
            w = ops.cast(w, self.compute_dtype)
        return ops.gather(w, ids, 0)


class LlamaModel(nn.Cell):
    def __init__(self, cfg: LlamaConfig, plan: KernelSelection, param_dtype: ms.Type, compute_dtype: ms.Type,
                 tp: TensorParallel | None = None):
        super().__init__()
        self.tok_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size, param_dtype, compute_dtype) if tp is None \
            else parallel.VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, param_dtype, compute_dtype, tp)
        self.layers = nn.CellList([DecoderLayer(cfg, plan, param_dtype, compute_dtype, tp)
                                   for _ in range(cfg.num_hidden_layers)])
        self.norm_out = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype, plan.rmsnorm.impl)
        self.pad_id = cfg.pad_token_id

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings. With a pad_token_id, as transformers' nn.Embedding(padding_idx=pad_token_id):
        the same values, but the pad row gets no gradient from the lookup (Phi-3's config sets 32000)."""
        x = self.tok_embeddings(ids)
        if self.pad_id is not None:
            x = ops.select(ops.expand_dims(ids == self.pad_id, -1), ops.stop_gradient(x), x)
        return x

    def construct(self, ids: Tensor, cos: Tensor, sin: Tensor, segment_ids: Tensor | None = None,
                  seq_ends: Tensor | None = None) -> Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, segment_ids, seq_ends)
        return self.norm_out(x)


class LlamaForCausalLM(nn.Cell):
    """Logits from token ids. Build it with :func:`model_zoo.build`."""

    def __init__(self, cfg: LlamaConfig, plan: KernelSelection, param_dtype: str = "float32",
                 compute_dtype: str | None = None, tp: TensorParallel | None = None):
        super().__init__()
        self.config = cfg
        self.plan = plan
        pdt, cdt = ms_dtype(param_dtype), ms_dtype(compute_dtype or param_dtype)
        self.param_dtype, self.compute_dtype = pdt, cdt
        self.tp = tp
        self.model = LlamaModel(cfg, plan, pdt, cdt, tp)
        self.tied = cfg.tie_word_embeddings
        self.window = cfg.sliding_window or 0
        if not self.tied:
            # Tensor parallel: the LM head is column (vocabulary) parallel; its logits stay vocab-sharded.
            self.lm_head = _column(tp, cfg.hidden_size, cfg.vocab_size, False, pdt, cdt)
        if tp is None:
            self.logits_matmul = ops.MatMul(transpose_b=True)
        else:
            self.logits_matmul = parallel.ParallelLogits(tp)
            # The training step's loss on vocab-sharded logits (porting/train/run/step/cells.py LossNet looks for it).
            self.parallel_loss = parallel.VocabParallelTokenLoss(tp, cfg.vocab_size)
        # RoPE tables, plain tensors (derived data, never saved); generation grows them (model_zoo.decode).
        self._rope_len = cfg.max_position_embeddings
        cos, sin = kernels.rope_tables(cfg, self._rope_len)
        self.rope_cos, self.rope_sin = Tensor(cos), Tensor(sin)
        # dynamic / longrope: a call longer than this takes the frequencies of its own length (model_zoo/rope.py)
        self.rope_threshold = rope.threshold(cfg) or 0
        self.rope_args = rope.call_args(cfg)   # plain values: a graph resolves them, not the config dataclass
        # packed rows past that threshold: the frequencies of the batch's longest document (model_zoo/rope_packed.py)
        self.packed_rope = PackedRope(cfg) if self.rope_threshold else None

    def rope_for(self, s: int) -> tuple[Tensor, Tensor]:
        """cos and sin of positions 0..s-1 for a call over ``s`` positions. Past a length-dependent type's
        threshold the table of that length is computed from the config (a constant of a graph: ``s`` is
        static there; :func:`_rope_tables_of_length`)."""
        if self.rope_threshold and s > self.rope_threshold:
            return _rope_tables_of_length(self.rope_args, s)
        return self.rope_cos[:s], self.rope_sin[:s]

    def logits(self, hidden: Tensor) -> Tensor:
        b, s, h = hidden.shape
        w = self.model.tok_embeddings.embedding_weight if self.tied else self.lm_head.weight
        out = self.logits_matmul(ops.reshape(hidden, (-1, h)), ops.cast(w, hidden.dtype))
        return ops.cast(ops.reshape(out, (b, s, -1)), ms.float32)

    def construct(self, input_ids: Tensor, positions: Tensor | None = None, segment_ids: Tensor | None = None,
                  seq_ends: Tensor | None = None) -> Tensor:
        """Logits. Packed rows (porting/train/data/packing.py) also pass ``positions`` and ``segment_ids``
        (B, S) int32 and ``seq_ends`` (cumulative example ends over the B*S tokens, int64)."""
        s = input_ids.shape[1]
        if self.window and s > self.window:  # compile-time check (static shapes); message: decode._check_length
            raise ValueError("sequence length exceeds the model's sliding_window; use shorter sequences")
        if positions is None:
            cos, sin = self.rope_for(s)
        elif self.packed_rope is not None and s > self.rope_threshold:   # length-dependent: in the graph
            cos, sin = self.packed_rope(positions)
        else:   # RoPE at each example's own positions: (B, S, D); every position is below s
            cos, sin = self.rope_for(s)
            cos, sin = ops.gather(cos, positions, 0), ops.gather(sin, positions, 0)
        return self.logits(self.model(input_ids, cos, sin, segment_ids, seq_ends))

    def hidden_states(self, input_ids: Tensor) -> list[Tensor]:
        """Embeddings, then each layer's output, the last one after the final norm (HF's layout)."""
        cos, sin = self.rope_for(input_ids.shape[1])
        x = self.model.embed(input_ids)
        out = [x]
        for layer in self.model.layers:
            x = layer(x, cos, sin)
            out.append(x)
        out[-1] = self.model.norm_out(x)
        return out

    def kernel_report(self) -> list[dict]:
        """One row per layer and kernel: which implementation runs and why, its MindSpeed-LLM flag and
        CANN op (MindSpeed itself is never used: ``self.plan.as_dict()["mindspeed"]`` says so)."""
        return self.plan.rows(self.config.num_hidden_layers)


def build(cfg: LlamaConfig, *, param_dtype: str = "float32", compute_dtype: str | None = None,
          kernels_override: Mapping[str, str] | None = None, device: str | None = None,
          seed: int | None = 0, tp: TensorParallel | None = None, defer_init: bool = False) -> LlamaForCausalLM:
    """Build a randomly initialised model; load weights with converters or ``load_param_into_net``.
    ``defer_init``: no weight is drawn (``model_zoo.linear.deferred_parameters``): the caller loads them all.

    ``tp`` (size > 1): this rank's tensor-parallel shard (:mod:`model_zoo.parallel`); heads, KV heads,
    the intermediate size and the vocabulary must divide by ``tp.size`` (ConfigError otherwise)."""
    if tp is not None and tp.size > 1:
        bad = divisibility_problems(cfg, tp.size)
        if bad:
            raise ConfigError(f"tensor parallel {tp.size} does not divide {', '.join(bad)}")
    else:
        tp = None   # one rank: exactly the plain cells
    if seed is not None:
        ms.set_seed(seed)
    plan = kernels.select_kernels(cfg, device=device, compute_dtype=compute_dtype or param_dtype,
                                  override=kernels_override)
    with deferred_parameters() if defer_init else contextlib.nullcontext():
        return LlamaForCausalLM(cfg, plan, param_dtype=param_dtype, compute_dtype=compute_dtype, tp=tp)
