"""One scale per tensor: current scaling and delayed scaling, as Transformer Engine computes them.

A tensor ``x`` (a float32 container of any fpsim format) is quantized to an FP8 format as
NVIDIA Transformer Engine's cast kernels do (``transformer_engine/common/cast/fp8/
quantize_fp8.cuh``: ``static_cast<OType>(elt * scale)``, the ``__nv_fp8`` constructors
converting with ``__NV_SATFINITE``)::

    q = round_sat(fl32(x * scale), fmt)     # fp32 multiply, then RNE with saturation:
                                            # beyond max_finite and +-inf -> +-max_finite,
                                            # NaN stays NaN
    dequantized value = q * scale_inv,  scale_inv = fl32(1 / scale)

and the amax the recipe records is ``max |x|`` with CUDA's ``fmaxf``, which *ignores* NaN:
a tensor with NaNs reports the largest non-NaN magnitude (0 if nothing else), an infinity
reports inf (``amax``).

Where the scale comes from:

**Current scaling** (``Float8CurrentScaling``; ``common/recipe/recipe_common.cuh``
``compute_scale_from_amax``, called by ``common/recipe/current_scaling.cu``): from this
tensor's own amax, ``scale = fl32(fp8_max / max(amax, epsilon))``; amax 0, inf or NaN give
scale 1; a scale that overflows float32 becomes FLT_MAX; ``power_2`` keeps only the scale's
sign and exponent bits (rounds it down to a power of two).

**torchao 0.18** (``torchao/float8/float8_utils.py`` ``amax_to_scale``, which
``hp_tensor_to_float8_dynamic`` calls) agrees with this for every finite amax >= 1e-12 and
differs on three classes of input, pinned in ``tests/test_quant_tensor.py``;
``scale_from_amax(..., rule="torchao")`` follows torchao where a run is checked against it:

- ``power_2``: torchao takes ``exp2(floor(log2(scale)))`` with ``log2`` in float32, which
  rounds up to ``k`` for a scale just below ``2**k`` (448/amax a few float32 ulps under a
  power of two): torchao's scale is then ``2**k``, twice TE's ``2**(k-1)``.
- amax = inf: torchao's ``448 / inf`` is a scale of 0, and the cast's ``inf * 0`` makes the
  infinite elements NaN (finite ones 0); TE's scale is 1. (A NaN amax -- torchao's
  ``torch.max`` keeps a NaN, where TE's ``fmaxf`` skips it -- gives torchao a NaN scale.)
- amax < 1e-12, 0 included: torchao divides by ``max(amax, 1e-12)`` (``EPS``, in float64):
  a scale of 448e12 for e4m3fn; TE's default ``epsilon`` is 0, so its scale is
  ``448 / amax`` (FLT_MAX where that overflows) and 1 for amax 0.

**Delayed scaling** (``DelayedScaling``; ``common/recipe/delayed_scaling.cu``, the fused
``kernel_bulk`` that PyTorch's ``reduce_and_update_fp8_tensors`` launches by default): the cast
uses the scale computed *before* this step; the cast records the tensor's amax into slot 0
of the amax history (``fmaxf`` of what the slot holds); after the step, ``update_delayed``:

- takes ``last = history[0]``; if it is 0 (nothing recorded), history and scale stay as
  they are (the kernel skips the roll);
- otherwise rolls the history by one (``new[i] = old[i + 1]``, ``new[-1] = last``) and
  clears slot 0 for the next step;
- amax = ``last`` (``most_recent``) or ``fmaxf`` over the window (``max``: NaN ignored);
- ``scale = fl32(scaled_max / amax)`` with ``scaled_max = fl32(fp8_max * 2^-margin)``
  if that amax is finite and positive, else the previous scale; an infinite result becomes
  FLT_MAX.

TE's unfused Python path (``NVTE_UNFUSED_FP8_UPDATE=1``, ``pytorch/quantization.py``
``_default_get_amax_and_update_history``) rolls even when nothing was recorded and takes
``max`` over the window then; the default fused kernel, modelled here, does not.

>>> from fpsim.formats import E4M3FN
>>> scale_from_amax(3.5, E4M3FN)            # 448 / 3.5
128.0
>>> state = update_delayed(record_amax(init_delayed(4), 7.0), E4M3FN)
>>> state.scale, state.amax_history        # 448 / 7; the 7 moved to the window's end
(64.0, (0.0, 0.0, 0.0, 7.0))
"""
from __future__ import annotations

