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
   micro-batches ``r*accum .. r*accum+accum-1``. Each micro-batch is padded to the smallest bucket
   length that holds its longest row.
So micro 1 x accum 4 and micro 4 x accum 1 see the same examples in each optimizer step, and
2 workers x accum 1 see the same micro-batches as 1 worker x accum 2.

MindSpore's ``bucket_batch_by_length`` is not used because it batches per bucket on one process:
it has no notion of a global batch split across ranks and accumulation steps, which is what makes
the data-parallel and accumulation runs equal step by step.

With ``batching.packing: true`` step 2 is replaced: examples are packed into rows of one length
(:mod:`porting.train.packing`), and the rows go through steps 3 and 4 in place of examples.

Row formats (ShareGPT, OpenAI messages, Alpaca with history, datasets directories, Parquet) live in
:mod:`porting.train.formats` and chat templates in :mod:`porting.train.chat`; this module stays a
about 500 lines because tokenising and the step schedule are one pure function of the data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from model_zoo.errors import RecipeError
from model_zoo.files import json_depth, read_text
from porting.train import formats, packing

IGNORE_INDEX = -100
MAX_DATA_BYTES = 16 << 30   # a data file is read whole; past this, split it (the largest SFT sets are ~2 GB)
MAX_ROW_DEPTH = 16          # a chat row nests 3 levels (row -> messages -> message)


# --------------------------------------------------------------------------- data types
@dataclass(frozen=True)
class Example:
    input_ids: np.ndarray   # int32 (L,)
    labels: np.ndarray      # int32 (L,), IGNORE_INDEX where no loss is taken
    source: int             # row number in the data file (1-based line for JSONL/text)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class DataReport:
    path: str
    sha256: str
    format: str
    rows: int = 0
    examples: int = 0
    bad_rows: int = 0
    bad_row_samples: list[str] = field(default_factory=list)   # first few "line N: reason"
    truncated: int = 0
    split_windows: int = 0
    no_target: int = 0          # rows left without any loss token (skipped)
    tokens: int = 0             # sum of example lengths
    loss_tokens: int = 0
    eval_examples: int = 0      # held out by data.eval_split (not trained on)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class TokenizedData:
    examples: list[Example]
    report: DataReport
    pad_id: int

    @property
    def lengths(self) -> np.ndarray:
        return np.asarray([e.length for e in self.examples], dtype=np.int64)


@dataclass(frozen=True)
class MicroBatch:
    input_ids: np.ndarray     # int32 (B, S), right-padded with pad_id
    labels: np.ndarray        # int32 (B, S), IGNORE_INDEX on prompts and padding
    tokens: int               # loss tokens: count of labels[:, 1:] != -100 (the shifted targets)
    real_tokens: int          # non-padding positions
    example_ids: tuple[int, ...]
    # batching.packing: (positions (B, S) int32, segment ids (B, S) int32, cumulative segment ends over
    # the flattened B*S tokens (B*slots,) int64), the model's extra inputs; None for padded rows
    packed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)  # type: ignore[return-value]


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


