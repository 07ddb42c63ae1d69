"""Framework-neutral training data: from a recipe and a tokenizer to the exact sequence of
optimizer steps, each a list of micro-batches of NumPy int32 arrays.

Both `port train` (MindSpore) and `port baseline` (PyTorch) consume these arrays, so the two runs
see the same tokens, in the same order, with the same padding. The steps are a pure function of
(data file, tokenizer, recipe, world size): nothing depends on the framework, the rank that asks,
or on where a run resumes.

How a step is made (per epoch):
1. every example is tokenised once (prompt tokens masked with -100 for instruction data; rows over
   ``data.max_seq_length`` truncated and counted, or split into windows for plain text);
2. examples go to length buckets whose padded lengths (the only shapes a graph ever sees) are
   given or chosen from the data to minimise padding (at most ``bucketing.max_shapes``);
3. the epoch order is a permutation drawn from ``seed`` and the epoch; each bucket is cut into
   global batches of ``micro x accum x world`` examples, a bucket's remainder moving up into the
   next larger bucket (the largest bucket's remainder is dropped and counted); global batches are
   then shuffled with the same generator;
4. a global batch is sorted by length and cut into ``accum x world`` micro-batches; rank r takes
   micro-batches ``r*accum .. r*accum+accum-1``. Every micro-batch of the step is padded to the smallest
   bucket length that holds the step's longest row: all data-parallel ranks (and all accumulation
   micro-batches) of one step have one shape, so no rank meets a new shape, and compiles, while the
   others wait for it in the gradient all-reduce (the waiting ranks time out).
So micro 1 x accum 4 and micro 4 x accum 1 see the same examples in each optimizer step, and
2 workers x accum 1 see the same micro-batches as 1 worker x accum 2.

MindSpore's ``bucket_batch_by_length`` is not used because it batches per bucket on one process:
it has no notion of a global batch split across ranks and accumulation steps, which is what makes
the data-parallel and accumulation runs equal step by step.

With ``batching.packing: true`` step 2 is replaced: examples are packed into rows of one length
(:mod:`porting.train.data.packing`), and the rows go through steps 3 and 4 in place of examples.

Tokenising (step 1) is :mod:`porting.train.data.tokenise`; this module is steps 2 to 4.
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from model_zoo.errors import RecipeError
from porting.train.data import packing
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.examples import MicroBatch, TokenizedData, split_eval
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import Recipe


@dataclass(frozen=True)
class Step:
    index: int                               # 0-based optimizer step
    epoch: int
    micro_batches: tuple[MicroBatch, ...]    # this rank's accumulation micro-batches, in order
    global_tokens: int                       # loss tokens over all ranks and micro-batches
    global_real_tokens: int
    global_padded_tokens: int                # B*S summed over all ranks and micro-batches

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.global_real_tokens / max(1, self.global_padded_tokens)



# --------------------------------------------------------------------------- bucketing
def _round_up(x: np.ndarray | int, m: int):
    return ((np.asarray(x) + m - 1) // m) * m


def choose_boundaries(lengths: np.ndarray, max_shapes: int, multiple: int, max_len: int) -> list[int]:
    """At most ``max_shapes`` padded lengths (multiples of ``multiple``, capped at ``max_len``) that
    minimise the total padding of ``lengths`` when each row is padded to the smallest length >= it.
    Exact dynamic programme over the distinct rounded lengths."""
    rounded = np.minimum(_round_up(lengths, multiple), max_len)
    cands = np.unique(rounded)
    if len(cands) <= max_shapes:
        return [int(c) for c in cands]
    cnt = np.array([(lengths[rounded == c]).size for c in cands], dtype=np.float64)
    tot = np.array([(lengths[rounded == c]).sum() for c in cands], dtype=np.float64)
    pc, pt = np.concatenate([[0], np.cumsum(cnt)]), np.concatenate([[0], np.cumsum(tot)])
    n = len(cands)

    def cost(i: int, j: np.ndarray | int):   # rows of candidates i..j padded to cands[j]
        return cands[j] * (pc[j + 1] - pc[i]) - (pt[j + 1] - pt[i])

    inf = float("inf")
    best = np.full((max_shapes + 1, n), inf)
    back = np.zeros((max_shapes + 1, n), dtype=np.int64)
    best[1] = [cost(0, j) for j in range(n)]
    for k in range(2, max_shapes + 1):
        for j in range(n):
            i = np.arange(1, j + 1)        # the last bucket covers candidates i..j
            if i.size == 0:
                best[k, j] = best[k - 1, j]
                back[k, j] = -1
                continue
            vals = best[k - 1, i - 1] + cands[j] * (pc[j + 1] - pc[i]) - (pt[j + 1] - pt[i])
            a = int(np.argmin(vals))
            best[k, j], back[k, j] = vals[a], i[a]
    out, j, k = [], n - 1, max_shapes
    while j >= 0 and k >= 1:
        out.append(int(cands[j]))
        if k == 1:
            break
        i = back[k, j]
        if i < 0:
            k -= 1
            continue
        j, k = i - 1, k - 1
    return sorted(set(out))


def bucket_boundaries(data: TokenizedData, recipe: Recipe) -> list[int]:
    b = recipe.batching.bucketing
    max_len = recipe.data.max_seq_length
    longest = int(data.lengths.max())
    if not b.enabled:
        return [max_len]
    if b.boundaries:
        bounds = sorted(set(int(x) for x in b.boundaries))
        if len(bounds) > b.max_shapes:
            raise RecipeError(f"batching.bucketing.boundaries: {len(bounds)} lengths but max_shapes={b.max_shapes}")
        if bounds[-1] < longest:
            bounds.append(max_len if max_len >= longest else longest)
            if len(bounds) > b.max_shapes:
                raise RecipeError(f"batching.bucketing.boundaries: the longest example has {longest} tokens, more than "
                                  f"the largest boundary {bounds[-2]}; add {max_len} to the list")
        return bounds
    return choose_boundaries(data.lengths, b.max_shapes, b.pad_to_multiple_of, max_len)


def plan_epoch(lengths: np.ndarray, boundaries: Sequence[int], global_batch: int, seed: int, epoch: int,
               shuffle: bool) -> tuple[list[list[int]], int]:
    """Global batches (example indices, sorted by length) of one epoch, and how many rows were dropped."""
    rng = np.random.default_rng([seed, epoch])
    n = len(lengths)
    order = rng.permutation(n) if shuffle else np.arange(n)
    bucket = np.searchsorted(np.asarray(boundaries), lengths, side="left")
    batches: list[list[int]] = []
    carry: list[int] = []
    for b in range(len(boundaries)):
        members = carry + [int(i) for i in order if bucket[i] == b]
        full = len(members) // global_batch * global_batch
        batches += [members[k:k + global_batch] for k in range(0, full, global_batch)]
        carry = members[full:]
    if shuffle and batches:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    batches = [sorted(g, key=lambda i: (int(lengths[i]), i)) for g in batches]
    return batches, len(carry)


def bucket_length(data: TokenizedData, ids: Sequence[int], boundaries: Sequence[int]) -> int:
    """The smallest bucket length that holds the longest of the examples ``ids``."""
    longest = max(data.examples[i].length for i in ids)
    return int(boundaries[int(np.searchsorted(np.asarray(boundaries), longest, side="left"))])


def pad_micro_batch(data: TokenizedData, ids: Sequence[int], boundaries: Sequence[int],
                    seq: int | None = None) -> MicroBatch:
    """The examples ``ids`` padded to ``seq`` (default: their own bucket length)."""
    seq = bucket_length(data, ids, boundaries) if seq is None else seq
    x = np.full((len(ids), seq), data.pad_id, dtype=np.int32)
    y = np.full((len(ids), seq), IGNORE_INDEX, dtype=np.int32)
    real = 0
    for r, i in enumerate(ids):
        e = data.examples[i]
        x[r, :e.length] = e.input_ids
        y[r, :e.length] = e.labels
        real += e.length
    return MicroBatch(x, y, int((y[:, 1:] != IGNORE_INDEX).sum()), real, tuple(int(i) for i in ids))


@dataclass
class BatchSchedule:
    """The whole run's batching: which examples each optimizer step holds, for every rank."""

    data: TokenizedData
    boundaries: list[int]
    micro_batch_size: int
    grad_accum_steps: int
    world_size: int
    seed: int
    shuffle: bool
    total_steps: int
    steps_per_epoch: int
    dropped_per_epoch: int
    eval_data: TokenizedData | None = None   # the data.eval_split hold-out
    rows: list[list[int]] | None = None      # batching.packing: example indices of each packed row
    slots: int = 0                           # segments per packed row

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.world_size

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """Global batches of one epoch: example indices, or with packing row indices."""
        if self.rows is not None:
            same = np.full(len(self.rows), self.boundaries[0], dtype=np.int64)
            return plan_epoch(same, self.boundaries, self.global_batch, self.seed, epoch, self.shuffle)[0]
        return plan_epoch(self.data.lengths, self.boundaries, self.global_batch, self.seed, epoch, self.shuffle)[0]

    def micro_batch(self, ids: Sequence[int], seq: int | None = None) -> MicroBatch:
        if self.rows is None:
            return pad_micro_batch(self.data, ids, self.boundaries, seq)
        return packing.pack_micro_batch(self.data, [self.rows[r] for r in ids], self.boundaries[0], self.slots)

    def micro_batches(self, group: Sequence[int]) -> list[MicroBatch]:
        """A global batch cut into micro-batches, all padded to the bucket of its longest row (one shape a step)."""
        seq = None if self.rows is not None else bucket_length(self.data, group, self.boundaries)
        m = self.micro_batch_size
        return [self.micro_batch(group[k:k + m], seq) for k in range(0, len(group), m)]

    def step(self, index: int, rank: int, _cache: dict | None = None) -> Step:
        epoch, pos = divmod(index, self.steps_per_epoch)
        cache = _cache if _cache is not None else {}
        if epoch not in cache:
            cache.clear()
            cache[epoch] = self.epoch_batches(epoch)
        micros = self.micro_batches(cache[epoch][pos])
        mine = tuple(micros[rank * self.grad_accum_steps:(rank + 1) * self.grad_accum_steps])
        return Step(index, epoch, mine, sum(mb.tokens for mb in micros), sum(mb.real_tokens for mb in micros),
                    sum(mb.input_ids.size for mb in micros))

    def steps(self, rank: int = 0, start: int = 0) -> Iterator[Step]:
        cache: dict = {}
        for i in range(start, self.total_steps):
            yield self.step(i, rank, cache)

    def shapes(self) -> list[tuple[int, int]]:
        """Every (micro_batch, seq) shape the run can produce: at most one per bucket."""
        return [(self.micro_batch_size, b) for b in self.boundaries]

    def run_shapes(self, start: int = 0) -> list[tuple[int, int]]:
        """The (micro_batch, seq) shapes steps ``start ..`` of this run use (every rank the same), found from
        each global batch's longest row without padding anything: what is compiled before step 1."""
        if self.rows is not None:
            return self.shapes()
        seqs: set[int] = set()
        for epoch in range(start // self.steps_per_epoch, (self.total_steps - 1) // self.steps_per_epoch + 1):
            first = max(start - epoch * self.steps_per_epoch, 0)
            last = min(self.total_steps - epoch * self.steps_per_epoch, self.steps_per_epoch)
            seqs |= {bucket_length(self.data, g, self.boundaries) for g in self.epoch_batches(epoch)[first:last]}
        return [(self.micro_batch_size, s) for s in sorted(seqs)]

    def describe(self) -> dict:
        return {"boundaries": self.boundaries, "shapes": len(self.boundaries),
                "micro_batch_size": self.micro_batch_size, "grad_accum_steps": self.grad_accum_steps,
                "world_size": self.world_size, "global_batch": self.global_batch,
                "steps_per_epoch": self.steps_per_epoch, "total_steps": self.total_steps,
                "dropped_per_epoch": self.dropped_per_epoch, "shuffle": self.shuffle, "seed": self.seed,
                "eval_examples": len(self.eval_data.examples) if self.eval_data else 0,
                "packing": self.rows is not None, "packed_rows": len(self.rows or ()), "segments_per_row": self.slots}


def build_plan(recipe: Recipe, tokenizer, world_size: int | None = None, data: TokenizedData | None = None) -> BatchSchedule:
    """The run's :class:`BatchSchedule` (tokenises the data unless ``data`` is given)."""
    data = data if data is not None else tokenize_dataset(recipe.data, tokenizer)
    world = world_size or recipe.world_size
    bounds = bucket_boundaries(data, recipe)   # over all examples, so the hold-out fits the same shapes
    data, held = split_eval(data, recipe.data.eval_split, recipe.seed)
    g = recipe.batching.micro_batch_size * recipe.batching.grad_accum_steps * world
    rows, slots, units = None, 0, data.lengths
    if recipe.batching.packing:
        seq = recipe.data.max_seq_length
        slots = packing.choose_slots(data.lengths, seq, recipe.seed)
        rows = packing.pack_rows(data.lengths, seq, slots, recipe.seed, recipe.data.shuffle)
        bounds = [packing.row_length(seq, slots)]
        units = np.full(len(rows), bounds[0], dtype=np.int64)
    batches, dropped = plan_epoch(units, bounds, g, recipe.seed, 0, recipe.data.shuffle)
    if not batches:
        raise RecipeError(f"{recipe.data.path}: {len(data.examples)} examples cannot fill one global batch of "
                          f"{g} (micro_batch_size x grad_accum_steps x world size); use more data or a smaller batch")
    per_epoch = len(batches)
    total = recipe.schedule.max_steps or recipe.schedule.epochs * per_epoch
    return BatchSchedule(data, bounds, recipe.batching.micro_batch_size, recipe.batching.grad_accum_steps, world,
                         recipe.seed, recipe.data.shuffle, total, per_epoch, dropped, held, rows, slots)


def padding_stats(plan: BatchSchedule, epoch: int = 0) -> dict:
    """Padding waste of one epoch with this plan (all ranks)."""
    real = padded = 0
    for g in plan.epoch_batches(epoch):
        for mb in plan.micro_batches(g):
            real += mb.real_tokens
            padded += mb.input_ids.size
    return {"real_tokens": real, "padded_tokens": padded, "padding_fraction": 1 - real / max(1, padded),
            "shapes": len(plan.boundaries)}
