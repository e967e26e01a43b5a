"""round_to against MPFR (gmpy2): every deterministic mode, every format kind, the hard cases.

The oracle is ``tests/mpfr_oracle.py``: MPFR's correctly rounded conversion at the format's
precision with emulated subnormals, plus fpsim's documented overflow/flush rules. Inputs lean
on the cases where rounding code goes wrong: exact ties, one container ulp either side of a
tie or of a format value, the subnormal range and its boundaries, the half-smallest-subnormal
tie (fp16: 2**-25 -> 0), max_finite and the overflow threshold, infinities, NaN, signed zeros
and the container's own subnormals, in float32 and float64 containers. The oracle itself is
checked first against numpy/ml_dtypes casts, MPFR's native IEEE overflow, and brute force.
"""
from __future__ import annotations

import bisect
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpsim import round_to
from fpsim.formats import BF16, E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ, FP16, builtins, custom

pytest.importorskip("gmpy2")
from mpfr_oracle import (DETERMINISTIC_MODES, mpfr_round,  # noqa: E402
                         native_ieee_round)

CUSTOM_FORMATS = (
    custom(3, 4), custom(2, 1), custom(6, 9), custom(7, 16), custom(8, 3), custom(4, 3),
    custom(4, 3, subnormals=False, name="e4m3_nosub"),
    custom(5, 10, subnormals=False, name="fp16_nosub"),
    custom(5, 4, bias=20, name="e5m4_bias20"),
    custom(5, 2, encoding="fn"), custom(3, 2, encoding="fn"), custom(2, 1, encoding="fn"),
    custom(3, 4, encoding="fnuz"), custom(2, 3, encoding="fnuz"),
    custom(4, 3, encoding="fn", saturate=True, name="e4m3fn_sat"),
    custom(5, 2, saturate=True, name="e5m2_sat"),
)
ALL_FORMATS = tuple(builtins()) + CUSTOM_FORMATS
CONTAINERS = (np.float32, np.float64)


# --- values worth testing ------------------------------------------------------------------------

def boundaries(fmt) -> list[float]:
    """Format values and midpoints where rounding code usually breaks (positive)."""
    tiny, top_gap = fmt.smallest_subnormal, 2.0 ** (fmt.emax - fmt.man_bits)
    return [
        tiny, tiny / 2, tiny * 1.5, tiny * 2.5, tiny / 4,             # ties around the bottom
        fmt.min_normal, fmt.min_normal - tiny, fmt.min_normal - tiny / 2,  # subnormal top
        fmt.min_normal + tiny / 2,
        fmt.max_finite, fmt.max_finite - top_gap / 2,                 # the top binade
        fmt.max_finite + top_gap / 2,                                 # overflow threshold
        fmt.max_finite + top_gap, 2.0 ** (fmt.emax + 1), 2.0 ** (fmt.emax + 2),
        1.0, 1.0 + fmt.epsilon / 2, 1.0 + fmt.epsilon * 1.5, 1.0 - fmt.epsilon / 4,
        2.0 ** -25, 3 * 2.0 ** -26,                                   # the fp16 bottom ties
        float(np.finfo(np.float32).max), float(np.finfo(np.float32).smallest_subnormal),
        float(np.finfo(np.float32).smallest_normal), 1e300, 5e-324,
    ]


