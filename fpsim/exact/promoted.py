"""The ``promoted`` model: Hopper's FP8 GEMMs, limited-precision tensor-core accumulation with
partial results promoted into an fp32 accumulator every ``interval`` products.

``PromotedAccumulation(inner, interval)`` computes a dot product of K exact products as::

    acc = +0                                        # fp32, on the CUDA cores
    for each chunk of `interval` consecutive products (the last one may be shorter):
        part = the `inner` blocked model over the chunk, from +0   # the tensor core
        acc = round_fp32(acc + part)                # nearest even, one rounding
    interval=None: no promotion, the inner model over all of K (its result is the output)

The inner model is a ``BlockedAccumulation`` (``block_fma``: alignment to the block's largest
exponent, the accumulator included, truncation, one rounding of each block into its format).
The preset ``hopper_fp8_tensor_core(input_format)`` sets it to what was measured on H100:

- blocks of k = 32 products, F = 13 fraction bits kept below the block's largest exponent
  (every term truncated toward zero), the block's sum rounded toward zero into a format with
  fp32's exponent range and 13 fraction bits (``e8m13``): Khattak & Mikaitis, "Accurate
  Models of NVIDIA Tensor Cores", arXiv:2512.07004 (2025), whose H100 model
  (north-numerical-computing/MATLAB-tensor-core, models/H100TC.m: fma = 32, neab = -10,
  final rounding 'rz'; models/tools/GEMM.m shortens the output's mantissa by a negative
  neab: 23 - 10 = 13) they checked bit for bit against H100 outputs. The same numbers as
  DeepSeek-V3's report (arXiv:2412.19437, 3.5.2: 32 products aligned to the maximum
  exponent, the highest 14 bits kept, truncated, 14-bit accumulation in the registers) and
  SageAttention2's (the accumulator of mma f32.f8.f8.f32: 1 sign, 8 exponent, 13 mantissa
  bits, the rest of an fp32 C truncated). tests/test_accumulation_fp8.py reproduces 1000 of
  Khattak & Mikaitis's measured H100 outputs (one block each, C = 0) bit for bit.
- interval 128 (``"h100-fp8:promote=128"``): DeepSeek-V3's N_C = 128 (3.3.2, four WGMMAs),
  a choice of their kernels (DeepGEMM), not of the hardware.

Assumed here, not measured: the promotion is one fp32 addition rounded to nearest even (the
CUDA cores' FADD; DeepGEMM's FFMA also multiplies by the blocks' scales, which for powers of
two changes no bit unless the result over- or underflows); each chunk starts from +0 and is
cut into blocks of k from its own start; the products' order inside a block and the tile
order of the hardware are not modelled, nor the MATLAB model's exponent floor
(min_exp_limit, for sums near 2**-133), fp32 overflow as the hardware gives it (``round_to``'s
IEEE rule here) or a mixed e4m3 x e5m2 product's subnormals (``input_format`` reads both
operands). Inputs scaled by a power of two per operand (FP8 values times a scale) give the
unscaled inputs' result times the scales, bit for bit, while no input, scaled or not, is
below its format's smallest normal and nothing over- or underflows.

A product 448 * 448 then 4095 products 1: beside a partial sum near 2**17, the quantum of
the tensor core's addition is 2**(17 - 13) = 16 and every 1 is truncated away; promotion
loses only the 127 ones of the first chunk:

>>> import numpy as np
>>> from fpsim.exact.accumulation import matmul
>>> a = np.ones((1, 4096), np.float32); a[0, 0] = 448.0; b = a.T.copy()
>>> [float(matmul(a, b, out_fmt="fp32", model=m)[0, 0])
...  for m in ("exact", "h100-fp8", "h100-fp8:promote=128")]
[204799.0, 200704.0, 204672.0]
"""
from __future__ import annotations

from dataclasses import dataclass

from ..backend import round_to, xp
from ..formats import FP32, get
from ..options import check_count
from . import block_fma as blocks
from .accumulation import Accumulation, BlockedAccumulation, get_accumulation, register_spec
from .odd_rounding import add_round_to_odd

__all__ = ["PromotedAccumulation", "hopper_fp8_tensor_core", "HOPPER_FP8_ACCUMULATOR"]

HOPPER_FP8_ACCUMULATOR = get("e8m13")   # fp32's exponents, 13 fraction bits (a "FP22")
FP8_INPUTS = ("e4m3fn", "e5m2")


