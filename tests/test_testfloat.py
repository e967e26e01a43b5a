"""round_to against Berkeley TestFloat 3 (SoftFloat 3) vectors: an oracle nobody here wrote.

Conversions (f32->f16, f64->f16, f32->bf16, f16->f32) are one rounding of the input, so the
input goes straight into ``round_to``. The f16 operations (add, sub, mul, div, sqrt, mulAdd)
are an exact operation followed by one rounding; we compute the exact result as a
*round-to-odd* value with many more bits than fp16 has, and round that once with ``round_to``.

Why round-to-odd: rounding an already rounded float64 quotient (or an inexact float64 a*b+c)
again to fp16 is double rounding, which is wrong for directed modes and at ties. Rounding to
odd at precision p' >= p + 2 (truncate, then set the last bit if anything was cut off) and then
rounding to p bits in any mode equals rounding the exact value once (Boldo & Melquiond, "When
double rounding is odd", 2005): the odd value lies strictly inside the same interval between
p-bit neighbours as the exact value, and is never a p-bit midpoint or grid point unless the
exact value is. Here p = 11 and p' >= 24 (float32 container) or 42..53 (float64 container).

The vectors live in ``../shared/testfloat`` beside the repository (the tests skip, saying so,
where it is absent). Each file is ``testfloat_gen``'s level-1 output for one function and
rounding mode, gzipped, named ``<function>.<rounding>.txt.gz`` (rounding: rnear_even, rminMag,
rmin, rmax, rnear_maxMag), one case a line, hex fields: input(s), result, flags. Functions:
f32_to_f16, f64_to_f16, f32_to_bf16, f16_to_f32, f16_add, f16_sub, f16_mul, f16_div,
f16_sqrt, f16_mulAdd.

Every case of every file is checked (no sampling); NaN results compare as "is NaN" since
TestFloat writes the default NaN. The inexact flag (0x01) is checked too: it is set exactly
when the rounded result differs from the exact value.
"""
from __future__ import annotations

import gzip
import math
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from fpsim import round_to
from fpsim.formats import BF16, FP16, FP32

TESTFLOAT_MODES = {
    "rnear_even": "nearest_even",
    "rminMag": "toward_zero",
    "rmin": "down",
    "rmax": "up",
    "rnear_maxMag": "nearest_away",
}
INEXACT = 0x01

# The fewest cases each file must hold, so a truncated or empty file cannot pass quietly.
MIN_CASES = {"f32_to_f16": 500, "f64_to_f16": 700, "f32_to_bf16": 500, "f16_to_f32": 400,
             "f16_sqrt": 400, "f16_add": 40000, "f16_sub": 40000, "f16_mul": 40000,
             "f16_div": 40000, "f16_mulAdd": 300000}

