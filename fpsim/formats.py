"""What a number type is: the ``Format`` value, the built-in formats and name lookup.

A ``Format`` describes a binary floating-point type with one sign bit, ``exp_bits`` exponent
bits and ``man_bits`` stored mantissa (fraction) bits. Every format here fits a float32
container: each of its values is exactly a float32 value (2..8 exponent bits, 1..23 mantissa
bits, and an exponent range inside float32's), so a float32 array can hold it without loss.

Four encoding styles cover the formats in use:

``"ieee"``
    IEEE 754 style: the all-ones exponent holds infinities (mantissa 0) and NaNs.
``"fn"``
    "finite, NaN": no infinities; the all-ones exponent holds normal numbers except the one
    pattern with all mantissa bits set, which is NaN (OCP FP8 E4M3, ``float8_e4m3fn``,
    max 448).
``"fnuz"``
    "finite, NaN, unsigned zero": no infinities, no negative zero; the single NaN is the
    pattern with only the sign bit set, ``0x80`` for 8-bit formats (``float8_e4m3fnuz``).
``"finite"``
    no infinities and no NaN: every pattern is a number, the all-ones exponent included (OCP
    MX v1.0's FP4 E2M1, max 6, and FP6 E2M3 and E3M2, max 7.5 and 28; ml_dtypes'
    ``float4_e2m1fn``, ``float6_e2m3fn``, ``float6_e3m2fn``). Overflow has nothing to go to
    but the largest value: these formats always saturate (``saturate`` must be True), infinite
    inputs included, as the spec's conversions (section 5.3.3) and ml_dtypes' casts do. A NaN
    input has no value to become: rounding keeps it NaN in the float32 container (the quiet NaN
    with its sign, as for ``fn``) and ``encode`` refuses it; ml_dtypes' cast writes a zero of
    the opposite sign instead (measured, ml_dtypes 0.6: NaN -> -0, -NaN -> +0), which would
    turn a NaN into a number silently.

The names of well-known libraries mean what they mean there: ``"float4_e2m1fn"`` (ml_dtypes,
and ``"fp4_e2m1"``, ``"fp4"``) is OCP FP4 with largest value 6, not an ``fn``-encoded e2m1;
``"eXmYfn"`` without a width prefix keeps meaning the ``fn`` encoding (``"e2m1fn"``: max 4;
``"e3m1finite"`` is a ``finite`` one), and a width prefix must add up (``"fp8_e2m1"`` is
refused).

>>> get("float4_e2m1fn").max_finite, get("float6_e2m3fn").max_finite, get("fp6_e3m2").max_finite
(6.0, 7.5, 28.0)

>>> from fpsim import formats
>>> fp16 = formats.get("half")
>>> fp16.max_finite, fp16.smallest_subnormal == 2.0 ** -24
(65504.0, True)
>>> formats.get("e5m10") == fp16        # the same number type under another name
True
"""
from __future__ import annotations

import dataclasses
import operator
import re
from dataclasses import dataclass, field

__all__ = [
    "Format", "custom", "get", "builtins", "names",
    "FP32", "TF32", "FP16", "BF16", "E4M3FN", "E5M2", "E4M3FNUZ", "E5M2FNUZ",
    "E2M1", "E2M3", "E3M2",
]

ENCODINGS = ("ieee", "fn", "fnuz", "finite")


