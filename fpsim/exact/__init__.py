"""Exact arithmetic: dot products, sums and transcendentals of float32 values rounded once,
whatever the BLAS or the libm.

The layer between ``rounding`` / ``backend`` (one value to a format) and ``autograd`` (tensors
and ops): it takes float32 arrays holding values of any fpsim format and returns sums and
products whose bits depend only on the inputs, never on the BLAS, its summation order or
its thread count.

- ``accumulation.py``: the accumulation models ``exact``, ``sequential``, ``blocked`` (and the
  tensor-core presets), ``get_accumulation`` for spec strings, and ``matmul`` / ``reduce_sum``
  under a model, the entry points the autograd ops call.
- ``certificate.py``: the interval certificate (when a float64 sum provably rounds like the
  exact one), written once with its proof: ``certify``, ``error_factor``, ``sums_exactly``.
- ``odd_rounding.py``: rounding to odd at 53 bits, written once (``round_to_odd``,
  ``add_round_to_odd``): the exact sum rounded to odd, then rounded once to any format.
- ``exact_dots.py``: the ``exact`` model's general path: float64 BLAS plus the certificate,
  exact sums for the elements it cannot certify (``exact_matmul``, ``exact_rows_sum``).
- ``fast_matmul.py``: the ``ExactAccumulation(fp32)`` fast path, certified straight to
  the output format, 2-D and batched (``matmul_2d``, ``matmul_batched``, ``round_out``);
  ``widening.py``: its operands widened to float64 with their norms and quanta, chunk by
  chunk; ``product_parts.py``: the product with its reduction in parts (conv2d's dW, batch
  by batch); ``open_elements.py``: its exact step,
  the elements the certificates leave open, summed from their gathered products (or their
  supports); ``product_count.py``: how many products and elements took each path.
- ``scatter.py``: scatter-add with exact, order-free totals (``scatter_sum``), the
  gradient of a gather with repeated indices.
- ``sums.py``: exact sums of float64 terms rounded to odd (``round_to_odd_sum``): certified
  from two error-free splits and a float64 bound, integer limbs for the rows it leaves
  (``SUM_ROWS`` counts both, ``forced_limbs`` forces the limbs).
- ``block_fma.py``: the ``blocked`` model's multi-term fused additions (NVIDIA tensor cores).
- ``promoted.py``: Hopper's FP8 GEMMs (``PromotedAccumulation``, ``"h100-fp8"``): the
  tensor core's limited-precision blocks, partial sums promoted into fp32 every N products.
- ``elementary.py``: libm-free float64 exp, log, log1p, tanh, sigmoid, normal CDF and gelu
  (only + - * / and exact splits), each with a stated error bound.
- ``correctly_rounded.py``: those values certified into the output format (``cr_exp``,
  ``cr_log``, ``cr_tanh``, ``cr_sigmoid``, ``cr_silu``, ``cr_gelu``, ``cr_gelu_tanh``), with
  a Decimal fallback
  (``decimal_ref.py``, ``settle``) for the rare elements the bound cannot decide.
- ``softmax.py``: correctly rounded softmax, log-softmax and cross-entropy rows; their
  fallback's exact enclosures in ``softmax_ref.py``.
- ``norm.py``: the global gradient norm, certified in float64, exact sum when undecided
  (``global_norm``).
- ``observers.py``: the one registry of observers (per thread): the roundings here and in
  ``autograd`` report to it (``rounded``), and it hands the facts to the observers attached;
  ``underflow.py``: the gradient-underflow counts, observers (``count_gradient_underflow``,
  ``count_per_tensor``).

>>> import numpy as np
>>> from fpsim.exact import SequentialAccumulation, matmul
>>> a, b = np.ones((1, 4096), np.float32), np.ones((4096, 1), np.float32)
>>> float(matmul(a, b, out_fmt="fp16")[0, 0]), float(matmul(a, b, out_fmt="fp16",
...       model=SequentialAccumulation("fp16"))[0, 0])
(4096.0, 2048.0)
"""
from . import accumulation, observers, underflow
from .accumulation import (Accumulation, BlockedAccumulation, ExactAccumulation,
                           SequentialAccumulation, get_accumulation, matmul, reduce_sum,
                           tensor_core)
from .promoted import PromotedAccumulation, hopper_fp8_tensor_core
from .certificate import certify, error_factor, sums_exactly, width_factor
from .exact_dots import exact_matmul, exact_rows_sum
from .fast_matmul import matmul_2d, round_out
from .odd_rounding import add_round_to_odd, round_to_odd
from .scatter import scatter_sum
from .sums import round_to_odd_sum
from .norm import exact_global_norm, global_norm
from .underflow import UnderflowCount, count_gradient_underflow
from .correctly_rounded import (FALLBACK_COUNT, certified, cr_exp, cr_gelu, cr_gelu_tanh, cr_log,
                                cr_sigmoid, cr_silu, cr_tanh, enclosure, forced_fallback, settle,
                                silu64)
from .softmax import (cr_cross_entropy, cr_log_softmax, cr_softmax, log_softmax64, row_terms,
                      settle_rows, softmax64)

__all__ = ["accumulation", "observers", "underflow", "Accumulation", "ExactAccumulation",
           "SequentialAccumulation", "BlockedAccumulation", "PromotedAccumulation",
           "hopper_fp8_tensor_core",
           "tensor_core", "get_accumulation", "matmul", "reduce_sum", "exact_matmul",
           "exact_rows_sum", "error_factor", "width_factor", "certify", "sums_exactly",
           "matmul_2d", "round_out", "round_to_odd", "add_round_to_odd", "round_to_odd_sum",
           "scatter_sum",
           "UnderflowCount", "count_gradient_underflow", "global_norm", "exact_global_norm",
           "FALLBACK_COUNT", "certified", "cr_cross_entropy", "cr_exp", "cr_gelu", "cr_gelu_tanh",
           "cr_log", "cr_log_softmax", "cr_sigmoid", "cr_silu", "cr_softmax", "cr_tanh",
           "enclosure", "forced_fallback",
           "log_softmax64", "row_terms", "settle", "settle_rows", "silu64", "softmax64"]
