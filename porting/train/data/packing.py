"""Packing (``batching.packing: true``): short examples share fixed-length rows of
``data.max_seq_length`` tokens instead of each being padded to a bucket length.

A packed row keeps every example apart, so training on it equals training on the examples one by one:
- position ids restart at 0 for each example (RoPE is taken at those positions), and padding sits at
  position 0, so ``max(position ids) + 1`` is the longest example of the batch: the length from which a
  length-dependent RoPE (dynamic, longrope) takes its frequencies, as transformers does (model_zoo/rope.py);
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

Rows are packed once, from the seed, with first fit decreasing (O(n log n), :func:`_first_fit`); each epoch then shuffles the rows into
global batches, so every epoch has the same number of steps.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from model_zoo.errors import RecipeError
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.examples import MicroBatch, TokenizedData

SLOT_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SCAN_WIDTH = 4096   # rows (or tree nodes) a query scans flat; the tree starts above this


def row_length(seq: int, slots: int) -> int:
    """Tokens in a packed row: ``seq`` for the examples, one more per segment past the first."""
    return seq + slots - 1


def pack_rows(lengths: np.ndarray, seq: int, slots: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """Example indices per row: first fit decreasing (longest first; equal lengths in a seeded order, or
    in file order without ``shuffle``), at most ``slots`` examples and ``seq`` tokens a row."""
    order = _fit_order(lengths, seq, seed, shuffle)
    row_of, _ = _first_fit(np.asarray(lengths, np.int64)[order], seq, slots)
    # each row lists its examples in the order they were placed (stable sort keeps that order)
    by_row = np.argsort(row_of, kind="stable")
    cuts = np.flatnonzero(np.diff(row_of[by_row])) + 1
    return [part.tolist() for part in np.split(order[by_row], cuts)] if len(order) else []


def _fit_order(lengths: np.ndarray, seq: int, seed: int, shuffle: bool) -> np.ndarray:
    if int(np.max(lengths, initial=0)) > seq:
        raise RecipeError(f"packing: an example has {int(np.max(lengths))} tokens, more than data.max_seq_length={seq}")
    tie = np.random.default_rng([seed, 7]).permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    return np.lexsort((tie, -np.asarray(lengths)))


def choose_slots(lengths: np.ndarray, seq: int, seed: int) -> int:
    """The segment count per row (of :data:`SLOT_CHOICES`) with the fewest padded tokens in all (the first
    such count on a tie). A count whose lower bound on rows (all tokens in full rows; ``slots`` examples a
    row) already costs as much as the best so far is not packed: it cannot win."""
    sizes = np.asarray(lengths, np.int64)[_fit_order(lengths, seq, seed, True)]
    total = int(sizes.sum())
    best, best_tokens = 1, None
    for k in SLOT_CHOICES:
        least_rows = max(-(-total // seq), -(-len(sizes) // k))
        if best_tokens is not None and least_rows * row_length(seq, k) >= best_tokens:
            continue
        tokens = _first_fit(sizes, seq, k)[1] * row_length(seq, k)
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
        seg[off:off + n] = len(row) + k   # position 0 (never a target, never attended to by an example)
        off += n
        ends.append(base + off)
    if spare == 0 and off < seq:   # the last example's segment takes the padding (never a target), at position 0
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


def _first_fit(sizes: np.ndarray, seq: int, slots: int) -> tuple[np.ndarray, int]:
    """(row of each item, rows) of first fit on ``sizes`` in the order given: each item goes to the
    lowest-numbered row with room for it (``seq`` tokens, ``slots`` items), else to a new row.

    O(n log n): a max segment tree over the rows' free room (-1 for a row with all its slots taken)
    finds the lowest row with room >= n in log(rows) steps. Items of equal size come in runs (the order
    is longest first), and a run is placed at once: the rows it uses are the first rows with room for
    one item, each filled as far as it goes (an equal item that did not fit a row never fits it later),
    found level by level in the tree for the whole run. Identical to placing the items one by one."""
    tree = _RoomTree(seq)
    row_of = np.empty(len(sizes), np.int64)
    starts = np.flatnonzero(np.concatenate(([True], sizes[1:] != sizes[:-1]))) if len(sizes) else np.zeros(0, np.int64)
    for start, end in zip(starts.tolist(), starts[1:].tolist() + [len(sizes)]):
        n, m = int(sizes[start]), int(end - start)
        rows = tree.first_rows_with_room(n, m)
        take = np.minimum(tree.room[rows] // n, slots - tree.count[rows])
        placed = np.cumsum(take)
        used = int(np.searchsorted(placed, m)) + 1 if placed.size and placed[-1] >= m else len(rows)
        rows, take = rows[:used], take[:used]
        if used and placed[used - 1] > m:
            take[-1] -= int(placed[used - 1]) - m
        done = int(take.sum())
        row_of[start:start + done] = np.repeat(rows, take)
        tree.fill(rows, take, n, slots)
        if done < m:   # the rest opens new rows, each taking as many as fit
            per = min(seq // n, slots)
            new = np.full(-(-(m - done) // per), per, np.int64)
            new[-1] = m - done - per * (len(new) - 1)
            first = tree.open(len(new))
            row_of[start + done:end] = np.repeat(np.arange(first, first + len(new)), new)
            tree.fill(np.arange(first, first + len(new)), new, n, slots)
    return row_of, tree.rows


class _RoomTree:
    """Rows' free room (``room``), items (``count``) and a max segment tree over room (-1 once full).

    Only the tree's lower levels are kept, up to the widest one of at most :data:`SCAN_WIDTH` nodes, which
    a query scans flat (one vectorised pass of constant width): a few thousand rows need no tree at all,
    and the levels above are never read."""

    def __init__(self, seq: int) -> None:
        self.seq, self.rows, self.size, self.top = seq, 0, 1, 1
        self.room = np.zeros(1, np.int64)
        self.count = np.zeros(1, np.int64)
        self.tree = np.full(2, -1, np.int64)

    def open(self, k: int) -> int:
        """Append ``k`` empty rows (growing the tree by doubling); returns the first one's number."""
        first, self.rows = self.rows, self.rows + k
        if self.rows > self.size:
            size = 1 << (self.rows - 1).bit_length()
            self.room = np.r_[self.room, np.zeros(size - self.size, np.int64)]
            self.count = np.r_[self.count, np.zeros(size - self.size, np.int64)]
            tree = np.full(2 * size, -1, np.int64)
            tree[size:size + self.size] = self.tree[self.size:]
            self.tree, self.size, self.top = tree, size, min(size, SCAN_WIDTH)
            lo = size >> 1
            while lo >= self.top:
                self.tree[lo:2 * lo] = np.maximum(self.tree[2 * lo:4 * lo:2], self.tree[2 * lo + 1:4 * lo:2])
                lo >>= 1
        self.room[first:self.rows] = self.seq
        return first

    def first_rows_with_room(self, n: int, m: int) -> np.ndarray:
        """The lowest-numbered rows (at most ``m``) with room for an item of ``n`` tokens, ascending."""
        top = self.top
        nodes = np.flatnonzero(self.tree[top:2 * top] >= n)[:m] + top
        while nodes.size and nodes[0] < self.size:
            kids = np.stack([2 * nodes, 2 * nodes + 1], axis=1).ravel()
            nodes = kids[self.tree[kids] >= n][:m]   # each holds one such row at least: m suffice
        return nodes - self.size

    def fill(self, rows: np.ndarray, take: np.ndarray, n: int, slots: int) -> None:
        """``take[i]`` items of ``n`` tokens into ``rows[i]``, and the kept levels above them updated."""
        if not len(rows):
            return
        self.room[rows] -= take * n
        self.count[rows] += take
        node = rows + self.size
        self.tree[node] = np.where(self.count[rows] < slots, self.room[rows], -1)
        while node[0] >= 2 * self.top:
            node = node >> 1
            node = node[np.concatenate(([True], node[1:] != node[:-1]))]
            self.tree[node] = np.maximum(self.tree[2 * node], self.tree[2 * node + 1])