@dataclass(frozen=True)
class Format:
    """A binary floating-point format that fits a float32 container.

    ``name`` is a label only: two formats with the same layout, bias, encoding and rules are
    equal whatever they are called.

    ``subnormals``: False makes rounding flush subnormal results to zero (after rounding).
    ``saturate``: what overflow gives. False: infinity where the encoding has one, NaN where it
    has none (as ml_dtypes' casts to ``float8_e4m3fn`` do; PyTorch 2.13's cast saturates
    instead, so ``saturate=True`` matches it); True: the largest
    finite value of the same sign. The ``finite`` encoding has neither: always True.
    """

    name: str = field(compare=False)
    exp_bits: int
    man_bits: int
    bias: int
    subnormals: bool = True
    saturate: bool = False
    encoding: str = "ieee"

    def __post_init__(self) -> None:
        _validate(self)
        # the hash, once: of ints only, so the same in every process (a pickled format keeps
        # it); equal formats have equal fields, so equal hashes
        object.__setattr__(self, "_hash", hash((self.exp_bits, self.man_bits, self.bias,
                                                self.subnormals, self.saturate,
                                                ENCODINGS.index(self.encoding))))

    # The dataclass's own comparison (every field but ``name``), with the identity test
    # first and field by field: formats are compared on every op (``fmt == FP32``).
    def __eq__(self, other):
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.man_bits == other.man_bits and self.exp_bits == other.exp_bits
                and self.bias == other.bias and self.subnormals == other.subnormals
                and self.saturate == other.saturate and self.encoding == other.encoding)

    def __hash__(self) -> int:
        return self._hash

    # --- layout ---------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Total width of the encoding in bits."""
        return 1 + self.exp_bits + self.man_bits

    @property
    def precision(self) -> int:
        """Significand precision p in bits, the implicit leading bit included."""
        return self.man_bits + 1

    @property
    def has_inf(self) -> bool:
        return self.encoding == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.encoding != "finite"

    @property
    def has_negative_zero(self) -> bool:
        return self.encoding != "fnuz"

    # --- exponent range -------------------------------------------------------------------
    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number, 2**emin."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite binade."""
        top_field = (1 << self.exp_bits) - 1
        if self.encoding == "ieee":
            top_field -= 1  # the all-ones exponent is reserved for inf and NaN
        return top_field - self.bias

    # --- exact constants (Python floats, exact by construction) ----------------------------
    @property
    def max_finite(self) -> float:
        top_mantissa = (1 << self.man_bits) - 1
        if self.encoding == "fn":
            top_mantissa -= 1  # all-ones exponent and mantissa is NaN
        return (1.0 + top_mantissa / (1 << self.man_bits)) * 2.0 ** self.emax

    @property
    def min_normal(self) -> float:
        return 2.0 ** self.emin

    @property
    def smallest_subnormal(self) -> float:
        """The subnormal quantum 2**(emin - man_bits); results below ``min_normal`` flush to
        zero instead when ``subnormals`` is False."""
        return 2.0 ** (self.emin - self.man_bits)

    @property
    def epsilon(self) -> float:
        """Distance from 1.0 to the next larger value, 2**-man_bits."""
        return 2.0 ** -self.man_bits

    @property
    def bit_dtype(self) -> str:
        """Name of the smallest unsigned NumPy integer dtype that holds an encoding."""
        return "uint8" if self.bits <= 8 else "uint16" if self.bits <= 16 else "uint32"

    def replace(self, **changes) -> "Format":
        """A copy with some fields changed, e.g. ``FP16.replace(subnormals=False)``."""
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return self.name


def _validate(fmt: Format) -> None:
    for label, value in (("exp_bits", fmt.exp_bits), ("man_bits", fmt.man_bits),
                         ("bias", fmt.bias)):
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{label} must be an int, got {value!r}")
        object.__setattr__(fmt, label, operator.index(value))   # NumPy integers as ints
    for label, value in (("subnormals", fmt.subnormals), ("saturate", fmt.saturate)):
        if not isinstance(value, bool):
            raise TypeError(f"{label} must be True or False, got {value!r}")
    if not isinstance(fmt.name, str):
        raise TypeError(f"name must be a str, got {fmt.name!r}")
    if fmt.encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {fmt.encoding!r}")
    if not 2 <= fmt.exp_bits <= 8:
        raise ValueError(f"exp_bits must be 2..8 to fit a float32 container, got {fmt.exp_bits}")
    if not 1 <= fmt.man_bits <= 23:
        raise ValueError(f"man_bits must be 1..23 to fit a float32 container, got {fmt.man_bits}")
    if fmt.encoding == "fn" and fmt.exp_bits == 1:
        raise ValueError("an 'fn' format needs at least 2 exponent bits")
    if fmt.encoding == "finite" and not fmt.saturate:
        raise ValueError(f"{fmt.name}: a 'finite' format has no infinity or NaN to overflow "
                         f"to, so it saturates: saturate must be True, got False")
    # The whole range must be float32 values: normals up to 2**127, subnormals down to 2**-149.
    if fmt.emax > 127 or fmt.emin - fmt.man_bits < -149:
        raise ValueError(
            f"bias {fmt.bias} puts {fmt.exp_bits}-exponent-bit, {fmt.man_bits}-mantissa-bit "
            f"values outside float32's range (need emax <= 127 and emin - man_bits >= -149; "
            f"got emax {fmt.emax}, emin - man_bits {fmt.emin - fmt.man_bits})"
        )


