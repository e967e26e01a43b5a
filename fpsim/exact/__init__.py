"""Exact arithmetic kernels with certified fast paths."""
from .norm import exact_global_norm, global_norm

__all__ = ["global_norm", "exact_global_norm"]
