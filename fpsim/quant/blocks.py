"""Block-scaled quantization: OCP Microscaling (MX) blocks and 1x128 / 128x128 tiles.

Both cut a tensor into blocks that share one scale and cast every element once to an FP8
(MX also FP6 or FP4) format with saturation (``round_to(..., saturate=True)``); they differ in
the scale.

**MX** (``mx_quantize``), OCP "Microscaling Formats (MX) v1.0": ``block`` (32) consecutive
elements along ``axis`` share a power of two ``X = 2**(code - 127)`` stored as an E8M0 code
(exponent only, bias 127, 0xFF = NaN); element ``i`` is ``round_sat(fl32(V_i / X), fmt)``
(division by a power of two is the product with its reciprocal, which float32 holds for every
code). How ``code`` comes from the block's amax, ``ScaleRule``:

- ``SPEC``: the spec's ``X = 2**(floor(log2(amax)) - emax_elem)`` (section 6.3), clamped to
  E8M0's range, as torchao 0.18's ``to_mx`` computes it with ``ScaleCalculationMode.FLOOR``
  (``torchao/prototype/mx_formats/mx_tensor.py``, ``to_mx``): ``floor(log2(amax))`` is amax's
  float32 exponent field minus 127, so an infinite amax reads as 2**128 (its elements
  saturate, the block's finite ones flush) and a NaN anywhere in the block makes the code
  0xFF. Here a 0xFF block's elements are NaN (the spec decodes such a block as NaN whatever
  its elements); torchao's are its values divided by +inf (0xFF << 23), so +-0 and NaN. A
  block of code 0 (``X = 2**-127``, amax < 2**(emax_elem - 126)) is scaled by 2**127 here;
  torchao divides it by 2**-126 instead (``torch.clamp(scale_fp32, min=F32_MIN_NORMAL)``), so
  its elements are half of these (and dequantize to half the input).
- ``RCEIL``: NVIDIA Transformer Engine's MXFP8 rule: ``code = float_to_e8m0(fl32(amax *
  max_norm_rcp))``, ``max_norm_rcp = (float)(1.0 / max_finite)``, ``float_to_e8m0`` the
  float32 exponent rounded up (``cvt.rp.satfinite.ue8m0x2.f32``; 0 -> 0, inf -> 0xFE, values
  up to 2**-127 -> 0) (``transformer_engine/common/cast/mxfp8/quantize_mxfp8.cuh``, the
  kernel; ``common/util/ptx_arch_spec.cuh``, ``float_to_e8m0``; ``common/util/ptx.cuh``,
  ``exp2f_rcp`` for the reciprocal scale). The amax is ``fmaxf`` over the block, which skips
  NaN, so a NaN element stays a NaN element in a finite-scale block. torchao's eager
  ``_to_mx_rceil`` computes the scale as ``ceil(log2(amax / max_pos))`` with float32 ``log2``,
  which rounds the log2 of a value an ulp above 2**k to k: one code below ``cvt.rp``'s (at
  amax = max_pos * 2**k plus an ulp, say). It also differs in a NaN block (code 0xFF, all
  NaN) and in a code 0 block (it multiplies by 1, not 2**127).

Elements in ``e4m3fn`` or ``e5m2`` (MXFP8), ``fp6_e2m3`` or ``fp6_e3m2`` (MXFP6) or
``fp4_e2m1`` (MXFP4): OCP's FP6 and FP4, the ``finite`` encoding (no inf, no NaN, max 7.5, 28
and 6; ``emax_elem`` 2, 4 and 2 in the spec's rule). The same scale rules and cast; torchao's
``to_mx`` (``elem_dtype`` ``torch.float4_e2m1fn_x2``, ``"fp6_e2m3"``, ``"fp6_e3m2"``) casts
with ``_f32_to_floatx_unpacked`` (``torchao/prototype/custom_fp_utils.py``), round to nearest
even saturating at max (the same elements), except a NaN element, which it turns into +-1.5
(FP4, the bits of its normal branch), where ml_dtypes writes a zero: here a NaN element stays
NaN (``formats``: a ``finite`` format keeps NaN as NaN in the container). A NaN element
reaches the cast only under ``RCEIL`` (the amax skips it); under ``SPEC`` its block is 0xFF.

**Tiles** (``tile_quantize``), DeepSeek-V3 and Transformer Engine's ``Float8BlockScaling``:
1x128 tiles for activations and gradients, 128x128 for weights, on the tensor seen as 2-D
(rows = every leading dimension); a float32 scale per tile from TE's
``compute_scale_from_amax(amax, max_finite, power_2, epsilon, FLT_MAX)``
(``transformer_engine/common/recipe/recipe_common.cuh``): ``amax = max(amax, epsilon)``;
scale 1 for amax 0, inf or NaN; else ``fl32(max_finite / amax)``, FLT_MAX where that
overflows, and with ``power_2`` its mantissa bits cleared. Elements ``round_sat(fl32(x *
scale))``; TE stores ``scale_inv = fl32(1 / scale)``. The tile amax skips NaN (``fmaxf``,
``common/transpose/quantize_transpose_{vector,square}_blockwise.cu``). A dimension that is not
a multiple of the tile leaves partial tiles at the end, whose amax is over the elements
present, as TE's kernels and its reference (``tests/pytorch/references/
blockwise_quantizer_reference.py``, zero padding) do.

Both results count the elements saturation changed (``|x * scale|`` rounds beyond ``max_finite``,
infinities included) and flushed (nonzero input, zero element), for a recipe trace.

>>> import numpy as np
>>> x = np.linspace(-1, 1, 64, dtype=np.float32) * np.float32(1000)
>>> q = mx_quantize(x, "e4m3fn")          # X = 2**(9 - 8): 1000 / 2 saturates at 448
>>> [int(c) for c in q.scale_codes], float(dequantize(q)[0]), q.saturated
([128, 128], -896.0, 6)
>>> q = mx_quantize(x, "e4m3fn", scale_rule=ScaleRule.RCEIL)      # X = 2**ceil(log2(1000/448))
>>> [int(c) for c in q.scale_codes], float(dequantize(q)[0]), q.saturated
([129, 129], -1024.0, 0)
>>> t = tile_quantize(np.full((2, 3), 3.0, np.float32), "e4m3fn", (1, 128))
>>> float(t.scales[0, 0]), float(t.elements[0, 0]), float(dequantize(t)[0, 0])
(128.0, 384.0, 3.0)
"""
from __future__ import annotations

