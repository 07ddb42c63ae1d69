"""The project's exception family, re-exported for CLI code (defined in model_zoo.errors)."""

from model_zoo.errors import (CheckpointError, ConfigError, KernelError, PortingError, RecipeError,
                              UnknownModelError, VerificationError)

__all__ = ["CheckpointError", "ConfigError", "KernelError", "PortingError", "RecipeError",
           "UnknownModelError", "VerificationError"]