def to_container(value: float, dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond float32's range -> inf: still a valid input
        return np.asarray(value, dtype)


def step(value: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` container ulps up (positive) or down (negative)."""
    direction = value.dtype.type(np.inf if steps > 0 else -np.inf)
    with np.errstate(over="ignore", under="ignore"):  # max -> inf is a fine input too
        for _ in range(abs(steps)):
            value = np.nextafter(value, direction)
    return value


@st.composite
def hard_value(draw, fmt, dtype) -> float:
    """One container value, most of the time on or next to a format value or a tie."""
    m = fmt.man_bits
    kind = draw(st.sampled_from(["grid", "tie", "tie", "subnormal", "boundary", "boundary",
                                 "special", "container_subnormal", "any"]))
    if kind in ("grid", "tie", "subnormal"):
        if kind == "subnormal":
            exponent, significand = fmt.emin, draw(st.integers(0, 2**m - 1))
        else:
            exponent = draw(st.integers(fmt.emin, fmt.emax + 2))
            significand = draw(st.integers(2**m, 2**(m + 1) - 1))
        twice = 2 * significand + (kind != "grid" or draw(st.booleans()))
        value = math.ldexp(twice, exponent - m - 1)
    elif kind == "boundary":
        value = draw(st.sampled_from(boundaries(fmt)))
    elif kind == "special":
        value = draw(st.sampled_from([math.nan, math.inf, 0.0]))
    elif kind == "container_subnormal":
        smallest_normal = float(np.finfo(dtype).smallest_normal)
        value = draw(st.floats(0.0, smallest_normal, width=np.finfo(dtype).bits))
    else:
        value = draw(st.floats(width=np.finfo(dtype).bits, allow_nan=False))
    x = step(to_container(value, dtype), draw(st.sampled_from([0, 0, 0, 1, -1, 2, -2])))
    return float(-x if draw(st.booleans()) else x)


def edge_values(fmt, dtype) -> np.ndarray:
    """A deterministic list: all values of small formats (or the extreme binades of wide
    ones), every midpoint among them, each 0, 1 container ulp either side, both signs."""
    m = fmt.man_bits
    if fmt.bits <= 9:
        exponents, significands = range(fmt.emin, fmt.emax + 2), range(2**m, 2**(m + 1))
        subnormal_significands = range(0, 2**m)
    else:
        exponents = sorted({fmt.emin, fmt.emin + 1, -1, 0, 1, fmt.emax - 1, fmt.emax,
                            fmt.emax + 1})
        edge = [0, 1, 2, 3, 2**(m - 1), 2**m - 3, 2**m - 2, 2**m - 1]
        significands = sorted({2**m + k for k in edge})
        subnormal_significands = sorted(set(edge))
    twice = [(exponent, 2 * s + half) for exponent in exponents for s in significands
             for half in (0, 1)]
    twice += [(fmt.emin, 2 * s + half) for s in subnormal_significands for half in (0, 1)]
    centres = [math.ldexp(t, exponent - m - 1) for exponent, t in twice] + boundaries(fmt)
    centres = to_container(np.array(centres), dtype)
    values = np.concatenate([centres, step(centres, 1), step(centres, -1),
                             np.array([np.inf, np.nan, 0.0], dtype)])
    return np.unique(np.concatenate([values, -values]))


# --- comparison ---------------------------------------------------------------------------------

def same(a: float, b: float) -> bool:
    """Equal bits as float64: value and sign of zero; NaN equals NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def assert_matches_oracle(x: np.ndarray, fmt, mode, **options) -> int:
    got = round_to(x, fmt, mode, **options)
    assert got.dtype == x.dtype and got.shape == x.shape
    bad = []
    for value, result in zip(x.tolist(), got.tolist()):
        expected = mpfr_round(value, fmt, mode, options.get("saturate"),
                              options.get("subnormals"), options.get("daz", False))
        if not same(result, expected):
            bad.append(f"{value.hex()} -> {result.hex()}, MPFR oracle {expected.hex()}")
    assert not bad, (f"round_to(x, {fmt.name}, {mode!r}, {options}) on {x.dtype}: "
                     f"{len(bad)} of {x.size} differ:\n" + "\n".join(bad[:10]))
    return x.size


# --- the oracle is checked before it is trusted -------------------------------------------------

CAST_ORACLES = [(FP16, np.float16), (BF16, ml_dtypes.bfloat16),
                (E4M3FN, ml_dtypes.float8_e4m3fn), (E5M2, ml_dtypes.float8_e5m2),
                (E4M3FNUZ, ml_dtypes.float8_e4m3fnuz), (E5M2FNUZ, ml_dtypes.float8_e5m2fnuz),
                (custom(4, 3), ml_dtypes.float8_e4m3), (custom(3, 4), ml_dtypes.float8_e3m4)]


@pytest.mark.parametrize("fmt,dtype", CAST_ORACLES, ids=lambda v: getattr(v, "name", ""))
def test_oracle_matches_numpy_and_ml_dtypes_casts(fmt, dtype):
    x = edge_values(fmt, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = x.astype(dtype).astype(np.float64)
    oracle = [mpfr_round(v, fmt, "nearest_even") for v in x.tolist()]
    bad = [(v, c, o) for v, c, o in zip(x.tolist(), cast.tolist(), oracle) if not same(c, o)]
    assert not bad, f"oracle disagrees with the {np.dtype(dtype).name} cast: {bad[:5]}"


IEEE_FORMATS = [f for f in ALL_FORMATS if f.encoding == "ieee"]


@pytest.mark.parametrize("fmt", IEEE_FORMATS, ids=str)
def test_oracle_overflow_rules_match_mpfr_native_overflow(fmt):
    x = edge_values(fmt, np.float64)
    for mode in ("nearest_even", "toward_zero", "up", "down"):
        for v in x.tolist():
            ours = mpfr_round(v, fmt, mode, saturate=False, subnormals=True)
            assert same(ours, native_ieee_round(v, fmt, mode)), (fmt.name, mode, v.hex())


def all_positive_values(fmt) -> list[Fraction]:
    """Every finite non-negative value of a format, ascending (encodings 0x00, 0x01, ...)."""
    values = [Fraction(fmt.smallest_subnormal) * k for k in range(2**fmt.man_bits)]
    for exponent in range(fmt.emin, fmt.emax + 1):
        values += [Fraction(2) ** exponent * (1 + Fraction(k, 2**fmt.man_bits))
                   for k in range(2**fmt.man_bits)]
    return [v for v in values if v <= Fraction(fmt.max_finite)]


def brute_force_round(value: float, fmt, mode: str, positives: list[Fraction]) -> float:
    """Pick the answer from the sorted list of all format values (small formats, in range)."""
    x = Fraction(abs(value))
    above = bisect.bisect_left(positives, x)
    below = above if positives[above] == x else above - 1
    if below == above:
        index = below
    elif mode == "toward_zero" or mode == ("up" if value < 0 else "down"):
        index = below
    elif mode in ("up", "down"):
        index = above
    else:
        lower_gap, upper_gap = x - positives[below], positives[above] - x
        if lower_gap != upper_gap:
            index = below if lower_gap < upper_gap else above
        else:  # positive encodings are consecutive integers: even index, even significand
            index = above if mode == "nearest_away" or above % 2 == 0 else below
    return math.copysign(float(positives[index]), value)


@pytest.mark.parametrize("fmt", [f for f in ALL_FORMATS if f.bits <= 8], ids=str)
def test_oracle_matches_brute_force_search(fmt):
    x = [v for v in edge_values(fmt, np.float64).tolist()
         if math.isfinite(v) and abs(v) <= fmt.max_finite]
    positives = all_positive_values(fmt)
    assert len(positives) == 2 ** (fmt.bits - 1) - (1 if fmt.encoding == "fn" else 0) - (
        2 ** fmt.man_bits if fmt.encoding == "ieee" else 0)
    for mode in DETERMINISTIC_MODES:
        for v in x:
            expected = brute_force_round(v, fmt, mode, positives)
            got = mpfr_round(v, fmt, mode, saturate=False, subnormals=True)
            if not fmt.has_negative_zero and expected == 0:
                expected = 0.0
            assert same(got, expected), (fmt.name, mode, v.hex(), got, expected)


# --- round_to against the oracle ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
def test_edge_values_every_mode(fmt, dtype):
    x = edge_values(fmt, dtype)
    for mode in DETERMINISTIC_MODES:
        for saturate in (False, True) if fmt.has_nan else (True,):   # finite: refused
            assert_matches_oracle(x, fmt, mode, saturate=saturate)


SWITCH_FORMATS = (FP16, BF16, E4M3FN, E5M2FNUZ, custom(3, 4), custom(2, 1, encoding="fn"))


@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", SWITCH_FORMATS, ids=str)
@pytest.mark.parametrize("subnormals,daz", [(False, False), (True, True), (False, True)])
def test_edge_values_subnormal_switches(fmt, dtype, subnormals, daz):
    x = edge_values(fmt, dtype)
    x = x[np.isnan(x) | (np.abs(x) < 4 * fmt.min_normal) | (np.abs(x) > fmt.max_finite / 4)]
    for mode in DETERMINISTIC_MODES:
        assert_matches_oracle(x, fmt, mode, subnormals=subnormals, daz=daz)


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=str)
@settings(max_examples=125, deadline=None)
@given(data=st.data())
def test_hard_values_match_mpfr(fmt, data):
    dtype = data.draw(st.sampled_from(CONTAINERS), label="dtype")
    mode = data.draw(st.sampled_from(DETERMINISTIC_MODES), label="mode")
    options = data.draw(st.fixed_dictionaries({
        "saturate": st.sampled_from([None, False, True] if fmt.has_nan else [None, True]),
        "subnormals": st.sampled_from([None, None, True, False]),
        "daz": st.sampled_from([False, False, True])}), label="options")
    values = data.draw(st.lists(hard_value(fmt, dtype), min_size=1, max_size=16), label="x")
    assert_matches_oracle(np.array(values, dtype), fmt, mode, **options)


# --- known answers, stated outright ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_fp16_bottom_tie(dtype):
    tie = dtype(2.0 ** -25)                     # half the smallest fp16 subnormal
    above, below = np.nextafter(tie, dtype(1)), np.nextafter(tie, dtype(0))
    x = np.array([tie, above, below, -tie, -above], dtype)
    expected = {"nearest_even": [0.0, 2.0**-24, 0.0, -0.0, -2.0**-24],
                "nearest_away": [2.0**-24, 2.0**-24, 0.0, -2.0**-24, -2.0**-24],
                "toward_zero": [0.0, 0.0, 0.0, -0.0, -0.0],
                "up": [2.0**-24, 2.0**-24, 2.0**-24, -0.0, -0.0],
                "down": [0.0, 0.0, 0.0, -2.0**-24, -2.0**-24]}
    for mode, answer in expected.items():
        got = round_to(x, FP16, mode)
        assert all(same(g, a) for g, a in zip(got.tolist(), answer)), (mode, got)
        assert all(same(mpfr_round(v, FP16, mode), a) for v, a in zip(x.tolist(), answer))


def test_overflow_thresholds_known_answers():
    with np.errstate(over="ignore"):
        assert round_to(65519.996, FP16) == 65504.0 and round_to(65520.0, FP16) == math.inf
        assert round_to(np.float32(65520.0), FP16, "toward_zero") == 65504.0
        assert round_to(-65520.0, FP16, "up") == -65504.0
        assert round_to(-65520.0, FP16, "down") == -math.inf
        assert round_to(464.0, E4M3FN) == 448.0              # tie goes to the even 448
        assert math.isnan(round_to(464.0, E4M3FN, "nearest_away"))
        assert math.isnan(round_to(464.1, E4M3FN))
        assert round_to(1e6, E4M3FN, "toward_zero") == 448.0
        assert round_to(-math.inf, E4M3FN, saturate=True) == -448.0
        assert math.isnan(round_to(math.inf, E4M3FN, "toward_zero"))
        assert same(round_to(-1e-30, E4M3FNUZ), 0.0)          # no negative zero in fnuz


# --- scalar containers ---------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_scalar_inputs_keep_their_kind(data):
    fmt = data.draw(st.sampled_from(ALL_FORMATS), label="fmt")
    mode = data.draw(st.sampled_from(DETERMINISTIC_MODES), label="mode")
    saturate = data.draw(st.sampled_from([None, True]), label="saturate")
    value32 = data.draw(hard_value(fmt, np.float32), label="value32")
    value64 = data.draw(hard_value(fmt, np.float64), label="value64")
    cases = [(value64, float), (np.float64(value64), np.float64),
             (np.float32(value32), np.float32),
             (np.asarray(value32, np.float32), np.ndarray)]
    for x, kind in cases:
        got = round_to(x, fmt, mode, saturate=saturate)
        assert type(got) is kind, (type(x), type(got))
        if kind is np.ndarray:
            assert got.shape == () and got.dtype == np.float32
        expected = mpfr_round(float(x), fmt, mode, saturate)
        assert same(float(got), expected), (float(x).hex(), float(got), expected)


def test_python_int_input():
    assert round_to(70000, "fp16", "toward_zero") == 65504.0
    assert type(round_to(3, "e4m3")) is float


# --- big arrays take the chunked, threaded paths: same bits as small ones ------------------------

@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3FN, custom(8, 3)], ids=str)
@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_large_arrays_match_elementwise_oracle_results(fmt, dtype):
    x = edge_values(fmt, dtype)
    expected = round_to(x, fmt)                 # checked against MPFR by the tests above
    assert_matches_oracle(x, fmt, "nearest_even")
    reps = (1 << 19) // x.size + 1              # > 2**18: the two-thread path, many chunks
    big = np.tile(x, reps)
    np.testing.assert_array_equal(round_to(big, fmt).view(f"u{x.itemsize}"),
                                  np.tile(expected, reps).view(f"u{x.itemsize}"))
    strided = big[::3]                         # non-contiguous input
    np.testing.assert_array_equal(round_to(strided, fmt).view(f"u{x.itemsize}"),
                                  np.tile(expected, reps)[::3].view(f"u{x.itemsize}"))