# --------------------------------------------------------------------------- reading rows
def read_rows(path: str | Path, separator: str) -> list[tuple[int, Any]]:
    """(row number, parsed row or an Exception) for a .txt, .json (list) or .jsonl file."""
    p = Path(path)
    # bounded, UTF-8 or one line naming the offending byte; rows nested deeper than MAX_ROW_DEPTH are bad rows
    text = read_text(p, what="data file", max_bytes=MAX_DATA_BYTES, error=RecipeError)
    if p.suffix == ".txt":
        docs = [d.strip() for d in text.split(separator)] if separator else [text]
        return [(i + 1, {"text": d}) for i, d in enumerate(docs) if d]
    stripped = text.lstrip()
    if p.suffix == ".json" and stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecipeError(f"{p}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}; "
                              "expected a list of rows or JSON Lines (.jsonl)") from None
        except RecursionError:
            rows = None
        if not isinstance(rows, list) or json_depth(rows, MAX_ROW_DEPTH + 1) > MAX_ROW_DEPTH + 1:
            raise RecipeError(f"{p}: expected a JSON list of rows nested at most {MAX_ROW_DEPTH} levels; "
                              "rows are flat objects (text, instruction/output or messages)")
        return [(i + 1, r) for i, r in enumerate(rows)]
    out: list[tuple[int, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            out.append((n, ValueError(f"not valid JSON: {exc.msg}")))
            continue
        except RecursionError:
            row = None
        if row is None or json_depth(row, MAX_ROW_DEPTH) > MAX_ROW_DEPTH:
            out.append((n, ValueError(f"nested deeper than {MAX_ROW_DEPTH} levels (or null); expected a flat row")))
        else:
            out.append((n, row))
    return out


# --------------------------------------------------------------------------- tokenising rows
Segments = list[tuple[str, bool]]   # (text, counts in the loss)


def text_segments(row: Any, data) -> Segments:
    if not isinstance(row, dict):
        raise ValueError(f"expected an object with {data.text_field!r}, got {type(row).__name__}")
    t = formats.need_str(row, data.text_field)
    if not t.strip():
        raise ValueError(f"empty {data.text_field!r}")
    return [(t, True)]


def alpaca_segments(row: Any, data) -> Segments:
    if not isinstance(row, dict):
        raise ValueError(f"expected an object with instruction/input/output, got {type(row).__name__}")
    need = formats.need_str
    instr, inp, out = need(row, "instruction"), need(row, "input", True), need(row, "output")
    if not out.strip():
        raise ValueError("empty 'output'")
    tmpl = data.prompt_template_with_input if inp.strip() else data.prompt_template
    try:  # the recipe checks the template's fields; this keeps a hand-built DataSection one line too
        prompt = tmpl.format(instruction=instr, input=inp)
    except (KeyError, IndexError, ValueError, AttributeError) as e:
        raise RecipeError(f"data.prompt_template: cannot fill {tmpl[:60]!r} ({type(e).__name__}: {e}); use only "
                          "{instruction} and {input}") from None
    return [(prompt, False), (out, True)]


def row_content(row: Any, fmt: str, data, as_chat: bool) -> formats.Rendered:
    """What one row holds: segments (text, Alpaca with the prompt templates) or a conversation."""
    if fmt == "text":
        return text_segments(row, data)
    if fmt == "alpaca":
        return formats.alpaca_row(row, data, as_chat, alpaca_segments)
    return formats.ROW_FORMATS[fmt](row, data)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _ids_labels(content, renderer, data, tokenizer) -> tuple[list[int], list[int]]:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if isinstance(content, formats.Conversation) and renderer is not None:
        ids, labels = renderer.encode(content)   # the template places its own BOS and end-of-turn tokens
        if data.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids, labels = [bos] + ids, [IGNORE_INDEX] + labels
        return ids, labels
    segs = formats.builtin_segments(content) if isinstance(content, formats.Conversation) else content
    ids: list[int] = [bos] if data.add_bos and bos is not None else []
    labels: list[int] = [IGNORE_INDEX] * len(ids)
    for text, counts in segs:
        t = _encode(tokenizer, text)
        ids += t
        labels += t if counts else [IGNORE_INDEX] * len(t)
    if data.add_eos and eos is not None:
        ids.append(eos)
        labels.append(eos)
    return ids, labels


def tokenize_rows(rows: Sequence[tuple[int, Any]], fmt: str, data, tokenizer, report: DataReport) -> list[Example]:
    """Examples from rows; malformed rows are counted (and fatal with data.on_bad_row=fail)."""
    from porting.train.chat import renderer_for

    renderer = renderer_for(fmt, data, tokenizer)
    out: list[Example] = []
    for n, row in rows:
        report.rows += 1
        try:
            if isinstance(row, Exception):
                raise row
            ids, labels = _ids_labels(row_content(row, fmt, data, renderer is not None), renderer, data, tokenizer)
        except RecipeError as exc:   # the chat template cannot be masked: fatal, whatever on_bad_row says
            raise RecipeError(f"{data.path}: row {n}: {exc}") from None
        except ValueError as exc:
            report.bad_rows += 1
            msg = f"row {n}: {exc}"
            if len(report.bad_row_samples) < 5:
                report.bad_row_samples.append(msg)
            if data.on_bad_row == "fail":
                raise RecipeError(f"{data.path}: {msg} (data.on_bad_row=fail; fix the row or set "
                                  "data.on_bad_row=skip to count and skip malformed rows)") from None
            continue
        for win_ids, win_labels in _fit(ids, labels, data.max_seq_length, data.long_text, report):
            if sum(1 for x in win_labels[1:] if x != IGNORE_INDEX) == 0:
                report.no_target += 1
                continue
            out.append(Example(np.asarray(win_ids, np.int32), np.asarray(win_labels, np.int32), n))
    return out


def _fit(ids: list[int], labels: list[int], max_len: int, mode: str, report: DataReport):
    if len(ids) <= max_len:
        return [(ids, labels)]
    if mode == "truncate":
        report.truncated += 1
        return [(ids[:max_len], labels[:max_len])]
    wins = [(ids[i:i + max_len], labels[i:i + max_len]) for i in range(0, len(ids), max_len)]
    report.split_windows += len(wins) - 1
    return [w for w in wins if len(w[0]) >= 2]


def load_rows(data) -> tuple[Path, list[tuple[int, Any]], str]:
    """The data file's rows and their format (``data.format`` or detected)."""
    path = Path(data.path)
    if not (path.is_file() or path.is_dir()):
        raise RecipeError(f"data.path: file not found: {path}")
    table = path.is_dir() or path.suffix == ".parquet"
    rows = formats.read_table_rows(path, data.split) if table else read_rows(path, data.separator)
    if data.format != "auto":
        return path, rows, data.format
    return path, rows, "text" if path.suffix == ".txt" else formats.detect_format(rows, data)


def tokenize_dataset(data, tokenizer) -> TokenizedData:
    """All examples of ``data`` (a recipe's DataSection) tokenised with the model's tokenizer."""
    path, rows, fmt = load_rows(data)
    report = DataReport(path=str(path), sha256=formats.data_sha256(path), format=fmt)
    examples = tokenize_rows(rows, fmt, data, tokenizer, report)
    if not examples:
        raise RecipeError(f"{path}: no usable example ({report.bad_rows} malformed of {report.rows} rows; "
                          f"first: {report.bad_row_samples[:1]}); check data.format and the file")
    report.examples = len(examples)
    report.tokens = int(sum(e.length for e in examples))
    report.loss_tokens = int(sum(int((e.labels[1:] != IGNORE_INDEX).sum()) for e in examples))
    pad = tokenizer.pad_token_id
    pad = pad if pad is not None else (tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0)
    return TokenizedData(examples, report, int(pad))


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


def bucket_boundaries(data: TokenizedData, recipe) -> list[int]:
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


def pad_micro_batch(data: TokenizedData, ids: Sequence[int], boundaries: Sequence[int]) -> MicroBatch:
    longest = max(data.examples[i].length for i in ids)
    seq = int(boundaries[int(np.searchsorted(np.asarray(boundaries), longest, side="left"))])
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

    def micro_batch(self, ids: Sequence[int]) -> MicroBatch:
        if self.rows is None:
            return pad_micro_batch(self.data, ids, self.boundaries)
        return packing.pack_micro_batch(self.data, [self.rows[r] for r in ids], self.boundaries[0], self.slots)

    def step(self, index: int, rank: int, _cache: dict | None = None) -> Step:
        epoch, pos = divmod(index, self.steps_per_epoch)
        cache = _cache if _cache is not None else {}
        if epoch not in cache:
            cache.clear()
            cache[epoch] = self.epoch_batches(epoch)
        group = cache[epoch][pos]
        m = self.micro_batch_size
        micros = [self.micro_batch(group[k:k + m]) for k in range(0, len(group), m)]
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

    def describe(self) -> dict:
        return {"boundaries": self.boundaries, "shapes": len(self.boundaries),
                "micro_batch_size": self.micro_batch_size, "grad_accum_steps": self.grad_accum_steps,
                "world_size": self.world_size, "global_batch": self.global_batch,
                "steps_per_epoch": self.steps_per_epoch, "total_steps": self.total_steps,
                "dropped_per_epoch": self.dropped_per_epoch, "shuffle": self.shuffle, "seed": self.seed,
                "eval_examples": len(self.eval_data.examples) if self.eval_data else 0,
                "packing": self.rows is not None, "packed_rows": len(self.rows or ()), "segments_per_row": self.slots}


def build_plan(recipe, tokenizer, world_size: int | None = None, data: TokenizedData | None = None) -> BatchSchedule:
    """The run's :class:`BatchSchedule` (tokenises the data unless ``data`` is given)."""
    data = data if data is not None else tokenize_dataset(recipe.data, tokenizer)
    world = world_size or recipe.world_size
    bounds = bucket_boundaries(data, recipe)   # over all examples, so the hold-out fits the same shapes
    from porting.eval import split_eval

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
        m = plan.micro_batch_size
        for k in range(0, len(g), m):
            mb = plan.micro_batch(g[k:k + m])
            real += mb.real_tokens
            padded += mb.input_ids.size
    return {"real_tokens": real, "padded_tokens": padded, "padding_fraction": 1 - real / max(1, padded),
            "shapes": len(plan.boundaries)}

