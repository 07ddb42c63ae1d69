"""`port train`: recipes, framework-neutral data pipeline, memory plan, MindSpore training loop."""
