"""Gradient buckets port owns: data parallel's gradient reduction, one AllReduce per bucket, in graph mode and
PyNative, without MindSpore's static-graph parallel API (the auto-parallel context and ``mindspore.nn``'s gradient
reducer, retired after MindSpore 2.11; issue 48).

The buckets are the plan's (:func:`porting.train.plan.comm.flat_buckets` over the trainable parameters, in backward
order: the module docstring there); optimizer sharding reduce-scatters the same buckets
(porting/train/run/step/zero.py). A bucket's gradients are cast to the reduction dtype (float32, or the parameter
dtype with ``precision.grad_reduce_dtype: param_dtype``), flattened and concatenated into one buffer, summed over
the data-parallel group by one AllReduce, and cut back into the parameters' shapes. Summing a concatenation adds
the same numbers as summing each gradient, so the result equals the per-gradient reduction exactly
(tests/train/test_comm_fusion.py holds the losses to the reducer's path).

- :class:`GradBuckets` (graph mode, and PyNative with accumulation): the reduction after the backward, one bucket
  after another (each bucket's buffer is made after the previous bucket's AllReduce, so the ranks issue them in one
  order and one bucket's buffer is built at a time).
- :class:`OverlappedGradBuckets` (PyNative, one micro-batch a step): a hook on every parameter
  (``Tensor.register_hook``, PyNative only; present in MindSpore 2.7 through 2.11) receives its gradient as the
  backward produces it; when a bucket's last gradient has arrived its buffer is made and its AllReduce launched
  asynchronously (``mindspore.mint.distributed.all_reduce(..., async_op=True)``, in 2.7 through 2.11; the
  ``comm_func`` form is deprecated since 2.9), while the backward goes on, as PyTorch DDP's reducer and
  Megatron-LM's ``overlap_grad_reduce`` do. Buckets are launched strictly in bucket order (a bucket complete early
  waits for the ones before it), so every rank issues the same collectives in the same order (PyTorch's DDP design
  note: "always running allreduce in the bucket index order instead of actual bucket ready order"). The step waits for
  every handle after the backward. A bucket whose gradients never reached a hook (a parameter the loss does not
  use) is launched from the backward's output then.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, ops, nn
from mindspore.communication import GlobalComm
from mindspore.mint import distributed as mint_dist   # PyNative's async collectives, 2.7-2.11 (docs/versions.md)

from model_zoo.errors import RecipeError
from porting.train.plan.comm import flat_buckets
from porting.train.plan.layout import DTYPE_BYTES, Bucket

_NAMES = {ms.float32: "float32", ms.bfloat16: "bfloat16", ms.float16: "float16"}


def buckets_for(params: list[Parameter], comm_fusion, grad_fp32: bool) -> tuple[list[Bucket], object]:
    """(the buckets of these trainable parameters under ``comm_fusion``, the reduction dtype): float32, or the
    parameters' own dtype (one dtype for all of them: a bucket is one buffer)."""
    dtypes = {p.dtype for p in params}
    if not grad_fp32 and len(dtypes) > 1:
        raise RecipeError(f"precision.grad_reduce_dtype: param_dtype reduces each gradient bucket in one dtype, but "
                          f"the trainable parameters have {sorted(_NAMES.get(d, str(d)) for d in dtypes)}; set "
                          "precision.grad_reduce_dtype: float32")
    dtype = ms.float32 if grad_fp32 else params[0].dtype
    numels = [int(p.size) for p in params]
    return flat_buckets(numels, DTYPE_BYTES[_NAMES[dtype]], comm_fusion, 1), dtype


class GradBuckets(nn.Cell):
    """Sums the gradients of every bucket over ``group`` (None: the world) with one AllReduce per bucket; returns
    the gradients in parameter order, in the reduction dtype."""

    def __init__(self, params: list[Parameter], buckets: list[Bucket], dtype, group: str | None = None):
        super().__init__(auto_prefix=False)
        self.bucket_idx = tuple(tuple(b.indices) for b in buckets)
        self.dtype = dtype
        self.shapes = tuple(tuple(p.shape) for p in params)
        self.numels = tuple(int(p.size) for p in params)
        # where each parameter's gradient sits: (bucket, offset in the bucket's buffer)
        where = {}
        for k, idx in enumerate(self.bucket_idx):
            off = 0
            for i in idx:
                where[i] = (k, off)
                off += self.numels[i]
        self.where = tuple(where[i] for i in range(len(params)))
        self.group = group
        self.bucket_sum = ops.AllReduce(ops.ReduceOp.SUM, group) if group else ops.AllReduce(ops.ReduceOp.SUM)

    def describe(self) -> str:
        sizes = [sum(self.numels[i] for i in idx) for idx in self.bucket_idx]
        return (f"{len(self.bucket_idx)} gradient bucket(s) of {len(self.numels)} gradients, one AllReduce each, "
                f"largest {max(sizes, default=0)} elements, in backward order")

    def _flat(self, grads, k: int, after=None):
        """Bucket ``k``'s gradients as one flat buffer in the reduction dtype, made after ``after`` when given."""
        parts = ()
        for i in self.bucket_idx[k]:
            g = grads[i] if after is None or parts else ops.depend(grads[i], after)
            parts += (ops.reshape(ops.cast(g, self.dtype), (-1,)),)
        return ops.concat(parts) if len(parts) > 1 else parts[0]

    def _cut(self, sums):
        """The summed buffers cut back into every parameter's gradient, in parameter order."""
        out = ()
        for i in range(len(self.where)):
            k, off = self.where[i]
            flat = sums[k] if len(self.bucket_idx[k]) == 1 else sums[k][off:off + self.numels[i]]
            out += (ops.reshape(flat, self.shapes[i]),)
        return out

    def construct(self, grads):
        sums = ()
        for k in range(len(self.bucket_idx)):
            sums += (self.bucket_sum(self._flat(grads, k, sums[-1] if sums else None)),)
        return self._cut(sums)


