"""One exception family for the whole project.

It lives in the lowest package (``model_zoo``) so that ``converters`` and ``porting`` can raise and
catch the same classes while imports keep going one way: porting -> converters -> model_zoo.
Every message says what was found, what was expected, and how to fix it; the CLI prints it as one
line and exits non-zero.
"""

from __future__ import annotations


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
