"""Checkpoint formats and weight-name maps between HF and the zoo's MindSpore cells."""
