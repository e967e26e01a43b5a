"""Exact and correctly rounded arithmetic: libm-free transcendentals certified against a bound."""
from .correctly_rounded import (FALLBACK_COUNT, certified, cr_exp, cr_gelu, cr_log, cr_sigmoid,
                                cr_tanh, settle)
from .softmax import (cr_cross_entropy, cr_log_softmax, cr_softmax, log_softmax64, row_terms,
                      settle_rows, softmax64)

__all__ = ["FALLBACK_COUNT", "certified", "cr_cross_entropy", "cr_exp", "cr_gelu", "cr_log",
           "cr_log_softmax", "cr_sigmoid", "cr_softmax", "cr_tanh", "log_softmax64", "row_terms",
           "settle", "settle_rows", "softmax64"]
