"""NVFP4: FP4 E2M1 elements in 16-element blocks with E4M3 scales and a per-tensor FP32 scale,
as NVIDIA Transformer Engine and torchao compute them; and the random Hadamard transform.
The block scales are UE4M3 (torchao's name): e4m3fn values that are never negative (they come
from magnitudes), so ``e4m3fn`` rounding gives them; the sign bit stays unused.

A tensor is seen as 2-D (rows, columns), the blocks run along the columns (the GEMM's
reduction dimension). Tiles (TE's ``NVFP4BlockScaling`` recipe, ``docs/features/
low_precision_training/nvfp4/nvfp4.rst``): ``(1, 16)`` for activations and gradients,
``(16, 16)`` for weights (one scale for 16 rows and 16 columns, so the rowwise and the
columnwise copy of a weight quantize alike). Rounding: nearest even for weights and
activations, stochastic for gradients (``mode="stochastic"``: fpsim's Philox draws, seed and
offset as ``round_to``'s; TE's kernels draw their own bits on the GPU, ``cvt.rs``, which no CPU
reproduces, and its reference has no stochastic rounding; torchao has none). Every step below
is one float32 operation (``fl32``), in this order:

**TE** (``NVFP4Rule.TE``): ``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``,
``NVFP4QuantizerRef._quantize_blockwise_reference`` (the reference its kernels are tested
against; the kernel's ``compute_global_encode_scaling_factor_FP4`` and
``compute_decoding_scaling_factor``, ``common/cast/nvfp4/core_nvfp4.cuh``, are the same steps):

- ``S_enc = min(fl32(2688 / amax), FLT_MAX)`` (2688 = 448 * 6), 1 where that is 0 (an infinite
  amax); ``S_dec = fl32(1 / S_enc)``;
- block scale ``s = e4m3(clamp(min(fl32(amax_b * fl32(S_enc * fl32(1/6))), FLT_MAX), 448))``
  (``amax_b`` the block's largest magnitude; the cast rounds to nearest even);
- element ``q = fp4(clamp(fl32(x * min(fl32(1 / fl32(s * S_dec)), FLT_MAX)), 6))``;
- dequantized (``common/cast/nvfp4/dequantize_nvfp4.cuh``, ``dequantize_fp4_kernel``):
  ``fl32(q * fl32(fl32(s * amax) * fl32(1 / 2688)))``.

**torchao** (``NVFP4Rule.TORCHAO``): 0.18's ``torchao/prototype/mx_formats/nvfp4_tensor.py``,
``nvfp4_quantize`` with a per-tensor scale from ``per_tensor_amax_to_scale`` (its two-level
scaling; without one it scales per block only, not modelled here):

- ``p = fl32(amax / 2688)``; ``s = e4m3(clamp(fl32(fl32(amax_b / 6) / p), 2**-6, 448))``
  (``E4M3_EPS``, e4m3's smallest normal, is the floor);
- ``q = fp4(clamp(fl32(x * fl32(fl32(1 / p) / s)), 6))`` (``f32_to_f4_unpacked``);
- dequantized (``NVFP4Tensor.dequantize``, ``get_hp_scales``): ``fl32(q * fl32(p * s))``.

Where they differ (pinned by ``tests/test_quant_nvfp4.py``): TE divides the block amax by 6
through the rounded reciprocal ``fl32(1/6)`` folded into ``S_enc``, torchao divides by 6 and by
``p``: the two roundings differ, and so, at ties of e4m3, do the scales (and then the elements);
TE's smallest block scale is 0 (an all-zero block, encode factor FLT_MAX), torchao's is 2**-6;
an all-zero tensor gives TE zero scales and elements, torchao ``0 / 0``: NaN scales and
elements. The TE reference's FP4 cast (``cast_to_fp4x2``, comparisons) writes -0 and NaN as
+0, torchao's writes NaN as +-1.5 (the bits of its normal branch); here -0 stays -0 (as the
``cvt.rn.satfinite.e2m1x2`` instruction keeps signs) and NaN stays NaN. A NaN anywhere makes
the tensor amax NaN (``torch.amax``, as both compute it), so every scale and element is NaN.
The NVIDIA paper ("Pretraining Large Language Models with NVFP4", 2025) gives the same
two-level formulas as TE (global encode scale 6 * 448 / amax, block decode scale amax_b / 6
times it, stored in E4M3).

**Random Hadamard transform** (``random_hadamard_transform``): TE applies it to the columnwise
copies of activations and gradients, the two operands of the weight-gradient GEMM, before
quantization: each 16 consecutive elements along the last axis times ``S H16 / 4``, ``H16``
Sylvester's Hadamard matrix and ``S`` the diagonal of a fixed sign vector
(``reference_nvfp4.py``: ``get_wgrad_sign_vector``, ``_build_hadamard_matrix``,
``_apply_rht``). ``(S H16 / 4)(S H16 / 4)^T = I``, so the transforms of the two operands cancel
in the product. Here each output is the exact sum of its 16 products rounded once to float32
(``fpsim.exact``); TE's reference multiplies with torch's float32 matmul and its kernel on bf16
inputs, whose summation orders are theirs: their last float32 bit may differ from this one's.

>>> import numpy as np
>>> x = np.float32([[6.0, -3.0, 1.0, 0.25] * 4])
>>> q = nvfp4_quantize(x)
>>> float(q.scales[0, 0]), [float(v) for v in q.elements[0, :4]]
(448.0, [6.0, -3.0, 1.0, 0.0])
>>> [float(v) for v in nvfp4_dequantize(q)[0, :4]]
[6.0, -3.0, 1.0, 0.0]
"""
from __future__ import annotations