import enum
import math
import struct
from typing import NamedTuple

from ..backend import astype, errstate, round_to, scalar, size, xp
from ..formats import FP32, Format, get
from ..options import check_choice, check_count

__all__ = ["AmaxAlgorithm", "amax", "scale_from_amax", "quantize", "Quantized",
           "count_saturated", "SCALE_RULES", "TORCHAO_EPS",
           "DelayedScalingState", "init_delayed", "record_amax", "update_delayed", "FLT_MAX",
           "fl32"]

FLT_MAX = 3.4028234663852886e38
SCALE_RULES = ("transformer_engine", "torchao")   # whose current-scaling rule (module doc)
TORCHAO_EPS = 1e-12                               # torchao.float8.float8_utils.EPS


class AmaxAlgorithm(str, enum.Enum):
    """How delayed scaling reads its amax history (``DelayedScaling.amax_compute_algo``)."""

    MAX = "max"
    MOST_RECENT = "most_recent"


def fl32(value: float) -> float:
    """A Python float rounded to float32 (nearest, ties to even; overflow to inf)."""
    return round_to(float(value), FP32)


def _fmaxf(a: float, b: float) -> float:
    """CUDA's ``fmaxf``: the larger of the two; a NaN argument yields the other one."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


def amax(x) -> float:
    """``max |x|`` over the non-NaN elements (CUDA ``fmaxf``), 0.0 for an empty or all-NaN
    tensor; an infinity gives inf."""
    if size(x) == 0:
        return 0.0
    magnitude = xp.abs(x)
    finite_or_inf = xp.where(xp.isnan(magnitude), xp.zeros_like(magnitude), magnitude)
    return float(xp.max(finite_or_inf))


def scale_from_amax(amax_value: float, fmt, *, power_2: bool = False,
                    epsilon: float = 0.0, rule: str = "transformer_engine") -> float:
    """Current scaling's scale for a tensor of this amax (module doc; TE
    ``compute_scale_from_amax`` with ``value_for_inf = FLT_MAX``). ``rule="torchao"``:
    torchao 0.18's ``amax_to_scale`` instead, whose fixed floor 1e-12 replaces ``epsilon``."""
    check_choice("current-scaling rule", rule, SCALE_RULES)
    fmt = get(fmt)
    if rule == "torchao":
        if epsilon != 0.0:
            raise ValueError(f"epsilon is Transformer Engine's; rule='torchao' divides by "
                             f"max(amax, {TORCHAO_EPS}) always, got epsilon={epsilon!r}")
        return _torchao_scale(float(amax_value), fmt, power_2)
    value, floor = fl32(amax_value), fl32(epsilon)      # both are C floats in TE
    if value < floor:                         # NaN compares false and stays NaN
        value = floor
    if math.isinf(value) or value == 0.0 or math.isnan(value):
        return 1.0
    scale = fl32(fmt.max_finite / value)
    if math.isinf(scale):
        scale = FLT_MAX
    if power_2:
        scale = _power_of_two_below(scale)
    return scale


def _torchao_scale(amax_value: float, fmt: Format, power_2: bool) -> float:
    """``fl32(max_finite / max(float64(amax), 1e-12))``; with ``power_2``
    ``exp2(floor(fl32(log2(scale))))`` (torch's float32 log2, correctly rounded here)."""
    floored = amax_value if math.isnan(amax_value) else max(amax_value, TORCHAO_EPS)
    scale = fl32(fmt.max_finite / floored)        # the float64 quotient, rounded once
    if power_2 and scale > 0 and math.isfinite(scale):
        scale = 2.0 ** math.floor(fl32(math.log2(scale)))
    return scale


