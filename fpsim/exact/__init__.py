"""Exact and correctly rounded arithmetic: libm-free transcendentals certified against a bound."""
from .correctly_rounded import (FALLBACK_COUNT, certified, cr_exp, cr_gelu, cr_log, cr_sigmoid,
                                cr_tanh, settle)

__all__ = ["FALLBACK_COUNT", "certified", "cr_exp", "cr_gelu", "cr_log", "cr_sigmoid",
           "cr_tanh", "settle"]
