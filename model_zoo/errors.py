"""One exception family for the whole project.

It lives in the lowest package (``model_zoo``) so that ``converters`` and ``porting`` can raise and
catch the same classes while imports keep going one way: porting -> converters -> model_zoo.
Every message says what was found, what was expected, and how to fix it; the CLI prints it as one
line and exits non-zero.
"""

from __future__ import annotations


def one_line(text: object) -> str:
    """``text`` on one line: every character that is not printable (a newline, a carriage return, \\x85,
    \\u2028, any control character) shown escaped, as Python writes it in a string literal. Used wherever text
    from an input reaches a line port prints or writes (an error line, a YAML comment, a README), so it can
    neither start a second line nor end the comment it is in."""
    s = str(text)
    return s if s.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)


class PortingError(Exception):
    """Base class of every error `port` raises on purpose."""

    exit_code = 2


class ConfigError(PortingError):
    """A model config (``config.json`` or a preset) is missing, malformed or unsupported."""


class UnknownModelError(PortingError):
    """A zoo name or a checkpoint path that does not resolve to a model."""


class KernelError(PortingError):
    """A kernel choice that the device or the documented kernel constraints do not allow."""


class CheckpointError(PortingError):
    """A checkpoint file is missing, corrupt, or does not match the model."""


class RecipeError(PortingError):
    """A training recipe does not validate."""


class DiagnosticsError(PortingError):
    """Input to a diagnostics command (log dir, rank table, run dir, model) is missing or unusable."""


class VerificationError(PortingError):
    """A parity or round-trip check failed."""

    exit_code = 1
