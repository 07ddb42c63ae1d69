"""`port`: the CLI and the orchestration (verify, train, diagnose) over model_zoo and converters."""

__version__ = "0.1.0"
