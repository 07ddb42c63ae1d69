"""The regex parser's constants, on every Python port supports (``re._parser`` since 3.11, ``sre_parse`` before):
causes.py reads the literals a cause-model pattern requires from its parse tree."""

from __future__ import annotations

try:
    from re._constants import BRANCH, LITERAL, SUBPATTERN  # noqa: F401 (Python 3.11+)
    from re._parser import parse  # noqa: F401
except ImportError:   # Python 3.9 / 3.10
    from sre_constants import BRANCH, LITERAL, SUBPATTERN  # noqa: F401
    from sre_parse import parse  # noqa: F401