import enum
from typing import NamedTuple

from .. import backend
from ..backend import round_to, xp
from ..exact.accumulation import matmul
from ..formats import E2M1, E4M3FN, FP32
from ..options import check_choice, check_count_between
from .tensor_scaling import count_saturated, fl32

__all__ = ["NVFP4Rule", "NVFP4Tensor", "NVFP4_TILES", "TE_WGRAD_SIGNS", "nvfp4_quantize",
           "nvfp4_dequantize", "random_hadamard_transform", "hadamard_matrix"]

#: (rows, columns) of the blocks sharing a scale: activations and gradients, weights
NVFP4_TILES = ((1, 16), (16, 16))
#: TE's fixed "random" signs of the Hadamard rows (reference_nvfp4.py, get_wgrad_sign_vector)
TE_WGRAD_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
_BLOCK = 16
_FP4_MAX = 6.0
_E4M3_MAX = 448.0
_GLOBAL = _E4M3_MAX * _FP4_MAX                 # 2688, exact
_FLT_MAX = 3.4028234663852886e38
_E4M3_EPS = 2.0 ** -6                          # torchao's floor: e4m3fn's smallest normal


class NVFP4Rule(enum.Enum):
    """Whose scale arithmetic (module docstring)."""

    TE = "te"
    TORCHAO = "torchao"


class NVFP4Tensor(NamedTuple):
    """An NVFP4-quantized 2-D tensor: ``elements`` (float32 container of FP4 E2M1 values, the
    input's shape), ``scales`` (float32 holding the E4M3 block scales, one per row and block of
    16 columns: a 16x16 tile's on each of its 16 rows, as TE stores them), ``amax`` (float32
    0-d: the tensor's largest magnitude, which the per-tensor scale comes from), the tile, the
    rule, and the counts of saturated (beyond 6 before the clamp) and flushed elements."""

    elements: xp.ndarray
    scales: xp.ndarray
    amax: xp.ndarray
    tile: tuple
    rule: NVFP4Rule
    saturated: int
    flushed: int


def _f32(value: float):
    return backend.scalar(fl32(value), xp.float32)


