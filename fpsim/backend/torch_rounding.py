"""The torch backend's fast rounding: PyTorch's own float32 -> fp16 / bf16 / float8_e4m3fn
casts, there and back, where they give ``fpsim.rounding.round_to``'s bits.

The portable scheme (``fpsim.rounding.portable``) rounds in about thirty whole-array float64
passes; on the CPU that is 36 ns a value (0.03 Gelem/s, ``benchmarks/bench_backends.py``),
and on a GPU thirty kernels. A cast is one pass each way. It is used only where it is exact:

- float32 input (torch converts float64 to float16/bfloat16 through float32: two roundings),
  round to nearest even, subnormals kept, no DAZ;
- fp16 and bf16: the cast is IEEE 754 round to nearest even with subnormals, overflow to
  inf (PyTorch's scalar and vector CPU paths and CUDA's ``cvt.rn``);
- e4m3fn: torch's cast of what rounds beyond 448 differs between releases (NaN before
  PyTorch PR #178817, 448 from it on), so its answer there is not used: what rounds beyond
  448 (|x| > 464, inf) is made NaN here, as the format's rule says, and with saturation the
  input is clamped to +-448 before the cast;
- saturation (``saturate=True``): the clamp to +-max_finite, for all three formats;
- NaNs are settled from x's bits by ``settle_nans_portable`` (on the CPU only when there are
  any), because the casts do not keep payloads alike (the CPU's vector and scalar paths
  differ).

Every other case takes the portable scheme. ``tests/test_torch_rounding.py`` checks the bits
against NumPy's ``round_to``: each of the 2**16 high halves of a float32 with seven low
halves, and every value, midpoint and quarter point of each format with their neighbours; all
2**32 float32 patterns in a slow test; on the CPU and, marked ``gpu``, on CUDA.
"""
from __future__ import annotations

import torch

from ..formats import BF16, E4M3FN, FP16, Format
from ..rounding.environment import check_environment
from ..rounding.portable import settle_nans_portable

__all__ = ["cast_round"]

#: the formats whose torch cast is used, without their subnormal and saturation options
CASTS = ((FP16, torch.float16), (BF16, torch.bfloat16), (E4M3FN, torch.float8_e4m3fn))
#: e4m3fn: the largest magnitude rounding to 448 (the tie at 464 goes to 448, even)
E4M3FN_LAST_TO_MAX = 464.0


def native_dtype(fmt: Format):
    """The torch dtype whose cast rounds to ``fmt`` (its options aside), or None."""
    if not fmt.has_nan:          # FP4 / FP6 always saturate: no plain form, no cast here
        return None
    plain = fmt.replace(subnormals=True, saturate=False)
    for known, dtype in CASTS:
        if plain == known:
            return dtype
    return None


def cast_round(ops, x, fmt: Format, mode: str, *, subnormals, saturate, daz,
               look_for_nans: bool = True):
    """``round_to(x, fmt, mode, ...)``'s bits for the tensor ``x`` of the torch backend
    ``ops``, by a torch cast where one gives them (module docstring); None where it does
    not, and the caller rounds the portable way. ``look_for_nans``: settle NaNs only if the
    result has any (a host read of the answer: the CPU's choice; a GPU settles always
    rather than stall the host until the device catches up)."""
    subnormals = fmt.subnormals if subnormals is None else bool(subnormals)
    saturate = fmt.saturate if saturate is None else bool(saturate)
    dtype = native_dtype(fmt)
    if (dtype is None or x.dtype != torch.float32 or mode != "nearest_even" or daz
            or not subnormals):
        return None
    check_environment()
    limit = fmt.max_finite
    # torch's own e4m3fn overflow rule varies by release: what it decides is overwritten
    result = (x.clamp(-limit, limit) if saturate else x).to(dtype).to(torch.float32)
    if dtype == torch.float8_e4m3fn and not saturate:
        beyond = ~(x.abs() <= E4M3FN_LAST_TO_MAX)    # NaN, inf and what rounds beyond 448
        result = torch.where(beyond, torch.nan, result)
    if look_for_nans and not bool(result.isnan().any()):
        return result
    return settle_nans_portable(ops, result, x, fmt)
