"""The literals a regex requires, read from its parse tree: a substring test for one of them skips a search that
cannot match. The cause model's patterns are case-insensitive alternations, which Python's engine scans at about
0.2 ms per 4 KiB each whatever the text (no literal prefix to jump to); a long line full of words ran every one of
them (issue 51). ``re._parser`` since Python 3.11, ``sre_parse`` before.
"""

from __future__ import annotations

try:
    from re._constants import BRANCH, LITERAL, SUBPATTERN
    from re._parser import parse
except ImportError:   # Python 3.9 / 3.10
    from sre_constants import BRANCH, LITERAL, SUBPATTERN
    from sre_parse import parse


def literal_run(items) -> bytes:
    """The longest run of literal characters in a parsed sequence (lower-case), b"" when it has none."""
    best, run = b"", b""
    for op, av in items:
        if op is LITERAL and av < 128:
            run += bytes([av]).lower()
            continue
        best, run = max(best, run, key=len), b""
        if op is SUBPATTERN and len(av[-1]) and all(o is LITERAL for o, _ in av[-1]):
            run = bytes(a for _, a in av[-1] if a < 128).lower()
    return max(best, run, key=len)


def anchors(patterns: list[str]) -> tuple[bytes, ...] | None:
    """Literals one of which every match of ``patterns`` contains (lower-case), or None when some alternative has no
    literal of 3 bytes or more: a substring test on the lower-cased block then skips a pattern that cannot match,
    which keeps a long line full of words cheap (a case-insensitive search costs about 0.2 ms per 4 KiB each)."""
    out = []
    for p in patterns:
        items = list(parse(p))
        alts = [items]
        if len(items) == 1 and items[0][0] is SUBPATTERN:
            items = list(items[0][1][-1])
            alts = [items]
        if len(items) == 1 and items[0][0] is BRANCH:
            alts = [list(b) for b in items[0][1][1]]
        for alt in alts:
            lit = literal_run(alt)
            if len(lit) < 3:
                return None
            out.append(lit)
    return tuple(dict.fromkeys(out)) if out else None


def cased(pattern: str, lits: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
    """The case-folded anchors of a case-sensitive pattern, as the pattern spells them (None when one is not found
    verbatim: then the regex always runs)."""
    spelled = bytes(av for op, av in parse(pattern) if op is LITERAL and av < 128)
    out = []
    for x in lits:
        i = spelled.lower().find(x)
        if i < 0:
            return None
        out.append(spelled[i:i + len(x)])
    return tuple(out)