def _checked(x, tile, rule, mode, seed, offset):
    """The arguments, checked before any work: (x, tile, rule, seed, offset)."""
    rule = NVFP4Rule(check_choice("rule", getattr(rule, "value", rule),
                                  tuple(r.value for r in NVFP4Rule)))
    check_choice("mode", mode, ("nearest_even", "stochastic"))
    if mode == "nearest_even" and (seed is not None or offset is not None):
        raise ValueError("seed and offset are only used by mode='stochastic'")
    if mode == "stochastic":
        if seed is None:
            raise ValueError("mode='stochastic' needs seed=int (with optional offset=), so "
                             "that runs repeat")
        seed = check_count_between("seed", seed, 0, 2**64 - 1)
        offset = check_count_between("offset", 0 if offset is None else offset, 0, 2**64 - 1)
    if not isinstance(tile, (tuple, list)):
        raise TypeError(f"tile must be (1, 16) or (16, 16), got {type(tile).__name__}")
    if tuple(tile) not in NVFP4_TILES:
        raise ValueError(f"tile must be (1, 16) or (16, 16), got {tuple(tile)!r}")
    tile = tuple(tile)
    if backend.is_array_like(x) and not backend.is_array(x):
        x = backend.asarray(x, x.dtype)
    if not backend.is_array(x) or x.dtype != xp.float32 or x.ndim != 2:
        raise TypeError(f"nvfp4_quantize takes a 2-D float32 array, got "
                        f"{getattr(x, 'dtype', type(x).__name__)} of "
                        f"{getattr(x, 'ndim', 0)} dimensions")
    rows, cols = x.shape
    if cols % _BLOCK or rows % tile[0]:
        raise ValueError(f"nvfp4_quantize: x has shape {tuple(x.shape)}; {tile[0]}x{tile[1]} "
                         f"tiles take columns a multiple of 16 and rows a multiple of "
                         f"{tile[0]}")
    if mode == "stochastic" and offset + rows * cols > 2**64:
        raise ValueError(f"offset + x.size must not pass 2**64 (offset={offset})")
    return x, tile, rule, seed, offset