def custom(exp_bits: int, man_bits: int, *, bias: int | None = None, subnormals: bool = True,
           saturate: bool | None = None, encoding: str = "ieee",
           name: str | None = None) -> Format:
    """A format with any exponent/mantissa split that fits a float32 container.

    The bias defaults to the IEEE choice 2**(exp_bits-1) - 1 (one more for "fnuz", as in
    ``float8_e4m3fnuz``). ``saturate`` defaults to the encoding's rule: True for "finite"
    (the only one it has), False otherwise.

    >>> custom(5, 10) == FP16
    True
    >>> custom(3, 2, encoding="fn").max_finite
    24.0
    """
    for label, value in (("exp_bits", exp_bits), ("man_bits", man_bits)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{label} must be an int, got {value!r}")
    if not 2 <= exp_bits <= 8:
        raise ValueError(f"exp_bits must be 2..8 to fit a float32 container, got {exp_bits}")
    if bias is None:
        bias = (1 << (exp_bits - 1)) - 1 + (1 if encoding == "fnuz" else 0)
    if saturate is None:
        saturate = encoding == "finite"
    if name is None:
        suffix = "" if encoding == "ieee" else encoding
        name = f"e{exp_bits}m{man_bits}{suffix}"
    return Format(name, exp_bits, man_bits, bias, subnormals, saturate, encoding)


FP32 = Format("fp32", 8, 23, 127)
TF32 = Format("tf32", 8, 10, 127)
FP16 = Format("fp16", 5, 10, 15)
BF16 = Format("bf16", 8, 7, 127)
E4M3FN = Format("e4m3fn", 4, 3, 7, encoding="fn")
E5M2 = Format("e5m2", 5, 2, 15)
E4M3FNUZ = Format("e4m3fnuz", 4, 3, 8, encoding="fnuz")
E5M2FNUZ = Format("e5m2fnuz", 5, 2, 16, encoding="fnuz")
# OCP MX v1.0 section 5.3: FP6 and FP4, no inf, no NaN (ml_dtypes' float6_*/float4_e2m1fn)
E3M2 = Format("fp6_e3m2", 3, 2, 3, saturate=True, encoding="finite")
E2M3 = Format("fp6_e2m3", 2, 3, 1, saturate=True, encoding="finite")
E2M1 = Format("fp4_e2m1", 2, 1, 1, saturate=True, encoding="finite")

_BUILTINS = (FP32, TF32, FP16, BF16, E4M3FN, E5M2, E4M3FNUZ, E5M2FNUZ, E3M2, E2M3, E2M1)

_ALIASES = {
    "fp32": FP32, "float32": FP32, "f32": FP32, "single": FP32, "binary32": FP32,
    "tf32": TF32, "tensorfloat32": TF32,
    "fp16": FP16, "float16": FP16, "f16": FP16, "half": FP16, "binary16": FP16,
    "bf16": BF16, "bfloat16": BF16,
    "e4m3fn": E4M3FN, "e4m3": E4M3FN, "fp8_e4m3": E4M3FN, "fp8_e4m3fn": E4M3FN,
    "float8_e4m3fn": E4M3FN,
    "e5m2": E5M2, "fp8_e5m2": E5M2, "float8_e5m2": E5M2,
    "e4m3fnuz": E4M3FNUZ, "fp8_e4m3fnuz": E4M3FNUZ, "float8_e4m3fnuz": E4M3FNUZ,
    "e5m2fnuz": E5M2FNUZ, "fp8_e5m2fnuz": E5M2FNUZ, "float8_e5m2fnuz": E5M2FNUZ,
    # ml_dtypes' names (and torch's float4_e2m1fn_x2, two per byte), the OCP spec's
    "float6_e3m2fn": E3M2, "fp6_e3m2": E3M2, "fp6_e3m2fn": E3M2,
    "float6_e2m3fn": E2M3, "fp6_e2m3": E2M3, "fp6_e2m3fn": E2M3,
    "float4_e2m1fn": E2M1, "fp4_e2m1": E2M1, "fp4_e2m1fn": E2M1, "fp4": E2M1,
    "float4_e2m1fn_x2": E2M1,
}

_CUSTOM_NAME = re.compile(r"^(?:(?:fp|float)(\d+)_)?e(\d+)m(\d+)(fnuz|fn|finite)?$")


def builtins() -> tuple[Format, ...]:
    """The built-in formats, widest first."""
    return _BUILTINS


def names() -> list[str]:
    """Every name ``get`` accepts besides the ``eXmY`` custom pattern."""
    return sorted(_ALIASES)


def get(name: "str | Format") -> Format:
    """Look a format up by the names users type: ``"fp16"``, ``"half"``, ``"bfloat16"``,
    ``"e4m3"``, ``"fp8_e4m3fn"``, ``"e5m10"`` (any ``eXmY``, with optional ``fn``/``fnuz``).

    A ``Format`` passes through unchanged. An unknown name raises ``ValueError`` listing what
    is accepted.
    """
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a format is a Format or a name string, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    if key in _ALIASES:
        return _ALIASES[key]
    match = _CUSTOM_NAME.match(key)
    if match:
        exp_bits, man_bits, encoding = int(match[2]), int(match[3]), match[4] or "ieee"
        if match[1] is not None and int(match[1]) != 1 + exp_bits + man_bits:
            raise ValueError(f"format name {name!r}: its width {match[1]} is not 1 + {exp_bits} "
                             f"+ {man_bits} bits; accepted: 'eXmY' with the width 1 + X + Y, "
                             f"or without one")
        try:
            return custom(exp_bits, man_bits, encoding=encoding)
        except ValueError as err:
            raise ValueError(f"format name {name!r}: {err}") from None
    raise ValueError(
        f"unknown format {name!r}; accepted names: {', '.join(names())}, "
        f"or 'eXmY' with X in 2..8 exponent bits and Y in 1..23 mantissa bits "
        f"(suffix 'fn', 'fnuz' or 'finite' for the encodings without infinities)"
    )
