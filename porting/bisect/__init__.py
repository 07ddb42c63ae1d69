"""`port bisect`: where MindSpore and torch part, layer by layer and phase by phase (docs/bisect.md)."""