import enum
from typing import NamedTuple

from .. import backend
from ..backend import astype, bitcast, round_to, xp
from ..formats import Format, get
from ..options import check_count
from .tensor_scaling import count_saturated, fl32

__all__ = ["ScaleRule", "MXTensor", "TileTensor", "MX_ELEMENT_FORMATS", "TILE_FORMATS",
           "E8M0_NAN", "mx_quantize", "tile_quantize", "dequantize", "e8m0_to_float32"]

#: the element formats of MX (OCP FP8 E4M3 and E5M2, FP6 E2M3 and E3M2, FP4 E2M1) and of the
#: tiles (the FP8 ones)
MX_ELEMENT_FORMATS = ("e4m3fn", "e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1")
TILE_FORMATS = ("e4m3fn", "e5m2")
#: the E8M0 code that means NaN
E8M0_NAN = 255

_ABS_MASK = 0x7FFFFFFF      # float32 bits without the sign: ordered as |x|, NaN above inf
_INF_BITS = 0x7F800000
_EXPONENT_FIELD = 0x7F800000
_FLT_MAX = 3.4028234663852886e38


class ScaleRule(enum.Enum):
    """How an MX block's E8M0 scale comes from its amax (module docstring)."""

    SPEC = "spec"       # OCP MX v1.0 section 6.3; torchao ScaleCalculationMode.FLOOR
    RCEIL = "rceil"     # Transformer Engine's float_to_e8m0(amax * max_norm_rcp)


class MXTensor(NamedTuple):
    """An MX-quantized tensor: ``elements`` (float32 container, values of ``fmt``, the input's
    shape), ``scale_codes`` (uint8 E8M0 codes, the input's shape with ``axis`` divided by
    ``block``), and the counts of saturated and flushed elements."""

    elements: object
    scale_codes: object
    fmt: Format
    axis: int
    block: int
    saturated: int
    flushed: int


