"""Old name of ``porting.model_paths``, kept only for ``porting/train/plan.py`` (edited on another branch
this session); delete this file once that import reads ``porting.model_paths``."""

from porting.model_paths import find_in_hf_cache, hf_cache_dir, resolve_hf

__all__ = ["find_in_hf_cache", "hf_cache_dir", "resolve_hf"]