def _block_amax(x, tile):
    """The largest magnitude of each block, one per row and 16 columns (NaN propagates)."""
    rows, cols = x.shape
    if tile == (1, _BLOCK):
        return xp.max(xp.abs(xp.reshape(x, (rows, cols // _BLOCK, _BLOCK))), axis=-1)
    tiles = xp.reshape(xp.abs(x), (rows // _BLOCK, _BLOCK, cols // _BLOCK, _BLOCK))
    amax = xp.max(xp.max(tiles, axis=3), axis=1)
    spread = xp.broadcast_to(xp.expand_dims(amax, 1), (rows // _BLOCK, _BLOCK, cols // _BLOCK))
    return xp.reshape(spread, (rows, cols // _BLOCK))


def _te_scales(amax, block_amax):
    """TE's block scales (e4m3 values) and element factors (module docstring)."""
    flt_max = _f32(_FLT_MAX)
    s_enc = xp.minimum(_f32(_GLOBAL) / amax, flt_max)
    s_enc = xp.where(s_enc == 0, _f32(1.0), s_enc)
    s_dec = _f32(1.0) / s_enc
    decode = xp.minimum(block_amax * (s_enc * _f32(1.0 / _FP4_MAX)), flt_max)
    scales = round_to(xp.clip(decode, _f32(-_E4M3_MAX), _f32(_E4M3_MAX)), E4M3FN)
    factors = xp.minimum(_f32(1.0) / (scales * s_dec), flt_max)
    return scales, factors


def _torchao_scales(amax, block_amax):
    """torchao's block scales and element factors (module docstring)."""
    per_tensor = amax / _f32(_GLOBAL)
    ratio = (block_amax / _f32(_FP4_MAX)) / per_tensor
    scales = round_to(xp.clip(ratio, _f32(_E4M3_EPS), _f32(_E4M3_MAX)), E4M3FN)
    return scales, (_f32(1.0) / per_tensor) / scales


def nvfp4_quantize(x, *, tile=(1, 16), rule=NVFP4Rule.TE, mode: str = "nearest_even",
                   seed=None, offset=None) -> NVFP4Tensor:
    """Quantize the 2-D float32 array ``x`` to NVFP4 along its rows: blocks of 16 columns
    (``tile`` (1, 16)) or 16x16 tiles, E4M3 scales and the per-tensor scale by ``rule``, the
    elements rounded to nearest even or, with ``mode="stochastic"`` (``seed``, ``offset``:
    ``round_to``'s; element i in C order draws counter offset + i), stochastically.

    >>> import numpy as np
    >>> nvfp4_quantize(np.zeros((2, 20), np.float32))
    Traceback (most recent call last):
    ValueError: nvfp4_quantize: x has shape (2, 20); 1x16 tiles take columns a multiple of 16 and
    rows a multiple of 1
    """
    x, tile, rule, seed, offset = _checked(x, tile, rule, mode, seed, offset)
    rows, cols = x.shape
    amax = xp.max(xp.abs(x)) if rows * cols else _f32(0.0)
    with backend.errstate(divide="ignore", over="ignore", invalid="ignore"):
        block_amax = _block_amax(x, tile)
        scales, factors = (_te_scales if rule is NVFP4Rule.TE else _torchao_scales)(
            amax, block_amax)
        blocks = xp.reshape(x, (rows, cols // _BLOCK, _BLOCK))
        scaled = xp.reshape(blocks * xp.expand_dims(factors, -1), (rows, cols))
    saturated = count_saturated(scaled, E2M1)
    clamped = xp.clip(scaled, _f32(-_FP4_MAX), _f32(_FP4_MAX))
    options = {"seed": seed, "offset": offset} if mode == "stochastic" else {}
    elements = round_to(clamped, E2M1, mode, **options)
    flushed = int(xp.count_nonzero((elements == 0) & (x != 0)))
    return NVFP4Tensor(elements, scales, amax, tile, rule, saturated, flushed)


def nvfp4_dequantize(quantized: NVFP4Tensor):
    """The float32 values an ``NVFP4Tensor`` stands for, as its rule's dequantize computes
    them (module docstring)."""
    if not isinstance(quantized, NVFP4Tensor):
        raise TypeError(f"nvfp4_dequantize takes an NVFP4Tensor, got "
                        f"{type(quantized).__name__}")
    rows, cols = quantized.elements.shape
    with backend.errstate(over="ignore", invalid="ignore"):
        if quantized.rule is NVFP4Rule.TE:
            factors = (quantized.scales * quantized.amax) * _f32(1.0 / _GLOBAL)
        else:
            factors = (quantized.amax / _f32(_GLOBAL)) * quantized.scales
        blocks = xp.reshape(quantized.elements, (rows, cols // _BLOCK, _BLOCK))
        return xp.reshape(blocks * xp.expand_dims(factors, -1), (rows, cols))


def hadamard_matrix(signs=TE_WGRAD_SIGNS):
    """``S H16 / 4`` as a float32 (16, 16) array: Sylvester's Hadamard matrix, its rows times
    ``signs`` (16 values, each 1 or -1), scaled to be orthogonal (exact: entries +-1/4)."""
    signs = tuple(signs)
    if len(signs) != _BLOCK or any(s not in (1, -1) for s in signs):
        raise ValueError(f"signs must be 16 values, each 1 or -1; got {signs!r}")
    rows = [[1]]
    while len(rows) < _BLOCK:
        rows = [r + r for r in rows] + [r + [-v for v in r] for r in rows]
    return backend.asarray([[s * v * 0.25 for v in row] for s, row in zip(signs, rows)],
                           xp.float32)


def random_hadamard_transform(x, signs=TE_WGRAD_SIGNS):
    """``x`` (float32, last axis a multiple of 16) with each 16 consecutive elements of the
    last axis multiplied by ``hadamard_matrix(signs)``, each result the exact sum rounded once
    to float32 (module docstring).

    >>> import numpy as np
    >>> h = hadamard_matrix()
    >>> bool((h @ h.T == np.eye(16)).all()), bool((random_hadamard_transform(np.eye(16,
    ...     dtype=np.float32)) == h).all())
    (True, True)
    """
    if not backend.is_array(x) or x.dtype != xp.float32 or x.ndim == 0:
        raise TypeError(f"random_hadamard_transform takes a float32 array, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.shape[-1] % _BLOCK:
        raise ValueError(f"random_hadamard_transform: the last axis of shape "
                         f"{tuple(x.shape)} is not a multiple of 16")
    transform = hadamard_matrix(signs)
    rows = matmul(xp.reshape(x, (-1, _BLOCK)), transform, out_fmt=FP32)
    return xp.reshape(rows, x.shape)
