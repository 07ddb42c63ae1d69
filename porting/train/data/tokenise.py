"""From a data file and a tokenizer to examples: rows read (text, JSON, JSONL; tables and row formats in
:mod:`porting.train.data.formats`), rendered (chat templates in :mod:`porting.train.data.chat`) and
tokenised once, prompt tokens masked with -100 for instruction data, rows over ``data.max_seq_length``
truncated and counted or split into windows for plain text. The step schedule built from the examples
is :mod:`porting.train.data.batching`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from model_zoo.errors import RecipeError
from model_zoo.files import json_depth, read_text
from porting.train.data import formats, tables
from porting.train.data.chat import max_token_chars, renderer_for
from porting.train.data.cut import char_bound, cut_segments
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.examples import DataReport, Example, TokenizedData

MAX_DATA_BYTES = 16 << 30   # a data file is read whole; past this, split it (the largest SFT sets are ~2 GB)
MAX_ROW_DEPTH = 16          # a chat row nests 3 levels (row -> messages -> message)


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


def _ids_labels(content, renderer, data, tokenizer, max_chars: int | None) -> tuple[list[int], list[int]]:
    """Ids and labels of one row; with ``max_chars`` (truncation) the text past it is never tokenised."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if isinstance(content, formats.Conversation) and renderer is not None:
        # Always truncated (data.long_text: split is for plain text): only the kept turns are prefix-rendered.
        ids, labels = renderer.encode(content, data.max_seq_length)   # the template places BOS and end-of-turn
        if data.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids, labels = [bos] + ids, [IGNORE_INDEX] + labels
        return ids, labels
    segs = formats.builtin_segments(content) if isinstance(content, formats.Conversation) else content
    cut = False
    if max_chars is not None:
        segs, cut = cut_segments(segs, max_chars)
    ids: list[int] = [bos] if data.add_bos and bos is not None else []
    labels: list[int] = [IGNORE_INDEX] * len(ids)
    for text, counts in segs:
        t = _encode(tokenizer, text)
        ids += t
        labels += t if counts else [IGNORE_INDEX] * len(t)
    if data.add_eos and eos is not None and not cut:
        ids.append(eos)
        labels.append(eos)
    return ids, labels


def tokenize_rows(rows: Sequence[tuple[int, Any]], fmt: str, data, tokenizer, report: DataReport) -> list[Example]:
    """Examples from rows; malformed rows are counted (and fatal with data.on_bad_row=fail)."""
    renderer = renderer_for(fmt, data, tokenizer)
    try:
        return _tokenize_rows(rows, fmt, data, tokenizer, report, renderer)
    finally:
        if renderer is not None:
            renderer.close()


def _tokenize_rows(rows, fmt: str, data, tokenizer, report: DataReport, renderer) -> list[Example]:
    # truncate: rows are cut to what max_seq_length tokens can cover before tokenising (porting.train.data.cut)
    max_chars = char_bound(data.max_seq_length, max_token_chars(tokenizer)) if data.long_text == "truncate" else None
    out: list[Example] = []
    for n, row in rows:
        report.rows += 1
        try:
            if isinstance(row, Exception):
                raise row
            content = row_content(row, fmt, data, renderer is not None)
            ids, labels = _ids_labels(content, renderer, data, tokenizer, max_chars)
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
        templated = renderer is not None and isinstance(content, formats.Conversation)
        for win_ids, win_labels in _fit(ids, labels, data.max_seq_length,
                                        "truncate" if templated else data.long_text, report):
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
    rows = tables.read_table_rows(path, data.split) if table else read_rows(path, data.separator)
    if data.format != "auto":
        return path, rows, data.format
    return path, rows, "text" if path.suffix == ".txt" else formats.detect_format(rows, data)


def tokenize_dataset(data, tokenizer, data_digest: str | None = None) -> TokenizedData:
    """All examples of ``data`` (a recipe's DataSection) tokenised with the model's tokenizer
    (``data_digest``: the data's sha256 when the caller already took it, tables.data_sha256)."""
    path, rows, fmt = load_rows(data)
    report = DataReport(path=str(path), sha256=data_digest or tables.data_sha256(path), format=fmt)
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
