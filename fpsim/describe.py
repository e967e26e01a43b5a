"""A value taken apart in a format, for teaching: sign, exponent and mantissa bits, class, and
the exact decimal value of what is stored.

>>> d = describe(0.1, "fp16")
>>> d.sign, d.exponent_bits, d.mantissa_bits, d.kind
(0, '01011', '1001100110', 'normal')
>>> d.exact
'0.0999755859375'
>>> describe(2.0 ** -24, "fp16").kind
'subnormal'
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from numbers import Real

import numpy as np

from .encoding import encode
from .formats import Format, get
from .options import check_instance, described
from .rounding import round_to

__all__ = ["describe", "Description"]


@dataclass(frozen=True)
class Description:
    format: Format
    input: float
    value: float          # what the format stores: input rounded once with ``mode``
    bits: int             # the encoding as an unsigned integer
    sign: int
    exponent_bits: str
    mantissa_bits: str
    kind: str             # "zero", "subnormal", "normal", "inf" or "nan"
    exponent: int | None  # unbiased exponent of the leading bit (None for zero, inf, NaN)
    exact: str            # exact decimal expansion of ``value``

    @property
    def rounding_error(self) -> float:
        """value - input, in float64."""
        return self.value - self.input

    def __str__(self) -> str:
        width = (self.format.bits + 3) // 4
        lines = [
            f"{self.input!r} in {self.format.name} "
            f"(1 sign, {self.format.exp_bits} exponent, {self.format.man_bits} mantissa bits)",
            f"  stored value  {self.exact}" + (
                "" if self.value == self.input or self.kind == "nan"
                else f"   (rounding error {self.rounding_error:+.6g})"),
            f"  bits          {self.sign} {self.exponent_bits} {self.mantissa_bits}"
            f"   = 0x{self.bits:0{width}X}",
            f"  class         {self.kind}",
        ]
        if self.kind in ("normal", "subnormal"):
            lead = "1" if self.kind == "normal" else "0"
            lines.append(f"  reads as      (-1)^{self.sign} * {lead}.{self.mantissa_bits}b"
                         f" * 2^{self.format.emin if self.kind == 'subnormal' else self.exponent}")
        return "\n".join(lines)


def describe(value: float, fmt: "Format | str", mode: str = "nearest_even") -> Description:
    """Round ``value`` (one real number: inf and NaN too) into ``fmt`` (once, with ``mode``)
    and take the result apart."""
    check_instance("value", value, Real, "one real number (a Python or NumPy scalar; inf and "
                                         "nan too)")
    try:
        given = float(value)
    except OverflowError:       # an integer like 10**400: float('inf') is how to ask for inf
        raise ValueError(f"value must be within float64's range (up to about 1.8e308), got "
                         f"{described(value)}") from None
    fmt = get(fmt)
    if mode == "stochastic":
        raise ValueError("describe shows one deterministic rounding; pick a mode other than "
                         "'stochastic'")
    stored = round_to(given, fmt, mode)
    bits = int(encode(stored, fmt))
    sign = bits >> (fmt.bits - 1)
    exponent_field = (bits >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    mantissa = bits & ((1 << fmt.man_bits) - 1)
    if np.isnan(stored):
        kind = "nan"
    elif np.isinf(stored):
        kind = "inf"
    elif stored == 0:
        kind = "zero"
    elif exponent_field == 0:
        kind = "subnormal"
    else:
        kind = "normal"
    exponent = None
    if kind == "normal":
        exponent = exponent_field - fmt.bias
    elif kind == "subnormal":
        exponent = fmt.emin - fmt.man_bits + mantissa.bit_length() - 1
    exact = (f"{Decimal.from_float(float(stored)):f}" if kind in ("normal", "subnormal", "zero")
             else repr(stored))
    return Description(fmt, given, stored, bits, sign, format(exponent_field, f"0{fmt.exp_bits}b"),
                       format(mantissa, f"0{fmt.man_bits}b"), kind, exponent, exact)
