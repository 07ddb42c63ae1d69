"""Packing (``batching.packing: true``): short examples share fixed-length rows of
``data.max_seq_length`` tokens instead of each being padded to a bucket length.

A packed row keeps every example apart, so training on it equals training on the examples one by one:
- position ids restart at 0 for each example (RoPE is taken at those positions);
- attention does not cross examples (per-row segment ids: a block-diagonal causal mask on the CPU;
  cumulative sequence ends for ``flash_attention_score``'s TND layout on Ascend);
- the first token of each example has no label, so no position predicts across a boundary (in an
  unpacked row position 0 is never a target either: the same tokens are counted).

Static shapes for graph mode: every row has the same length and exactly ``slots`` segments, so the
per-row segment tensors never change shape. A row holds at most ``slots`` examples of at most
``data.max_seq_length`` tokens in all, and is ``slots - 1`` tokens longer than that: the TND contract
forbids empty key segments, so each slot a row leaves unused becomes a segment of at least one padding
token, and those tokens are always there. ``slots`` is chosen from the data (the count in
:data:`SLOT_CHOICES` with the fewest padded tokens).

Rows are packed once, from the seed, with first fit decreasing; each epoch then shuffles the rows into
global batches, so every epoch has the same number of steps.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from model_zoo.errors import RecipeError
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.examples import MicroBatch, TokenizedData

SLOT_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def row_length(seq: int, slots: int) -> int:
    """Tokens in a packed row: ``seq`` for the examples, one more per segment past the first."""
    return seq + slots - 1


def pack_rows(lengths: np.ndarray, seq: int, slots: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """Example indices per row: first fit decreasing (longest first; equal lengths in a seeded order, or
    in file order without ``shuffle``), at most ``slots`` examples and ``seq`` tokens a row."""
    if int(lengths.max(initial=0)) > seq:
        raise RecipeError(f"packing: an example has {int(lengths.max())} tokens, more than data.max_seq_length={seq}")
    tie = np.random.default_rng([seed, 7]).permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    order = np.lexsort((tie, -np.asarray(lengths)))
    used = np.zeros(0, dtype=np.int64)
    count = np.zeros(0, dtype=np.int64)
    rows: list[list[int]] = []
    for i in order:
        n = int(lengths[i])
        fits = np.flatnonzero((count < slots) & (used + n <= seq))
        if fits.size:
            r = int(fits[0])
        else:
            r = len(rows)
            rows.append([])
            used, count = np.append(used, 0), np.append(count, 0)
        rows[r].append(int(i))
        used[r] += n
        count[r] += 1
    return rows


def choose_slots(lengths: np.ndarray, seq: int, seed: int) -> int:
    """The segment count per row (of :data:`SLOT_CHOICES`) with the fewest padded tokens in all."""
    best, best_tokens = 1, None
    for k in SLOT_CHOICES:
        tokens = len(pack_rows(lengths, seq, k, seed)) * row_length(seq, k)
        if best_tokens is None or tokens < best_tokens:
            best, best_tokens = k, tokens
    return best


def row_arrays(examples: Sequence, row: Sequence[int], seq: int, slots: int, pad_id: int, base: int):
    """(ids, labels, positions, segment ids, cumulative segment ends offset by ``base``) of one packed row
    of ``seq`` tokens (:func:`row_length`)."""
    ids = np.full(seq, pad_id, np.int32)
    labels = np.full(seq, IGNORE_INDEX, np.int32)
    pos = np.zeros(seq, np.int32)
    seg = np.zeros(seq, np.int32)
    ends: list[int] = []
    off = 0
    for slot, i in enumerate(row):
        e = examples[i]
        n = e.length
        ids[off:off + n] = e.input_ids
        labels[off:off + n] = e.labels
        labels[off] = IGNORE_INDEX          # never predicted from the previous example's last token
        pos[off:off + n] = np.arange(n, dtype=np.int32)
        seg[off:off + n] = slot
        off += n
        ends.append(base + off)
    free = seq - off
    spare = slots - len(row)
    if spare > free:
        raise RecipeError(f"packing: a row of {len(row)} examples leaves {free} padding tokens for {spare} "
                          "unused segments (rows must come from pack_rows)")
    for k in range(spare):   # padding: spare - 1 one-token segments, then the rest
        n = 1 if k < spare - 1 else seq - off
        pos[off:off + n] = np.arange(n, dtype=np.int32)
        seg[off:off + n] = len(row) + k
        off += n
        ends.append(base + off)
    if spare == 0 and off < seq:   # the last example's segment takes the padding (never a target)
        pos[off:] = np.arange(pos[off - 1] + 1, pos[off - 1] + 1 + seq - off, dtype=np.int32)
        seg[off:] = len(row) - 1
        ends[-1] = base + seq
    return ids, labels, pos, seg, ends


def pack_micro_batch(data: TokenizedData, rows: Sequence[Sequence[int]], seq: int, slots: int):
    """A :class:`MicroBatch` of packed rows, with its position / segment tensors."""
    parts = [row_arrays(data.examples, row, seq, slots, data.pad_id, r * seq) for r, row in enumerate(rows)]
    # seq here is the row length (row_length of data.max_seq_length and slots)
    x = np.stack([p[0] for p in parts])
    y = np.stack([p[1] for p in parts])
    real = sum(data.examples[i].length for row in rows for i in row)
    packed = (np.stack([p[2] for p in parts]), np.stack([p[3] for p in parts]),
              np.asarray([e for p in parts for e in p[4]], np.int64))
    return MicroBatch(x, y, int((y[:, 1:] != IGNORE_INDEX).sum()), int(real),
                      tuple(int(i) for row in rows for i in row), packed)