_HEX_VALUE = np.full(256, 255, np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_VALUE[_c] = _i
    _HEX_VALUE[ord(chr(_c).upper())] = _i


def read_vectors(path: Path) -> list[np.ndarray]:
    """Columns of a TestFloat file as uint64 arrays (fixed-width hex fields, one case a line).

    Parsed with array operations: every line of a file has the same width, so the text is a
    2-D byte array and each field a block of columns.
    """
    text = gzip.decompress(path.read_bytes())
    first_line = text[: text.index(b"\n")]
    widths = [len(field) for field in first_line.split(b" ")]
    line_len = len(first_line) + 1
    assert len(text) % line_len == 0, f"{path.name}: lines are not all {line_len - 1} wide"
    rows = np.frombuffer(text, np.uint8).reshape(-1, line_len)
    assert (rows[:, -1] == ord("\n")).all(), f"{path.name}: ragged lines"
    columns, start = [], 0
    for width in widths:
        digits = _HEX_VALUE[rows[:, start:start + width]]
        assert (digits < 16).all(), f"{path.name}: a field is not hex"
        value = np.zeros(len(rows), np.uint64)
        for k in range(width):
            value = (value << np.uint64(4)) | digits[:, k].astype(np.uint64)
        columns.append(value)
        start += width + 1
    return columns


def vector_file(testfloat_dir: Path, function: str, tf_mode: str) -> Path:
    path = testfloat_dir / f"{function}.{tf_mode}.txt.gz"
    if not path.exists():
        pytest.skip(f"TestFloat file {path.name} not found in {testfloat_dir}")
    return path


def f16_values(bits: np.ndarray) -> np.ndarray:
    """fp16 bit patterns to float64 (exact; NumPy's float16 is IEEE binary16)."""
    return widen(bits.astype(np.uint16).view(np.float16))


def widen(x: np.ndarray) -> np.ndarray:
    """To float64, exactly; signalling NaNs quietly become NaN (no 'invalid' warning)."""
    with np.errstate(invalid="ignore"):
        return x.astype(np.float64)


def assert_same(got: np.ndarray, expected: np.ndarray, inputs: tuple, label: str) -> None:
    """Bit for bit (sign of zero included) in ``got``'s dtype; NaN only needs to be NaN."""
    expected = expected.astype(got.dtype)
    uint = np.uint32 if got.dtype == np.float32 else np.uint64
    both_nan = np.isnan(got) & np.isnan(expected)
    bad = ~both_nan & (got.view(uint) != expected.view(uint))
    if bad.any():
        shown = [f"inputs {tuple(float(col[i]).hex() for col in inputs)}: "
                 f"got {float(got[i]).hex()}, expected {float(expected[i]).hex()}"
                 for i in np.flatnonzero(bad)[:8]]
        pytest.fail(f"{label}: {int(bad.sum())} of {got.size} cases differ\n" + "\n".join(shown))


def assert_inexact_flags(exact: np.ndarray, rounded: np.ndarray, flags: np.ndarray,
                         label: str) -> None:
    """TestFloat's inexact flag is set exactly when the result is not the exact value."""
    checked = ~np.isnan(exact) & ~np.isnan(rounded)
    differs = rounded[checked] != exact[checked]
    flagged = (flags[checked] & np.uint64(INEXACT)) != 0
    assert (differs == flagged).all(), \
        f"{label}: {int((differs != flagged).sum())} cases disagree with the inexact flag"


# --- conversions ------------------------------------------------------------------------------

@pytest.mark.parametrize("tf_mode", TESTFLOAT_MODES)
def test_f32_to_f16(testfloat_dir, tf_mode):
    x_bits, result_bits, flags = read_vectors(vector_file(testfloat_dir, "f32_to_f16", tf_mode))
    assert len(x_bits) >= MIN_CASES["f32_to_f16"]
    x = x_bits.astype(np.uint32).view(np.float32)
    got = round_to(x, FP16, TESTFLOAT_MODES[tf_mode])
    assert got.dtype == np.float32
    assert_same(got, f16_values(result_bits), (x,), f"f32_to_f16.{tf_mode}")
    assert_inexact_flags(widen(x), widen(got), flags,
                         f"f32_to_f16.{tf_mode}")


@pytest.mark.parametrize("tf_mode", TESTFLOAT_MODES)
def test_f64_to_f16(testfloat_dir, tf_mode):
    x_bits, result_bits, flags = read_vectors(vector_file(testfloat_dir, "f64_to_f16", tf_mode))
    assert len(x_bits) >= MIN_CASES["f64_to_f16"]
    x = x_bits.view(np.float64)
    got = round_to(x, FP16, TESTFLOAT_MODES[tf_mode])
    assert got.dtype == np.float64
    assert_same(got, f16_values(result_bits), (x,), f"f64_to_f16.{tf_mode}")
    assert_inexact_flags(x, got, flags, f"f64_to_f16.{tf_mode}")


@pytest.mark.parametrize("tf_mode", TESTFLOAT_MODES)
def test_f32_to_bf16(testfloat_dir, tf_mode):
    x_bits, result_bits, flags = read_vectors(vector_file(testfloat_dir, "f32_to_bf16", tf_mode))
    assert len(x_bits) >= MIN_CASES["f32_to_bf16"]
    x = x_bits.astype(np.uint32).view(np.float32)
    expected = result_bits.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    mode = TESTFLOAT_MODES[tf_mode]
    got = round_to(x, BF16, mode)
    assert got.dtype == np.float32
    assert_same(got, expected, (x,), f"f32_to_bf16.{tf_mode}")
    assert_inexact_flags(widen(x), widen(got), flags,
                         f"f32_to_bf16.{tf_mode}")
    # The same values widened to float64 take the general kernel (not ml_dtypes' cast).
    assert_same(round_to(widen(x), BF16, mode), expected, (x,),
                f"f32_to_bf16.{tf_mode} (float64 container)")


@pytest.mark.parametrize("tf_mode", TESTFLOAT_MODES)
def test_f16_to_f32_is_exact(testfloat_dir, tf_mode):
    x_bits, result_bits, flags = read_vectors(vector_file(testfloat_dir, "f16_to_f32", tf_mode))
    assert len(x_bits) >= MIN_CASES["f16_to_f32"]
    with np.errstate(invalid="ignore"):
        x = x_bits.astype(np.uint16).view(np.float16).astype(np.float32)
    expected = result_bits.astype(np.uint32).view(np.float32)
    finite = np.isfinite(x)
    assert ((flags[finite] & np.uint64(INEXACT)) == 0).all()  # widening is always exact
    # fp16 values are fixed points of rounding to fp16, and their widening to fp32 is exact.
    for fmt in (FP16, FP32):
        for container in (np.float32, np.float64):
            got = round_to(widen(x).astype(container), fmt, TESTFLOAT_MODES[tf_mode])
            assert_same(got, expected, (x,), f"f16_to_f32.{tf_mode} via {fmt} {container}")


# --- exact f16 arithmetic, rounded once ---------------------------------------------------------

def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s = fl(a + b) and the exact error e = (a + b) - s (Knuth; exact without overflow)."""
    s = a + b
    b_virtual = s - a
    a_virtual = s - b_virtual
    return s, (a - a_virtual) + (b - b_virtual)


def odd_from_sum(s: np.ndarray, err: np.ndarray) -> np.ndarray:
    """Round-to-odd (53 bits) of the exact value s + err, where s = fl(s + err) (RNE)."""
    inexact = np.isfinite(err) & (err != 0)
    s_inexact, e_inexact = s[inexact], err[inexact]
    # Truncation: s itself when it lies below the exact value in magnitude, else one step in.
    overshoot = np.signbit(e_inexact) != np.signbit(s_inexact)
    truncated = np.where(overshoot, np.nextafter(s_inexact, 0.0), s_inexact)
    odd = s.copy()
    odd[inexact] = (truncated.view(np.uint64) | np.uint64(1)).view(np.float64)
    return odd


def to_odd_float32(x: np.ndarray) -> np.ndarray:
    """Round-to-odd from float64 to float32 (24 bits). Round-to-odd composes: an odd 53-bit
    value rounds to odd at 24 bits exactly as its exact source does."""
    with np.errstate(over="ignore"):
        nearest = x.astype(np.float32)
    assert np.isfinite(nearest[np.isfinite(x)]).all(), "values stay inside float32 range"
    overshoot = np.abs(nearest.astype(np.float64)) > np.abs(x)
    truncated = np.where(overshoot, np.nextafter(nearest, np.float32(0)), nearest)
    inexact = np.isfinite(x) & (truncated.astype(np.float64) != x)
    bits = truncated.view(np.uint32).copy()
    bits[inexact] |= np.uint32(1)
    return bits.view(np.float32)


def f16_parts(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite nonzero fp16 values as m * 2**e with the integer m in [2**10, 2**11)."""
    values = f16_values(bits)
    fraction, exponent = np.frexp(values)              # values = fraction * 2**exponent
    return np.ldexp(fraction, 11).astype(np.int64), exponent.astype(np.int64) - 11


def exact_div_odd(a: np.ndarray, b: np.ndarray, a_bits, b_bits) -> np.ndarray:
    """a / b rounded to odd at 42-43 bits, exact integer arithmetic; IEEE specials as float64
    (which are exact: inf, 0, NaN and signed zeros follow the same rules in every width)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        result = a / b
    regular = np.isfinite(a) & np.isfinite(b) & (a != 0) & (b != 0)
    ma, ea = (part[regular] for part in f16_parts(a_bits))
    mb, eb = (part[regular] for part in f16_parts(b_bits))
    numerator = ma << 42                                # < 2**53: no overflow
    quotient = numerator // mb                         # in (2**41, 2**43): exact in float64
    remainder = numerator - quotient * mb
    quotient |= (remainder != 0).astype(np.int64)       # the sticky bit: round to odd
    magnitude = np.ldexp(quotient.astype(np.float64), (ea - eb - 42).astype(np.int32))
    result[regular] = np.copysign(magnitude, a[regular] * b[regular])
    return result


def exact_sqrt_odd(a: np.ndarray) -> np.ndarray:
    """sqrt(a) rounded to odd at 43 bits with exact integer square roots (few cases)."""
    with np.errstate(invalid="ignore"):
        result = np.sqrt(a)                             # specials, zeros, negatives -> NaN
    for i in np.flatnonzero(np.isfinite(a) & (a > 0)):
        m, e = math.frexp(float(a[i]))                  # a = m * 2**e, m in [0.5, 1)
        integer, exponent = int(m * 2**53), e - 53      # a = integer * 2**exponent exactly
        shift = 32 + (exponent & 1)                     # even exponent; integer << shift in
        root = math.isqrt(integer << shift)             # [2**84, 2**86): root in [2**42, 2**43)
        sticky = int(root * root != integer << shift)
        result[i] = math.ldexp(root | sticky, (exponent - shift) // 2)
    return result


def fix_exact_zero_sign(result, addend_a, addend_b, mode):
    """IEEE 754 6.3: an exact zero sum of operands of opposite sign is +0, except in
    roundTowardNegative, where it is -0; x + x keeps x's sign. Float64 (round to nearest)
    gives +0, so only mode "down" needs a change."""
    if mode == "down":
        zero = result == 0
        both_plus_zero = (addend_a == 0) & ~np.signbit(addend_a) & \
                         (addend_b == 0) & ~np.signbit(addend_b)
        result[zero] = np.where(both_plus_zero[zero], 0.0, -0.0)
    return result


def check_f16_operation(testfloat_dir, function, tf_mode, operation):
    columns = read_vectors(vector_file(testfloat_dir, function, tf_mode))
    *operand_bits, result_bits, flags = columns
    assert len(result_bits) >= MIN_CASES[function]
    operands = [f16_values(bits) for bits in operand_bits]
    mode = TESTFLOAT_MODES[tf_mode]
    with np.errstate(invalid="ignore"):  # inf - inf, 0 * inf: NaN is the expected result
        exact_odd = operation(operands, operand_bits, mode)  # float64, rounded to odd
    expected = f16_values(result_bits)
    label = f"{function}.{tf_mode}"
    got64 = round_to(exact_odd, FP16, mode)
    assert_same(got64, expected, operands, label + " (float64 container)")
    got32 = round_to(to_odd_float32(exact_odd), FP16, mode)
    assert_same(got32, expected, operands, label + " (float32 container)")
    assert_inexact_flags(exact_odd, got64, flags, label)
    return len(result_bits)


def op_add(operands, bits, mode):
    a, b = operands
    total = a + b                                       # exact: fp16 sums need <= 41 bits
    return fix_exact_zero_sign(total, a, b, mode)


def op_sub(operands, bits, mode):
    a, b = operands
    return fix_exact_zero_sign(a - b, a, -b, mode)


def op_mul(operands, bits, mode):
    a, b = operands
    return a * b                                        # exact: 22-bit products


def op_div(operands, bits, mode):
    return exact_div_odd(*operands, *bits)


def op_sqrt(operands, bits, mode):
    return exact_sqrt_odd(operands[0])


def op_mul_add(operands, bits, mode):
    a, b, c = operands
    product = a * b                                     # exact
    total, error = two_sum(product, c)                  # exact: total + error == a*b + c
    result = odd_from_sum(total, error)
    return fix_exact_zero_sign(result, product, c, mode)


OPERATIONS = {"f16_add": op_add, "f16_sub": op_sub, "f16_mul": op_mul, "f16_div": op_div,
              "f16_sqrt": op_sqrt, "f16_mulAdd": op_mul_add}


@pytest.mark.parametrize("tf_mode", TESTFLOAT_MODES)
@pytest.mark.parametrize("function", OPERATIONS)
def test_f16_operation_rounded_once(testfloat_dir, function, tf_mode):
    check_f16_operation(testfloat_dir, function, tf_mode, OPERATIONS[function])


# --- the helpers above are oracles too: check them where the answer is known -----------------

def test_round_to_odd_helpers():
    # 1 + 2**-60 is not a double: truncation gives 1.0, whose last bit is then set.
    odd = odd_from_sum(np.array([1.0]), np.array([2.0 ** -60]))
    assert odd[0] == 1.0 + 2.0 ** -52
    odd = odd_from_sum(np.array([1.0]), np.array([-2.0 ** -60]))  # just below 1
    assert odd[0] == 1.0 - 2.0 ** -53   # truncated to 1 - 2**-53, already odd
    assert odd_from_sum(np.array([3.0]), np.array([0.0]))[0] == 3.0
    assert to_odd_float32(np.array([1.0 + 2.0 ** -40]))[0] == np.float32(1.0 + 2.0 ** -23)
    assert to_odd_float32(np.array([-1.5]))[0] == np.float32(-1.5)
    one, three = np.array([0x3C00], np.uint64), np.array([0x4200], np.uint64)
    third = exact_div_odd(f16_values(one), f16_values(three), one, three)[0]
    # 1/3 = 2**-43 * 2932031007402.66..: truncation is even, so the odd value is one above.
    assert Fraction(third) == Fraction(2932031007403, 2**43)
    assert exact_sqrt_odd(np.array([4.0, 0.25, -1.0]))[:2].tolist() == [2.0, 0.5]
    root2 = Fraction(exact_sqrt_odd(np.array([2.0]))[0])
    step = Fraction(1, 2**42)                                       # 43-bit root in [1, 2)
    assert (root2 - step) ** 2 < 2 < (root2 + step) ** 2 and root2 ** 2 != 2
    assert (root2 / step).denominator == 1 and (root2 / step) % 2 == 1    # odd last bit
