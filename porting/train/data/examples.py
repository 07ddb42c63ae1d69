"""The data job's records: tokenised examples, the report of how a file became them, and the padded
micro-batches both `port train` (MindSpore) and `port baseline` (PyTorch) consume as NumPy int32 arrays.
How a data file becomes examples is :mod:`porting.train.data.tokenise`; how examples become optimizer
steps is :mod:`porting.train.data.batching`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from model_zoo.errors import RecipeError


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
    _lengths: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def lengths(self) -> np.ndarray:
        """Each example's length, computed once (a plan of 1M examples asks for them several times; the
        list is not changed after it is built)."""
        if self._lengths is None or len(self._lengths) != len(self.examples):
            self._lengths = np.fromiter((e.input_ids.shape[0] for e in self.examples), np.int64, len(self.examples))
        return self._lengths


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


def split_eval(data: TokenizedData, fraction: float, seed: int) -> tuple[TokenizedData, TokenizedData | None]:
    """(training data, held-out data): ``fraction`` of the examples drawn with ``seed``, never trained on."""
    if fraction <= 0:
        return data, None
    n = len(data.examples)
    k = max(1, int(round(fraction * n)))
    if k >= n:
        raise RecipeError(f"data.eval_split={fraction}: {n} examples leave none to train on; use a smaller split")
    held = set(np.random.default_rng([seed, 1]).permutation(n)[:k].tolist())
    data.report.eval_examples = k
    pick = lambda keep: [e for i, e in enumerate(data.examples) if (i in held) != keep]  # noqa: E731
    return TokenizedData(pick(True), data.report, data.pad_id), TokenizedData(pick(False), data.report, data.pad_id)