class _Backward:
    """What one step's backward has handed over so far (plain Python: no Cell attribute magic)."""

    def __init__(self, buckets: tuple[tuple[int, ...], ...]):
        self.ready: dict = {}                            # gradients of buckets not launched yet, by parameter
        self.missing = [len(idx) for idx in buckets]     # gradients each bucket still waits for
        self.next = 0                                    # the next bucket to launch
        self.pending: list = []                          # (buffer, handle) of the launched buckets, in order
        self.armed = False


class OverlappedGradBuckets(GradBuckets):
    """PyNative: each bucket's AllReduce launched from the backward as its last gradient arrives (module docstring).
    :meth:`armed` wraps the step's gradient function: only a backward run through it launches anything (the same
    parameters' backward elsewhere, the accumulation step's or a test's, is left alone)."""

    def __init__(self, params: list[Parameter], buckets: list[Bucket], dtype, group: str | None = None):
        super().__init__(params, buckets, dtype, group)
        self._bucket_of = {i: k for k, idx in enumerate(self.bucket_idx) for i in idx}
        self._state = _Backward(self.bucket_idx)
        self.launched_in_backward = 0   # buckets the last step's hooks launched (the rest waited for its end)
        self._hooks = tuple(p.register_hook(self._hook(i)) for i, p in enumerate(params))
        self.tap = None   # port diverge's fingerprints of each bucket's input and output (fingerprint_collective.py)

    def armed(self, grad_fn):
        """``grad_fn`` with this reducer listening to its backward."""
        def run(*args):
            self._state = _Backward(self.bucket_idx)
            self._state.armed = True
            try:
                return grad_fn(*args)
            finally:
                self._state.armed = False
                self.launched_in_backward = self._state.next
        return run

    def _hook(self, i: int):
        def hook(grad):
            st = self._state
            if st.armed and i not in st.ready:
                st.ready[i] = grad
                st.missing[self._bucket_of[i]] -= 1
                while st.next < len(self.bucket_idx) and st.missing[st.next] == 0:
                    self._launch(st, st.ready)
            return grad   # unchanged (MindSpore asks a hook to return the gradient: Tensor.register_hook docs)
        return hook

    def _launch(self, st: _Backward, grads) -> None:
        """Bucket ``st.next``'s buffer made and its AllReduce started (in place, asynchronously)."""
        k, tap = st.next, self.tap
        if tap is not None:   # port diverge's fingerprints (porting/train/run/fingerprint_collective.py)
            grads = tap.local(k, grads)
        flat = self._flat(grads, k)
        if len(self.bucket_idx[k]) == 1:
            # a buffer of its own: a one-gradient bucket's flat view shares the gradient's storage, and MindSpore
            # 2.7.2's in-place all_reduce leaves such a view unreduced without an error (2.10 reduces it; measured
            # under msrun on the CPU: tests/train/test_comm_fusion.py fails on 2.7.2 without this copy)
            flat = flat.copy()
        if tap is not None:
            tap.before(k, flat)
        handle = mint_dist.all_reduce(flat, group=self.group or GlobalComm.WORLD_COMM_GROUP, async_op=True)
        st.pending.append((flat, handle))
        for i in self.bucket_idx[k]:
            st.ready.pop(i, None)   # the bucket's buffer holds them now
        st.next += 1

    def describe(self) -> str:
        return super().describe() + "; PyNative: each launched during the backward as its last gradient arrives"

    def construct(self, grads):
        st = self._state
        while st.next < len(self.bucket_idx):   # gradients no hook saw: launched from the backward's output
            self._launch(st, grads)
        sums = ()
        for k, (flat, handle) in enumerate(st.pending):
            if handle is not None:
                handle.wait()
            if self.tap is not None:
                flat = self.tap.after(k, flat)
            sums += (flat,)
        self._state = _Backward(self.bucket_idx)
        return self._cut(sums)
