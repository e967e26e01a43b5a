"""Check a framework's MX (block-scaled) cast: the scale it chose for every block, then the
elements, against ``fpsim.quant.blocks.mx_quantize``.

An MX cast is two decisions: the E8M0 code of each block of 32 consecutive values (along the
last axis), ``X = 2**(code - 127)``, and each element ``round_sat(fl32(V / X), fmt)``. A
wrong scale choice -- an off-by-one exponent -- makes every element of its block differ by a
factor of two, so the scales are compared first, block by block, and the elements only in
the blocks whose scales agree, by class (``check_cast``'s classes, of ``V / X``).

The framework's scales come as uint8 E8M0 codes (torchao: ``scale.view(torch.uint8)``) or
ml_dtypes ``float8_e8m0fnu`` (saved by ``np.save`` as raw ``|V1`` bytes), shaped as the
source with the last axis divided by the block; its elements as ``check_cast`` takes them.

``rule`` is ``mx_quantize``'s ``ScaleRule``: ``"spec"`` (OCP MX's floor rule: torchao
0.18's ``to_mx`` with ``ScaleCalculationMode.FLOOR``) or ``"rceil"`` (Transformer Engine's
MXFP8). Where torchao differs by design (``fpsim.quant.blocks``'s docstring): FLOOR's code-0
blocks (amax below ``2**(emax - 126)``; the codes agree, torchao's elements are half of
these), RCEIL's NaN blocks (code 0xFF) and RCEIL amaxes an ulp above a power of two (one code
lower), which this check reports as the mismatches they are.

>>> import ml_dtypes, numpy as np
>>> x = np.linspace(-1, 1, 64, dtype=np.float32) * np.float32(1000)
>>> elements = np.clip(x / 2, -448, 448).astype(ml_dtypes.float8_e4m3fn)    # X = 2**1
>>> report = check_mx_cast(x, elements, np.uint8([128, 128]), "e4m3fn")
>>> report.agree, report.elements.counts["overflow"]
(True, 6)
>>> report = check_mx_cast(x, elements, np.uint8([128, 129]), "e4m3fn")
>>> report.scale_mismatches, report.skipped_values, report.scale_examples[0][2:]
(1, 32, (128, 129))
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import backend
from ..formats import get
from ..quant.blocks import MX_ELEMENT_FORMATS, ScaleRule, e8m0_to_float32, mx_quantize
from .cast_check import CastReport, compare_values, result_values

__all__ = ["check_mx_cast", "MXCastReport", "scale_codes"]


class MXCastReport(NamedTuple):
    """``scale_mismatches`` blocks of ``blocks`` chose another E8M0 code (``scale_examples``:
    block index, amax, our code, theirs); ``elements``: a ``CastReport`` of the elements in
    the blocks whose codes agree (``skipped_values`` were in the others)."""

    rule: str
    block: int
    blocks: int
    scale_mismatches: int
    scale_examples: tuple
    elements: CastReport
    skipped_values: int

    @property
    def agree(self) -> bool:
        return self.scale_mismatches == 0 and self.elements.agree

    def __str__(self) -> str:
        verdict = "all match" if self.agree else "mismatches"
        lines = [f"MX cast to {self.elements.format} (scale rule {self.rule}, blocks of "
                 f"{self.block}): {self.blocks} blocks, {self.elements.total + self.skipped_values}"
                 f" values, {verdict}",
                 f"  scales (e8m0 codes): {self.scale_mismatches} of {self.blocks} blocks "
                 f"differ"]
        for index, top, ours, theirs in self.scale_examples:
            lines.append(f"    block {index}: amax {top!r} -> code {ours} (2**{ours - 127}) | "
                         f"{theirs} (2**{theirs - 127})")
        if self.skipped_values:
            lines.append(f"  elements: {self.skipped_values} values in those blocks not "
                         f"compared")
        table = str(self.elements).splitlines()[1:]
        return "\n".join(lines + [f"  elements of the {self.blocks - self.scale_mismatches} "
                                  f"blocks whose scales agree:"] + table)


def scale_codes(codes, expected_shape: tuple) -> np.ndarray:
    """The framework's scales as uint8 E8M0 codes: uint8 as they are, raw one-byte items
    (``np.save`` of ``float8_e8m0fnu``) as their bytes; the shape must be ``expected_shape``."""
    codes = np.asarray(codes)
    if codes.dtype.kind == "V" and codes.dtype.itemsize == 1 and codes.dtype.fields is None:
        codes = codes.view(np.uint8)
    if codes.dtype != np.uint8:
        raise TypeError(f"the scales must be uint8 E8M0 codes (torchao: "
                        f"scale.view(torch.uint8)) or float8_e8m0fnu, got {codes.dtype.name}")
    if codes.shape != tuple(expected_shape):
        raise ValueError(f"the scales' shape is {codes.shape}; one code per block of the "
                         f"source's last axis is {tuple(expected_shape)}")
    return codes


def check_mx_cast(source, elements, codes, fmt, *, rule: str = "spec", block: int = 32,
                  bits: bool = False, max_examples: int = 10) -> MXCastReport:
    """Compare a framework's MX cast of the float32 ``source`` (its ``elements`` and its
    E8M0 scale ``codes``) with ``mx_quantize(source, fmt, scale_rule=rule, block=block)``
    along the last axis; see the module docstring."""
    fmt = get(fmt)
    if fmt.name not in MX_ELEMENT_FORMATS:
        raise ValueError(f"MX elements are {', '.join(MX_ELEMENT_FORMATS)}; got {fmt.name!r}")
    scale_rule = ScaleRule(rule) if rule in [r.value for r in ScaleRule] else None
    if scale_rule is None:
        raise ValueError(f"unknown MX scale rule {rule!r}; accepted: "
                         f"{', '.join(r.value for r in ScaleRule)}")
    source = np.asarray(source)
    if source.dtype != np.float32 or source.ndim == 0:
        raise TypeError(f"the MX source must be a float32 array of at least one axis, got "
                        f"{source.dtype.name} of shape {source.shape}")
    ours = mx_quantize(source, fmt, block=block, scale_rule=scale_rule)
    our_codes = backend.to_numpy(ours.scale_codes)
    theirs_codes = scale_codes(codes, our_codes.shape)
    if np.shape(elements) != source.shape:
        raise ValueError(f"shapes differ: source {source.shape}, elements "
                         f"{np.shape(elements)}; the elements are the cast of the source")
    theirs = result_values(np.asarray(elements), fmt, bits=bits)
    same_scale = np.repeat(our_codes == theirs_codes, block, axis=-1)
    factor = np.repeat(backend.to_numpy(e8m0_to_float32(our_codes)), block, axis=-1)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        scaled = source / factor                      # V / X, what the elements round
    report = compare_values(scaled, backend.to_numpy(ours.elements), theirs,
                            fmt.replace(saturate=True), "nearest_even", max_examples,
                            where=same_scale)
    differ = np.flatnonzero(our_codes != theirs_codes)
    amax = np.max(np.abs(source.reshape(*our_codes.shape, block)), axis=-1)
    examples = tuple((_index(flat, our_codes.shape), float(amax.reshape(-1)[flat]),
                      int(our_codes.reshape(-1)[flat]), int(theirs_codes.reshape(-1)[flat]))
                     for flat in differ[:max_examples])
    return MXCastReport(scale_rule.value, block, int(our_codes.size), int(differ.size),
                        examples, report, int(np.count_nonzero(~same_scale)))


def _index(flat: int, shape: tuple):
    index = np.unravel_index(flat, shape)
    return int(index[0]) if len(shape) == 1 else tuple(int(i) for i in index)
