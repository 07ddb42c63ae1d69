"""Long rows cut before they are tokenised, so the work on a row is bounded by ``data.max_seq_length``.

A row longer than ``max_seq_length`` tokens keeps its first ``max_seq_length`` (``data.long_text:
truncate``). Tokenising a 200 MB line whole to keep 512 tokens of it is minutes of work and gigabytes of
offsets, so the text is cut first: one token decodes to at most as many characters as the longest entry
of the vocabulary (byte-level BPE stores one character per byte; SentencePiece one per character), so the
first ``n`` tokens of a text lie inside its first ``n * longest`` characters. :data:`MARGIN` more
characters are kept so that the pre-token the cut falls in (and any merge it changes) lies past the
tokens that are kept.
"""

from __future__ import annotations

MARGIN = 4096   # characters past the bound: several pre-tokens of any real text


def char_bound(max_tokens: int, token_chars: int) -> int:
    """Characters of a text that hold its first ``max_tokens`` tokens, with :data:`MARGIN` to spare."""
    return max_tokens * max(token_chars, 1) + MARGIN


def cut_segments(segments: list[tuple[str, bool]], max_chars: int) -> tuple[list[tuple[str, bool]], bool]:
    """The segments' text up to ``max_chars`` characters in all, and whether anything was cut."""
    out, left = [], max_chars
    for text, counts in segments:
        if left <= 0:
            return out, True
        out.append((text[:left], counts))
        left -= len(text)
    return out, left < 0