def hopper_fp8_tensor_core(input_format="e4m3") -> BlockedAccumulation:
    """H100's FP8 tensor-core addition (Khattak & Mikaitis): 32 products, 13 alignment bits,
    each block rounded toward zero into ``HOPPER_FP8_ACCUMULATOR``."""
    fmt = get(input_format)
    if fmt.name not in FP8_INPUTS:
        raise ValueError(f"the Hopper FP8 preset models e4m3 and e5m2 inputs, not {fmt.name}")
    return BlockedAccumulation(32, HOPPER_FP8_ACCUMULATOR, 13, "toward_zero", fmt)


@dataclass(frozen=True)
class PromotedAccumulation(Accumulation):
    """``inner`` over chunks of ``interval`` products, each chunk's result added (rounded to
    nearest even) into an fp32 accumulator; ``interval=None``: ``inner`` over all of K.

    >>> str(PromotedAccumulation.h100_fp8(128)), str(PromotedAccumulation.h100_fp8())
    ('h100-fp8:promote=128', 'h100-fp8')
    """

    inner: BlockedAccumulation
    interval: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.inner, BlockedAccumulation):
            raise TypeError(f"promoted: inner must be a BlockedAccumulation, "
                            f"got {type(self.inner).__name__}")
        if self.interval is not None:       # products per promotion
            object.__setattr__(self, "interval",
                               check_count("promoted: interval", self.interval, 1))

    @classmethod
    def h100_fp8(cls, interval=None, input_format="e4m3") -> "PromotedAccumulation":
        """H100 FP8 GEMM: no promotion (``interval=None``) or promotion every ``interval``."""
        return cls(hopper_fp8_tensor_core(input_format), interval)

    def __str__(self) -> str:
        for name in FP8_INPUTS:
            if self.inner == hopper_fp8_tensor_core(name):
                options = [] if self.interval is None else [f"promote={self.interval}"]
                options += [] if name == "e4m3fn" else [f"input={name}"]
                return ":".join(["h100-fp8"] + options)
        interval = "none" if self.interval is None else str(self.interval)
        return f"promoted:{interval}:{self.inner}"

    def accumulate_matmul(self, a64, b64) -> xp.ndarray:
        """(nb, M, K) @ (nb, K, N) float64 (float32 values) -> float64 fp32 values."""
        return self._promote(
            lambda start, stop: blocks.blocked_matmul(a64[:, :, start:stop],
                                                      b64[:, start:stop, :], self.inner),
            a64.shape[2], (a64.shape[0], a64.shape[1], b64.shape[2]))

    def accumulate_rows(self, x64) -> xp.ndarray:
        """Row sums of an (n, K) float64 array (float32 values) -> float64 fp32 values."""
        return self._promote(
            lambda start, stop: blocks.blocked_rows(x64[:, start:stop], self.inner),
            x64.shape[1], (x64.shape[0],))

    def _promote(self, chunk_sum, count: int, shape: tuple) -> xp.ndarray:
        if self.interval is None:
            return chunk_sum(0, count)
        acc = xp.zeros(shape, xp.float64)
        with xp.errstate(over="ignore", invalid="ignore"):
            for start in range(0, count, self.interval):
                part = chunk_sum(start, min(start + self.interval, count))
                # acc + part may be inexact in float64: rounded to odd, then once to fp32
                acc = round_to(add_round_to_odd(acc, part), FP32)
        return acc


def _parse_h100_fp8(fields: list) -> PromotedAccumulation:
    options = {}
    for item in fields:
        key, _, value = item.partition("=")
        if key not in ("promote", "input") or not value or key in options:
            raise ValueError(f"unknown or repeated h100-fp8 option {item!r}; accepted: "
                             f"':promote=N', ':input=e4m3' or ':input=e5m2'")
        options[key] = value
    promote = options.get("promote")
    if promote is not None and not promote.isdigit():
        raise ValueError(f"promote must be a positive integer, got {promote!r}")
    return PromotedAccumulation.h100_fp8(None if promote is None else int(promote),
                                         options.get("input", "e4m3"))


def _parse_promoted(fields: list) -> PromotedAccumulation:
    if len(fields) < 2 or not (fields[0].isdigit() or fields[0] == "none"):
        raise ValueError("the form is 'promoted:N:BLOCKED' (N a positive integer or 'none', "
                         "BLOCKED a blocked spec)")
    inner = get_accumulation(":".join(fields[1:]))
    return PromotedAccumulation(inner, None if fields[0] == "none" else int(fields[0]))


register_spec("h100-fp8", _parse_h100_fp8)
register_spec("promoted", _parse_promoted)