def _power_of_two_below(scale: float) -> float:
    """Keep sign and exponent bits of a float32 (``scale_bits &= 0xFF800000``)."""
    bits = struct.unpack("<I", struct.pack("<f", scale))[0] & 0xFF800000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def count_saturated(scaled, fmt: Format) -> int:
    """How many of ``scaled`` saturation changes: those that round to nearest even beyond
    ``fmt``'s largest finite value (infinities included, NaN not). A value a little above
    max_finite that rounds down to it anyway (``fl32(amax * fl32(448 / amax))`` is often one
    float32 ulp above 448) is not counted: below the midpoint to the next binade step, or on
    it when max_finite's last significand bit is even (e4m3fn's 448 = 0b1110 x 2**5: 464
    rounds to 448; e5m2's 57344 = 0b111 x 2**13: 61440 rounds up, to infinity)."""
    ulp = 2.0 ** (fmt.emax - fmt.man_bits)
    bound = scalar(fmt.max_finite + ulp / 2, xp.float32)
    magnitude = xp.abs(scaled)
    odd = int(fmt.max_finite / ulp) % 2 == 1
    beyond = magnitude >= bound if odd else magnitude > bound
    return int(xp.sum(beyond))


class Quantized(NamedTuple):
    """A quantized tensor: ``values`` (a float32 container of ``fmt`` values), the
    ``scale`` it was cast with and ``scale_inv = fl32(1 / scale)``, which dequantizes it;
    ``saturated``: how many elements saturation changed (``|x * scale|`` rounds beyond the
    format's largest finite value, infinities included; ``count_saturated``); ``flushed``: how
    many nonzero finite elements became 0."""

    values: object
    scale: float
    scale_inv: float
    saturated: int
    flushed: int


def quantize(x, scale: float, fmt) -> Quantized:
    """``round_sat(fl32(x * scale), fmt)`` with its counts (module doc)."""
    fmt = get(fmt)
    with errstate(over="ignore", invalid="ignore"):     # x * scale overflows to inf: IEEE
        scaled = astype(x, xp.float32, copy=False) * scalar(scale, xp.float32)
    values = round_to(scaled, fmt, saturate=True)
    saturated = count_saturated(scaled, fmt)
    flushed = int(xp.sum((values == 0) & (scaled != 0) & ~xp.isnan(scaled)))
    inverse = math.inf if scale == 0 else 1.0 / scale     # torchao's scale 0 (amax inf)
    return Quantized(values, float(scale), fl32(inverse), saturated, flushed)


class DelayedScalingState(NamedTuple):
    """One quantized tensor's delayed-scaling state: ``amax_history`` (slot 0 is this step's,
    recorded by the casts; the rest, oldest first after a roll, are earlier steps') and the
    ``scale`` the next cast uses. Frozen; ``record_amax`` and ``update_delayed`` return new
    states."""

    amax_history: tuple
    scale: float


def init_delayed(length: int) -> DelayedScalingState:
    """The state TE starts a tensor with: a zero history of ``length`` and scale 1."""
    return DelayedScalingState((0.0,) * check_count("amax history length", length, 1), 1.0)


def record_amax(state: DelayedScalingState, amax_value: float) -> DelayedScalingState:
    """Slot 0 takes ``fmaxf(slot 0, amax)``: every cast of the tensor in a step adds to it
    (TE's ``atomicMaxFloat`` on ``amax_history[0]``)."""
    history = state.amax_history
    return state._replace(amax_history=(_fmaxf(history[0], float(amax_value)),) + history[1:])


def update_delayed(state: DelayedScalingState, fmt: Format, *, margin: float = 0,
                   algorithm: AmaxAlgorithm | str = AmaxAlgorithm.MAX) -> DelayedScalingState:
    """After a step: roll the history and compute the next scale (module doc, ``kernel_bulk``)."""
    fmt = get(fmt)
    algorithm = AmaxAlgorithm(algorithm)
    history = state.amax_history
    last = history[0]
    if last == 0.0:
        return state
    window = history[1:] + (last,)
    rolled = (0.0,) + window[1:]            # slot 0 cleared for the next step's casts
    if algorithm is AmaxAlgorithm.MOST_RECENT:
        chosen = last
    else:
        chosen = 0.0
        for value in window:
            chosen = _fmaxf(chosen, value)
    scaled_max = fl32(fmt.max_finite * fl32(2.0 ** -margin))
    if math.isfinite(chosen) and chosen > 0.0:
        scale = fl32(scaled_max / chosen)
    else:
        scale = state.scale
    if math.isinf(scale):
        scale = FLT_MAX
    return DelayedScalingState(rolled, scale)