class TileTensor(NamedTuple):
    """A tile-quantized tensor: ``elements`` (float32 container, values of ``fmt``, the
    input's shape); ``scales`` (float32, the factor each tile was multiplied by) and
    ``scale_inv`` (float32, ``1 / scales``, what TE stores), one per tile of the input seen
    as 2-D (rows, last dimension); the counts of saturated and flushed elements."""

    elements: object
    scales: object
    scale_inv: object
    fmt: Format
    tile: tuple
    saturated: int
    flushed: int


def _element_format(fmt, accepted: tuple, what: str) -> Format:
    resolved = get(fmt)
    if resolved not in [get(name) for name in accepted]:
        raise ValueError(f"{what} takes element formats {', '.join(accepted)}; got "
                         f"{getattr(fmt, 'name', fmt)!r}")
    return resolved


def _float32_array(x, what: str):
    if backend.is_array_like(x) and not backend.is_array(x):
        x = backend.asarray(x, x.dtype)          # a host array, its dtype kept (no rounding)
    if not backend.is_array(x) or x.dtype != xp.float32:
        raise TypeError(f"{what} takes a float32 array (fpsim's container), got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    return x


def _magnitude_max(x, axis, skip_nan: bool):
    """The largest |x| over ``axis`` as its float32 pattern (int32: integer order is |x|'s
    order, NaN above inf). With ``skip_nan`` a NaN counts as +0 (``fmaxf(amax, NaN)`` keeps
    amax); the mask pass runs only where a NaN reached the maximum."""
    magnitude = bitcast(x, xp.int32) & _ABS_MASK
    top = xp.max(magnitude, axis=axis)
    if skip_nan and bool(xp.any(top > _INF_BITS)):
        top = xp.max(backend.zero_where(magnitude > _INF_BITS, magnitude), axis=axis)
    return top


def _spec_codes(top, emax: int):
    """OCP MX's floor rule on the amax patterns ``top`` (int32): exponent field - emax,
    clamped to [0, 254]; NaN amax -> 0xFF."""
    codes = xp.clip((top >> 23) - emax, 0, 254)
    return xp.where(top > _INF_BITS, backend.scalar(E8M0_NAN, xp.int32), codes)


def _rceil_codes(top, max_finite: float):
    """TE's ``float_to_e8m0(amax * max_norm_rcp)``: the product's exponent rounded up."""
    reciprocal = fl32(1.0 / max_finite)                          # (float)(1.0 / max_norm)
    value = bitcast(top, xp.float32) * backend.scalar(reciprocal, xp.float32)
    pattern = bitcast(value, xp.int32)
    exponent = pattern >> 23
    mantissa = pattern & 0x7FFFFF
    # round up unless exact, already at 0xFE (satfinite), or at most 2**-127 (code 0)
    up = ((mantissa > 0) & (exponent != 254)
          & xp.logical_not((exponent == 0) & (mantissa <= 0x400000)))
    codes = exponent + astype(up, xp.int32)
    special = xp.where(mantissa > 0, backend.scalar(E8M0_NAN, xp.int32),
                       backend.scalar(254, xp.int32))
    return xp.where(exponent == 255, special, codes)


def _reciprocal_scales(codes):
    """``2**(127 - code)`` as float32 for E8M0 codes (int32): ``(254 - code) << 23`` for
    codes up to 253, 2**-127 (a subnormal) for 254, NaN for 255 (TE's ``exp2f_rcp``)."""
    pattern = (254 - codes) << 23
    pattern = xp.where(codes == 254, backend.scalar(0x00400000, xp.int32), pattern)
    pattern = xp.where(codes == E8M0_NAN, backend.scalar(0x7FC00000, xp.int32), pattern)
    return bitcast(pattern, xp.float32)


def e8m0_to_float32(codes):
    """The scale ``2**(code - 127)`` of E8M0 codes, as float32 (code 0 is 2**-127, a
    subnormal; 0xFF is NaN).

    >>> import numpy as np
    >>> [float(v) for v in e8m0_to_float32(np.array([127, 130, 0, 255], np.uint8))][:3]
    [1.0, 8.0, 5.877471754111438e-39]
    """
    codes = astype(backend.asarray(codes, xp.uint8), xp.int32)
    pattern = xp.where(codes == 0, backend.scalar(0x00400000, xp.int32), codes << 23)
    pattern = xp.where(codes == E8M0_NAN, backend.scalar(0x7FC00000, xp.int32), pattern)
    return bitcast(pattern, xp.float32)


def _cast(scaled, x, fmt: Format):
    """``round_sat(scaled, fmt)`` and the counts: saturated (what saturation changed:
    ``count_saturated``, infinities included) and flushed (x nonzero, element zero; NaN is
    neither)."""
    elements = round_to(scaled, fmt, saturate=True)
    saturated = count_saturated(scaled, fmt)
    flushed = int(xp.count_nonzero((elements == 0) & (x != 0)))
    return elements, saturated, flushed


def mx_quantize(x, fmt="e4m3fn", *, axis: int = -1, block: int = 32,
                scale_rule: ScaleRule = ScaleRule.SPEC) -> MXTensor:
    """Quantize the float32 array ``x`` to MX: one E8M0 scale per ``block`` consecutive elements
    along ``axis`` (the reduction dimension), elements in ``fmt`` (one of ``MX_ELEMENT_FORMATS``),
    the scale by ``scale_rule`` (module docstring). ``x.shape[axis]`` must be a multiple of
    ``block`` (ValueError otherwise).

    >>> import numpy as np
    >>> x = np.array([448.0, 1.0] + [0.0] * 30, np.float32)
    >>> [int(mx_quantize(x, "e4m3fn", scale_rule=r).scale_codes[0]) for r in ScaleRule]
    [127, 127]
    >>> mx_quantize(x[:30])
    Traceback (most recent call last):
    ValueError: mx_quantize: x.shape[-1] is 30; MX takes a length that is a multiple of the block
    (32)
    """
    fmt = _element_format(fmt, MX_ELEMENT_FORMATS, "mx_quantize")
    rule = ScaleRule(scale_rule)
    x = _float32_array(x, "mx_quantize")
    block = check_count("mx_quantize: block", block, 1)
    if x.ndim == 0 or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"mx_quantize: axis {axis} is not an axis of an array of shape "
                         f"{tuple(x.shape)}")
    length = x.shape[axis]
    if length % block:
        raise ValueError(f"mx_quantize: x.shape[{axis}] is {length}; MX takes a length that "
                         f"is a multiple of the block ({block})")
    moved = xp.moveaxis(x, axis, -1)
    blocks = xp.reshape(moved, (*moved.shape[:-1], length // block, block))
    top = _magnitude_max(blocks, -1, skip_nan=rule is ScaleRule.RCEIL)
    codes = (_spec_codes(top, fmt.emax) if rule is ScaleRule.SPEC
             else _rceil_codes(top, fmt.max_finite))
    scaled = blocks * xp.expand_dims(_reciprocal_scales(codes), -1)
    elements, saturated, flushed = _cast(scaled, blocks, fmt)
    elements = xp.moveaxis(xp.reshape(elements, moved.shape), -1, axis)
    return MXTensor(elements, xp.moveaxis(astype(codes, xp.uint8), -1, axis), fmt, axis, block,
                    saturated, flushed)


def _tile_scales(amax, max_finite: float, power_2: bool, epsilon: float):
    """TE's ``compute_scale_from_amax`` on float32 amaxes (no NaN: the amax skips them)."""
    amax = xp.maximum(amax, backend.scalar(epsilon, xp.float32))
    unit = xp.isinf(amax) | (amax == 0)
    safe = xp.where(unit, backend.scalar(1.0, xp.float32), amax)
    with xp.errstate(over="ignore"):              # a tiny amax: inf, then FLT_MAX
        scale = xp.divide(backend.scalar(max_finite, xp.float32), safe)
    scale = xp.where(xp.isinf(scale), backend.scalar(_FLT_MAX, xp.float32), scale)
    if power_2:
        scale = bitcast(bitcast(scale, xp.int32) & _EXPONENT_FIELD, xp.float32)
    return xp.where(unit, backend.scalar(1.0, xp.float32), scale)


def _as_tiles(x2, tile):
    """The 2-D array padded with zeros to whole tiles, as (row tiles, tr, column tiles, tc)."""
    rows, cols = x2.shape
    tile_rows, tile_cols = tile
    padded_rows, padded_cols = -(-rows // tile_rows) * tile_rows, -(-cols // tile_cols) * tile_cols
    if (padded_rows, padded_cols) != (rows, cols):
        padded = xp.zeros((padded_rows, padded_cols), x2.dtype)
        padded[:rows, :cols] = x2
        x2 = padded
    return xp.reshape(x2, (padded_rows // tile_rows, tile_rows, padded_cols // tile_cols,
                           tile_cols))


def _from_tiles(tiles, shape):
    """Inverse of ``_as_tiles``: the tiles' elements in ``shape`` (padding dropped)."""
    rows_tiles, tile_rows, cols_tiles, tile_cols = tiles.shape
    full = xp.reshape(tiles, (rows_tiles * tile_rows, cols_tiles * tile_cols))
    rows, cols = _rows_cols(shape)
    return xp.reshape(full[:rows, :cols], shape)


def _rows_cols(shape) -> tuple[int, int]:
    cols = shape[-1] if shape else 1
    rows = 1
    for extent in shape[:-1]:
        rows *= extent
    return rows, cols


def tile_quantize(x, fmt="e4m3fn", tile=(1, 128), *, power_2: bool = True,
                  epsilon: float = 0.0) -> TileTensor:
    """Quantize the float32 array ``x`` with one float32 scale per ``tile`` of its 2-D view
    (rows = every leading dimension): ``(1, 128)`` for activations and gradients, ``(128,
    128)`` for weights (TE's ``Float8BlockScaling``); ``power_2`` (TE's default) keeps each
    scale a power of two, ``epsilon`` floors the amax (module docstring).

    >>> import numpy as np
    >>> t = tile_quantize(np.array([[1e-3, 500.0, float("nan")]], np.float32), "e4m3fn")
    >>> float(t.scales[0, 0]), [float(v) for v in t.elements[0]], t.flushed
    (0.5, [0.0, 256.0, nan], 1)
    """
    fmt = _element_format(fmt, TILE_FORMATS, "tile_quantize")
    x = _float32_array(x, "tile_quantize")
    tile = tuple(tile)
    if len(tile) != 2 or not all(isinstance(n, int) and n > 0 for n in tile):
        raise ValueError(f"tile_quantize: tile is (rows, columns) of positive ints, such as "
                         f"(1, 128) or (128, 128); got {tile!r}")
    shape = tuple(x.shape)
    tiles = _as_tiles(xp.reshape(x, _rows_cols(shape)), tile)
    amax = bitcast(_magnitude_max(tiles, (1, 3), skip_nan=True), xp.float32)
    scales = _tile_scales(amax, fmt.max_finite, bool(power_2), float(epsilon))
    scaled = tiles * xp.expand_dims(xp.expand_dims(scales, 1), 3)
    elements, saturated, flushed = _cast(scaled, tiles, fmt)
    scale_inv = xp.divide(backend.scalar(1.0, xp.float32), scales)
    return TileTensor(_from_tiles(elements, shape), scales, scale_inv, fmt, tile, saturated,
                      flushed)


def dequantize(quantized):
    """The float32 values an ``MXTensor`` or ``TileTensor`` stands for: ``fl32(element *
    X)`` with ``X`` the block's scale (MX, NaN in a 0xFF block) or ``scale_inv`` (tiles), as
    the frameworks' dequantize kernels compute it (a product beyond float32 is inf)."""
    if isinstance(quantized, MXTensor):
        elements = xp.moveaxis(quantized.elements, quantized.axis, -1)
        scales = xp.moveaxis(e8m0_to_float32(quantized.scale_codes), quantized.axis, -1)
        blocks = xp.reshape(elements, (*scales.shape, quantized.block))
        with xp.errstate(over="ignore"):      # a saturated element times 2**127: inf
            values = xp.reshape(blocks * xp.expand_dims(scales, -1), elements.shape)
        return xp.moveaxis(values, -1, quantized.axis)
    if isinstance(quantized, TileTensor):
        shape = tuple(quantized.elements.shape)
        tiles = _as_tiles(xp.reshape(quantized.elements, _rows_cols(shape)), quantized.tile)
        inverse = xp.expand_dims(xp.expand_dims(quantized.scale_inv, 1), 3)
        with xp.errstate(over="ignore"):
            return _from_tiles(tiles * inverse, shape)
    raise TypeError(f"dequantize takes an MXTensor or a TileTensor, got "
                    f"{type(quantized).__name__}")
