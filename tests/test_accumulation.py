"""Accumulation models: exact (vs Fraction + MPFR), sequential, blocked, determinism, errors."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fpsim import backend
from fpsim.exact import accumulation
from fpsim.exact.exact_dots import exact_matmul, exact_rows_sum
from fpsim.exact.sums import round_to_odd_sum
from fpsim.exact.accumulation import (Accumulation, BlockedAccumulation, ExactAccumulation,
                                     SequentialAccumulation, get_accumulation, tensor_core)
from fpsim.formats import BF16, FP16, FP32, get
from fpsim.rounding import round_to

gmpy2 = pytest.importorskip("gmpy2")


# --- the code under test, host arrays in (the public functions take them) and out ---------

def matmul(a, b, **options) -> np.ndarray:
    """``accumulation.matmul``, its float32 result brought to the host."""
    out = accumulation.matmul(a, b, **options)
    assert out.dtype == backend.xp.float32
    return backend.to_numpy(out)


def reduce_sum(x, *args, **options) -> np.ndarray:
    """``accumulation.reduce_sum``, its float32 result brought to the host."""
    out = accumulation.reduce_sum(x, *args, **options)
    assert out.dtype == backend.xp.float32
    return backend.to_numpy(out)


def dev(x, dtype=backend.xp.float32):
    """A host array as a backend array, for the engine's internals."""
    return backend.asarray(x, dtype)


# --- oracles written here, independent of the code under test ----------------------------

def mpfr_round(value: Fraction, fmt, mode: str = "nearest_even") -> float:
    """Fraction -> nearest (or toward-zero) value of fmt, with subnormals and overflow, MPFR."""
    fmt = get(fmt)
    if value == 0:
        return 0.0
    rnd = {"nearest_even": gmpy2.RoundToNearest, "toward_zero": gmpy2.RoundToZero,
           "up": gmpy2.RoundUp, "down": gmpy2.RoundDown}[mode]
    ctx = gmpy2.context(precision=fmt.precision, round=rnd, subnormalize=True,
                        emax=fmt.emax + 1, emin=fmt.emin - fmt.man_bits + 1)
    with gmpy2.context(ctx):
        x = gmpy2.mpfr(gmpy2.mpq(value.numerator, value.denominator))
    out = float(x)
    if abs(out) == float("inf") and mode != "nearest_even" and not (
            (mode == "up" and out > 0) or (mode == "down" and out < 0)):
        out = float(np.copysign(fmt.max_finite, out))          # IEEE directed overflow
    return out


def oracle_dot(a_row, b_col, acc=FP32) -> float:
    """Exact dot product rounded once to acc; IEEE specials; -0 only if all products -0."""
    a_row, b_col = [float(v) for v in a_row], [float(v) for v in b_col]
    products = [x * y for x, y in zip(a_row, b_col)]        # exact: float32 * float32
    if not all(np.isfinite(products)):
        total = 0.0
        for p in products:
            if not np.isfinite(p):
                total += p
        return total
    exact_sum = sum((Fraction(p) for p in products), Fraction(0))
    if exact_sum == 0:
        all_neg_zero = bool(products) and all(p == 0 and np.signbit(p) for p in products)
        return -0.0 if all_neg_zero else 0.0
    return mpfr_round(exact_sum, acc)


def oracle_matmul(a, b, acc=FP32) -> np.ndarray:
    out = np.empty((a.shape[0], b.shape[1]), np.float64)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            out[i, j] = oracle_dot(a[i], b[:, j], acc)
    return out


def same_bits(x, y) -> bool:
    """Equal bit patterns, the sign of zero included; any NaN matches any NaN."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape:
        return False
    both_nan = np.isnan(x) & np.isnan(y)
    return bool(np.all(both_nan | (x.view(np.uint64) == y.view(np.uint64))))


def f32(x) -> np.ndarray:
    return np.asarray(x, np.float32)


def random_case(rng, m, k, n, spread):
    a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-spread, spread + 1, (m, k))
    b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-spread, spread + 1, (k, n))
    return f32(a), f32(b)


# --- exact model vs the oracle -------------------------------------------------------------

@pytest.mark.parametrize("spread", [0, 8, 60])
def test_exact_matches_fraction_oracle_on_random_data(spread):
    rng = np.random.default_rng(spread)
    a, b = random_case(rng, 7, 33, 6, spread)
    got = matmul(a, b, out_fmt="fp32")
    assert same_bits(got, oracle_matmul(a, b))


def test_exact_on_massive_cancellation_and_huge_range():
    rng = np.random.default_rng(3)
    big = f32(rng.standard_normal(20) * 2.0 ** 100)
    tiny = f32(rng.standard_normal(5) * 2.0 ** -100)
    row = np.concatenate([big, -big, tiny, f32([1.0, 2.0 ** -40])])
    a = np.stack([row, rng.permutation(row), row[::-1]])
    b = f32(np.ones((row.size, 2)))
    b[:, 1] = f32(rng.choice([1.0, 0.5, 2.0 ** -20], row.size))
    got = matmul(a, b, out_fmt="fp32")
    assert same_bits(got, oracle_matmul(a, b))
    assert got[0, 0] == np.float32(np.sum(tiny.astype(np.float64)) + 1.0 + 2.0 ** -40)


def test_exact_rounds_fp32_ties_to_even():
    ulp_half = 2.0 ** -24
    cases = [  # (a row, expected) with b = ones; exact sums that sit on fp32 midpoints
        ([1.0, ulp_half], 1.0),
        ([1.0 + 2.0 ** -23, ulp_half], 1.0 + 2.0 ** -22),
        ([2.0 ** 60, 1.0, -(2.0 ** 60), ulp_half], 1.0),            # tie hidden by cancellation
        ([2.0 ** 60, 1.0 + 2.0 ** -23, -(2.0 ** 60), ulp_half], 1.0 + 2.0 ** -22),
        ([-1.0, -ulp_half, 2.0 ** -80, -(2.0 ** -80)], -1.0),
    ]
    for row, expected in cases:
        a = f32([row])
        b = f32(np.ones((len(row), 1)))
        got = matmul(a, b, out_fmt="fp32")[0, 0]
        assert got == np.float32(expected) and got == oracle_dot(a[0], b[:, 0]), row


def test_exact_subnormal_results_and_inputs():
    rng = np.random.default_rng(5)
    a = f32(rng.standard_normal((4, 9)) * 2.0 ** -70)
    b = f32(rng.standard_normal((9, 3)) * 2.0 ** -72)
    a[0, :3] = f32([2.0 ** -149, 3 * 2.0 ** -149, -(2.0 ** -140)])   # float32 subnormal inputs
    got = matmul(a, b, out_fmt="fp32")
    assert np.any((got != 0) & (np.abs(got) < 2.0 ** -126))           # subnormal results
    assert same_bits(got, oracle_matmul(a, b))
    assert same_bits(matmul(a, b, out_fmt="fp16"), round_to(f32(oracle_matmul(a, b)), FP16))


def test_exact_overflow_and_ieee_specials():
    inf, nan = np.inf, np.nan
    a = f32([[3e38, 3e38, 0], [inf, 1, 0], [inf, 0, 0], [inf, -inf, 0], [nan, 1, 1],
             [1, 1, 1], [-0.0, 0.0, 0], [-0.0, -0.0, 1]])
    b = f32([[1, 0], [1, 1], [0, -1]])
    b2 = b.copy()
    b2[2, 1] = inf
    with np.errstate(over="ignore", invalid="ignore"):
        for bb in (b, b2):
            got = matmul(a, bb, out_fmt="fp32")
            want = oracle_matmul(a, bb)
            assert same_bits(got, want), (got, want)
    got = matmul(a, b, out_fmt="fp32")
    assert got[0, 0] == np.inf and np.isnan(got[3, 0]) and np.isnan(got[2, 1])
    assert np.signbit(matmul(f32([[-0.0]]), f32([[5.0]]), out_fmt="fp32")[0, 0])
    assert not np.signbit(matmul(f32([[1.0, -1.0]]), f32([[1.0], [1.0]]), out_fmt="fp32")[0, 0])


def test_exact_output_format_is_a_second_rounding():
    rng = np.random.default_rng(6)
    a, b = random_case(rng, 5, 40, 4, 3)
    for acc, out in [(FP32, BF16), (FP32, "e4m3"), (BF16, FP16), (FP16, FP32)]:
        got = matmul(a, b, out_fmt=out, model=ExactAccumulation(acc))
        assert same_bits(got, round_to(f32(oracle_matmul(a, b, acc)), out))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 12), st.sampled_from(["fp16", "bf16", "e4m3"]))
def test_exact_property_low_precision_inputs(seed, k, fmt):
    rng = np.random.default_rng(seed)
    a = round_to(f32(rng.standard_normal((3, k)) * 4), fmt)
    b = round_to(f32(rng.standard_normal((k, 2)) * 4), fmt)
    assert same_bits(matmul(a, b, out_fmt="fp32"), oracle_matmul(a, b))


# --- fast path vs the exact fallback forced on everything ---------------------------------

def adversarial_batch(rng):
    a = rng.standard_normal((3, 24, 64)) * 2.0 ** rng.integers(-40, 40, (3, 24, 64))
    b = rng.standard_normal((3, 64, 16))
    a[0, :, 32:] = -a[0, :, :32]                    # exact cancellation of half the terms
    a[1] = np.round(a[1] * 2 ** 10) / 2 ** 10       # integer-like data: exact certificate
    b[1] = np.round(b[1] * 8)
    a[2, 0] = 0.0
    a[2, 1] = -0.0
    a, b = f32(a), f32(b)
    b[2, :, 3] = f32(2.0 ** -24)                    # ties: 1 + 2**-24 style sums
    a[2, 2, :] = 0
    a[2, 2, :2] = f32([1.0, 1.0])
    return a, b


@pytest.mark.parametrize("acc", [FP32, BF16, FP16])
def test_fast_path_and_forced_fallback_give_identical_bits(acc):
    rng = np.random.default_rng(11)
    a, b = adversarial_batch(rng)
    fast, fallbacks = exact_matmul(dev(a), dev(b), acc)
    slow, forced = exact_matmul(dev(a), dev(b), acc, force_fallback=True)
    fast, slow = backend.to_numpy(fast), backend.to_numpy(slow)
    assert forced == fast.size and fallbacks < fast.size
    assert same_bits(fast, slow)
    rows = dev(a.reshape(-1, a.shape[-1]))
    assert same_bits(backend.to_numpy(exact_rows_sum(rows, acc)[0]),
                     backend.to_numpy(exact_rows_sum(rows, acc, force_fallback=True)[0]))


def test_fast_path_with_specials_matches_fallback():
    rng = np.random.default_rng(12)
    a, b = adversarial_batch(rng)
    a[0, 3, 5], a[1, 4, 0], b[2, 7, 2], b[0, 1, 1] = np.inf, np.nan, -np.inf, 0.0
    with np.errstate(invalid="ignore"):
        fast, _ = exact_matmul(dev(a), dev(b), FP32)
        slow, _ = exact_matmul(dev(a), dev(b), FP32, force_fallback=True)
    assert same_bits(backend.to_numpy(fast), backend.to_numpy(slow))


def test_round_to_odd_sum_against_fractions():
    rng = np.random.default_rng(13)
    terms = rng.standard_normal((50, 30)) * 2.0 ** rng.integers(-300, 300, (50, 30))
    terms[:10, 15:] = -terms[:10, :15]
    got = backend.to_numpy(round_to_odd_sum(dev(terms, backend.xp.float64)))
    for row, value in zip(terms, got):
        exact_sum = sum((Fraction(t) for t in row), Fraction(0))
        assert Fraction(float(value)) == exact_sum or (
            np.float64(value).view(np.uint64) & 1 == 1
            and abs(Fraction(float(value)) - exact_sum) < abs(Fraction(float(value))) * 2 ** -52)


# --- sequential ----------------------------------------------------------------------------

def test_sequential_fp16_stalls_at_2048():
    ones = np.ones((1, 4096), np.float32)
    got = matmul(ones, ones.T, out_fmt="fp32", model=SequentialAccumulation("fp16"))
    assert got[0, 0] == 2048.0
    assert reduce_sum(ones, out_fmt="fp32", model="sequential:fp16") == 2048.0
    assert matmul(ones, ones.T, out_fmt="fp32")[0, 0] == 4096.0


def sequential_reference(a_row, b_col, fmt, fused):
    acc = Fraction(0)
    for x, y in zip(a_row, b_col):
        product = Fraction(float(x)) * Fraction(float(y))
        if not fused:
            product = Fraction(mpfr_round(product, fmt))
        acc = Fraction(mpfr_round(acc + product, fmt))
    return float(acc)


@pytest.mark.parametrize("fmt,fused", [("fp32", True), ("fp32", False), ("fp16", True),
                                       ("bf16", False)])
def test_sequential_matches_step_by_step_reference(fmt, fused):
    rng = np.random.default_rng(21)
    a = round_to(f32(rng.standard_normal((4, 50)) * 3), fmt)
    b = round_to(f32(rng.standard_normal((50, 3))), fmt)
    got = matmul(a, b, out_fmt="fp32", model=SequentialAccumulation(fmt, fused))
    want = [[sequential_reference(a[i], b[:, j], fmt, fused) for j in range(3)] for i in range(4)]
    assert np.array_equal(got, f32(want))


def test_sequential_fp32_unfused_is_numpy_float32_loop():
    rng = np.random.default_rng(22)
    a, b = random_case(rng, 3, 64, 2, 4)
    got = matmul(a, b, out_fmt="fp32", model=SequentialAccumulation("fp32", fused=False))
    for i in range(3):
        for j in range(2):
            total = np.float32(0)
            for x, y in zip(a[i], b[:, j]):
                total = np.float32(total + np.float32(x * y))   # IEEE single ops
            assert got[i, j] == total


def test_sequential_hand_computed():
    # fp32: 1 + 2**-24 + 2**-24: each addition is a tie that rounds back to 1 (even), so
    # sequential gives 1 while the exact sum 1 + 2**-23 is representable.
    a = f32([[1.0, 2.0 ** -24, 2.0 ** -24]])
    b = f32([[1.0], [1.0], [1.0]])
    assert matmul(a, b, out_fmt="fp32", model="sequential")[0, 0] == 1.0
    assert matmul(a, b, out_fmt="fp32")[0, 0] == np.float32(1 + 2.0 ** -23)
    # fp16, fused vs unfused: -(1 + 2**-9) + (1 + 2**-10)**2 is exactly 2**-20 (an fp16
    # subnormal); rounding the product 1 + 2**-9 + 2**-20 to fp16 first loses it.
    x = f32([[-(1 + 2.0 ** -9), 1 + 2.0 ** -10]])
    y = f32([[1.0], [1 + 2.0 ** -10]])
    fused = matmul(x, y, out_fmt="fp32", model=SequentialAccumulation("fp16"))[0, 0]
    unfused = matmul(x, y, out_fmt="fp32", model=SequentialAccumulation("fp16", fused=False))[0, 0]
    assert fused == np.float32(2.0 ** -20) and unfused == 0.0


def test_sequential_equals_blocked_one_exact():
    rng = np.random.default_rng(23)
    a, b = random_case(rng, 5, 30, 4, 20)
    for fmt in ("fp16", "bf16", "fp32"):
        with np.errstate(over="ignore"):
            s = matmul(a, b, out_fmt="fp32", model=SequentialAccumulation(fmt))
            k1 = matmul(a, b, out_fmt="fp32", model=BlockedAccumulation(1, fmt))
        assert same_bits(s, k1)


# --- blocked -------------------------------------------------------------------------------

def blocked_reference(a_row, b_col, k, fmt, bits, mode, input_emin):
    """Scalar FHMP-style reference: Fractions and integer exponents, one dot product."""
    fmt = get(fmt)

    def expo(v, emin):
        return max(int(np.frexp(v)[1]) - 1, emin)

    acc = 0.0
    for start in range(0, len(a_row), k):
        pairs = list(zip(a_row[start:start + k], b_col[start:start + k]))
        terms = [(Fraction(float(x)) * Fraction(float(y)),
                  expo(float(x), input_emin) + expo(float(y), input_emin))
                 for x, y in pairs if x != 0 and y != 0]
        if acc != 0:
            terms.append((Fraction(acc), expo(acc, fmt.emin)))
        if not terms:
            acc = 0.0
            continue
        if bits is None:
            total = sum(t for t, _ in terms)
        else:
            quantum = Fraction(2) ** (max(e for _, e in terms) - bits)
            total = Fraction(0)
            for t, _ in terms:
                magnitude = (abs(t) / quantum).numerator // (abs(t) / quantum).denominator
                total += (1 if t > 0 else -1) * magnitude * quantum
        acc = mpfr_round(total, fmt, mode)
    return acc


@pytest.mark.parametrize("model", [BlockedAccumulation.v100(), BlockedAccumulation.a100(),
                                   BlockedAccumulation.h100(), BlockedAccumulation.a100("bf16"),
                                   BlockedAccumulation(4, "fp16"),
                                   BlockedAccumulation(8, "fp32", 3, "nearest_even"),
                                   BlockedAccumulation.v100("fp16")])
def test_blocked_matches_scalar_reference(model):
    rng = np.random.default_rng(31)
    fmt_in = model.input_format or FP32
    a = round_to(f32(rng.standard_normal((4, 37)) * 2.0 ** rng.integers(-6, 7, (4, 37))), fmt_in)
    b = round_to(f32(rng.standard_normal((37, 3))), fmt_in)
    a[0, :3] = f32([2.0 ** -24, 3 * 2.0 ** -24, 0])   # fp16 subnormals: read at exponent -14
    got = matmul(a, b, out_fmt=model.fmt, model=model)
    want = [[blocked_reference(a[i], b[:, j], model.k, model.fmt, model.alignment_bits,
                               model.rounding, fmt_in.emin) for j in range(3)] for i in range(4)]
    assert np.array_equal(got, f32(want))


def test_blocked_reproduces_fhmp_v100_observations():
    """Results the V100 tensor cores give in the FHMP test suite (tc_test_numerics*.cu)."""
    v100 = BlockedAccumulation.v100()
    h = 2.0 ** -23
    one4 = f32([1, 1, 1, 1])

    def fma(c, a, b):
        return float(backend.to_numpy(v100.block_fma(f32(c), f32(a), f32(b))))

    assert fma(0, one4, [2, h + h / 2, 0, 0]) == 2.0             # round down (positive)
    assert fma(0, one4, [-2, -h - h / 2, 0, 0]) == -2.0          # round up (negative)
    assert fma(-(1 - 2.0 ** -24), [1, 0, 0, 0], [1, 0, 0, 0]) == h  # no extra alignment bits
    for i in range(4):                                           # carry-out bits
        b = [1.0, 1.0, 1.0, 1.0]
        b[i] = h
        assert fma(1 + 2 * h + h, one4, b) == 4 + 4 * h
    assert fma(1.875, one4, [1, 1.5, 1.75, 1.875]) == 8.0
    assert fma(1 + 2 * h + h, one4, one4) == 5.0                 # truncation when normalising
    assert fma(-1 - 2 * h - h, one4, -one4) == -5.0
    # One extra bit (A100) keeps the 2**-24 that V100 loses.
    a100 = BlockedAccumulation.a100()
    assert float(backend.to_numpy(a100.block_fma(f32(-(1 - 2.0 ** -24)), f32([1.0]),
                                                f32([1.0])))) == 2.0 ** -24


def test_blocked_exact_blocks_on_ties_and_cancellation():
    tie = 2.0 ** -24
    a = f32([[1.0, tie, 0, 0], [1 + 2.0 ** -23, tie, 0, 0], [2.0 ** 40, 1.0, -(2.0 ** 40), tie],
             [-1.0, -tie, 2.0 ** -90, -(2.0 ** -90)], [3.0, -3.0, 0, 0], [-0.0, 0.0, 0, 0]])
    b = f32(np.ones((4, 1)))
    b[1, 0] = -0.0
    for model in (BlockedAccumulation(2), BlockedAccumulation(4),
                  BlockedAccumulation(2, rounding="toward_zero"),
                  BlockedAccumulation(4, "bf16", rounding="up")):
        got = matmul(a, b, out_fmt=model.fmt, model=model)
        want = [[blocked_reference(a[i], b[:, 0], model.k, model.fmt, None, model.rounding,
                                   FP32.emin)] for i in range(a.shape[0])]
        assert np.array_equal(got, f32(want)), model
    ones = f32(np.ones((4, 1)))
    assert matmul(a, ones, out_fmt="fp32", model=BlockedAccumulation(4))[:3, 0].tolist() == \
        [1.0, 1 + 2.0 ** -22, 1.0]                                # ties to even


def test_blocked_single_exact_block_equals_exact_model():
    rng = np.random.default_rng(32)
    a, b = random_case(rng, 6, 40, 5, 30)
    assert same_bits(matmul(a, b, out_fmt="fp32", model=BlockedAccumulation(40)),
                     matmul(a, b, out_fmt="fp32"))


def test_blocked_specials():
    a = f32([[np.inf, 1, 1, 1, 1], [np.inf, 1, 1, 1, -1], [np.inf, 1, 1, 1, 0],
             [1e38, 1e38, 1e38, 1e38, 1]])
    b = f32(np.ones((5, 1)))
    b[4, 0] = -np.inf                                     # in the second block
    with np.errstate(over="ignore", invalid="ignore"):
        got = matmul(a, b, out_fmt="fp32", model=BlockedAccumulation.v100(fmt="fp32"))
        big = matmul(a[3:, :4], b[:4], out_fmt="fp32", model=BlockedAccumulation.v100(fmt="fp32"))
    assert np.isnan(got[0, 0]) and got[1, 0] == np.inf and np.isnan(got[2, 0])
    assert np.isnan(got[3, 0]) is np.False_ and got[3, 0] == -np.inf
    assert big[0, 0] == np.float32(FP32.max_finite)       # toward zero: largest finite


@pytest.mark.parametrize("bits", [40, 38])
def test_blocked_large_block_with_many_alignment_bits_is_exact(bits):
    # 8192 ones then 2**-11 + 2**-17 (1 + 2**-23) - 2**-17: the aligned sum 8192 + 2**-11 +
    # 2**-40 needs 54 bits; float64 would drop 2**-40 and tie to 8192, the exact sum rounds
    # up to 8192 + 2**-10. k * 2**(F + 2) >= 2**53: the terms are summed in exact groups.
    x = f32([1.0] * 8192 + [2.0 ** -11, 2.0 ** -17 * (1 + 2.0 ** -23), -(2.0 ** -17)])
    model = BlockedAccumulation(x.size, "fp32", alignment_bits=bits)
    want = blocked_reference(x, np.ones_like(x), model.k, model.fmt, bits, model.rounding,
                             FP32.emin)
    assert want == (8192 + 2.0 ** -10 if bits == 40 else 8192.0)
    assert float(reduce_sum(x, out_fmt="fp32", model=model)) == want
    assert float(backend.to_numpy(model.block_fma(f32(0), x, f32(1)))) == want
    rows = np.stack([x, -x, np.zeros_like(x)])
    assert reduce_sum(rows, axis=-1, out_fmt="fp32", model=model).tolist() == [want, -want, 0]


# --- reductions ----------------------------------------------------------------------------

@pytest.mark.parametrize("model", [ExactAccumulation(), ExactAccumulation("bf16"),
                                   SequentialAccumulation("fp16"), BlockedAccumulation(4, "bf16"),
                                   BlockedAccumulation.h100()])
def test_reduce_sum_is_matmul_with_ones(model):
    rng = np.random.default_rng(41)
    x = round_to(f32(rng.standard_normal((5, 6, 7)) * 50), "fp16")
    got = reduce_sum(x, axis=1, out_fmt="fp32", model=model)
    moved = np.moveaxis(x, 1, 2)                               # (5, 7, 6) @ (6, 1)
    want = matmul(moved, np.ones((6, 1), np.float32), out_fmt="fp32", model=model)[..., 0]
    assert same_bits(got, want)


def test_reduce_sum_axes_and_keepdims():
    rng = np.random.default_rng(42)
    x = f32(rng.standard_normal((3, 4, 5)))
    total = reduce_sum(x, out_fmt="fp32")
    assert total.shape == () and total == np.float32(x.astype(np.float64).sum())
    assert reduce_sum(x, axis=(0, 2), keepdims=True, out_fmt="fp32").shape == (1, 4, 1)
    assert reduce_sum(x, axis=-1, out_fmt="fp32").shape == (3, 4)
    ordered = reduce_sum(x, axis=(2, 0), out_fmt="fp32", model="sequential:bf16")
    flat = np.transpose(x, (1, 0, 2)).reshape(4, 15)              # C order of axes (0, 2)
    assert same_bits(ordered, reduce_sum(flat, axis=1, out_fmt="fp32", model="sequential:bf16"))
    with pytest.raises(ValueError, match="out of range"):
        reduce_sum(x, axis=3, out_fmt="fp32")
    with pytest.raises(ValueError, match="repeated"):
        reduce_sum(x, axis=(1, -2), out_fmt="fp32")


def test_reduce_sum_exact_specials_and_zero_signs():
    x = f32([[np.inf, 1], [np.inf, -np.inf], [np.nan, 1], [-0.0, -0.0], [1.0, -1.0]])
    got = reduce_sum(x, axis=1, out_fmt="fp32")
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[2])
    assert got[3] == 0 and np.signbit(got[3]) and not np.signbit(got[4])


# --- shapes, errors, specs -----------------------------------------------------------------

def test_matmul_shapes_follow_numpy():
    rng = np.random.default_rng(51)
    a = f32(rng.standard_normal((2, 1, 3, 4)))
    b = f32(rng.standard_normal((5, 4, 6)))
    assert matmul(a, b, out_fmt="fp32").shape == (2, 5, 3, 6)
    v = f32(rng.standard_normal(4))
    assert matmul(v, b, out_fmt="fp32").shape == (5, 6)
    assert matmul(a, v, out_fmt="fp32").shape == (2, 1, 3)
    assert matmul(v, v, out_fmt="fp32").shape == ()
    got = matmul(a, b, out_fmt="fp32")
    assert np.allclose(got, np.matmul(a.astype(np.float64), b), rtol=1e-6)
    empty = matmul(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), out_fmt="fp32")
    assert empty.shape == (2, 3) and not np.signbit(empty).any() and not empty.any()


def test_matmul_errors_name_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        matmul(np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32), out_fmt="fp32")
    with pytest.raises(ValueError, match=r"\(2, 2, 3\).*\(3, 3, 5\)"):
        matmul(np.zeros((2, 2, 3), np.float32), np.zeros((3, 3, 5), np.float32), out_fmt="fp32")
    with pytest.raises(ValueError, match="at least 1 dimension"):
        matmul(np.float32(1), np.zeros((1, 1), np.float32), out_fmt="fp32")
    with pytest.raises(TypeError, match="float32"):
        matmul(np.zeros((2, 2)), np.zeros((2, 2), np.float32), out_fmt="fp32")


def test_get_accumulation_specs_and_errors():
    assert get_accumulation("exact") == ExactAccumulation()
    assert get_accumulation("exact:bf16") == ExactAccumulation(BF16)
    assert get_accumulation("sequential:fp16") == SequentialAccumulation(FP16)
    assert get_accumulation("sequential:fp16:unfused") == SequentialAccumulation(FP16, fused=False)
    assert get_accumulation("blocked:4:fp32") == BlockedAccumulation(4, FP32)
    assert get_accumulation("V100") == BlockedAccumulation.v100() == tensor_core("v100")
    model = BlockedAccumulation.a100()
    assert get_accumulation(model) is model and isinstance(model, Accumulation)
    for model in (ExactAccumulation(), SequentialAccumulation("fp16"),
                  SequentialAccumulation(fused=False), BlockedAccumulation(8, "bf16"),
                  BlockedAccumulation.v100(), BlockedAccumulation.h100(),
                  BlockedAccumulation.a100("tf32"), BlockedAccumulation.v100("fp16"),
                  BlockedAccumulation(16, "fp16", 3, "toward_zero", "bf16")):
        assert get_accumulation(str(model)) == model, str(model)
    assert str(BlockedAccumulation.h100()) == "h100"
    assert get_accumulation("blocked:8:fp32:align=24:round=toward_zero:input=bf16") == \
        BlockedAccumulation.a100("bf16")
    for bad in ("fast", "blocked:x", "blocked:0", "sequential:fp99", "exact:fp16:x",
                "sequential:fp16:maybe", "blocked", "blocked:4:fp32:align=x",
                "blocked:4:fp32:speed=2", "blocked:4:round=up:round=up"):
        with pytest.raises(ValueError, match="accumulation spec"):
            get_accumulation(bad)
    with pytest.raises(TypeError):
        get_accumulation(3)
    with pytest.raises(ValueError, match="alignment_bits"):
        BlockedAccumulation(4, alignment_bits=-1)
    with pytest.raises(ValueError, match="rounding"):
        BlockedAccumulation(4, rounding="stochastic")
    with pytest.raises(ValueError, match="fp8|e4m3"):
        BlockedAccumulation.h100("e4m3")
    with pytest.raises(ValueError, match="unknown tensor-core"):
        tensor_core("b200")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExactAccumulation().acc = BF16                                      # frozen


# --- determinism across threads ------------------------------------------------------------

_SCRIPT = """
import hashlib, numpy as np
from fpsim.backend import host_bytes
from fpsim.exact.accumulation import matmul, reduce_sum
rng = np.random.default_rng(7)
a = (rng.standard_normal((96, 300)) * 2.0 ** rng.integers(-20, 20, (96, 300))).astype(np.float32)
b = rng.standard_normal((300, 160)).astype(np.float32)
h = hashlib.sha256()
for model in ("exact", "exact:bf16", "sequential:fp16", "blocked:8:fp32", "h100"):
    h.update(host_bytes(matmul(a, b, out_fmt="fp32", model=model)))
    h.update(host_bytes(reduce_sum(a, axis=1, out_fmt="bf16", model=model)))
print(h.hexdigest())
"""


def test_bits_do_not_depend_on_thread_count():
    digests = set()
    for threads in ("1", "2"):
        env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
                   MKL_NUM_THREADS=threads)
        run = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                             text=True, check=True)
        digests.add(run.stdout.strip())
    assert len(digests) == 1
    again = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                           check=True)
    assert {again.stdout.strip()} == digests
    assert hashlib.sha256(b"").hexdigest() not in digests


def test_lowest_bit_exponent_against_fractions():
    from fpsim.exact.exact_dots import lowest_bit_exponent as _lowest_bit_exponent
    rng = np.random.default_rng(14)
    x = f32(rng.standard_normal((40, 30)) * 2.0 ** rng.integers(-160, 120, (40, 30)))
    x[0] = 0
    x[1, :5] = f32(2.0 ** -149)
    x[2] = f32(2.0 ** 100)
    x[3] = -x[3]

    def lowest(row):
        exps = [(f.numerator & -f.numerator).bit_length() - f.denominator.bit_length()
                for f in (abs(Fraction(float(v))) for v in row) if f != 0]
        return min(exps, default=2000)

    got = backend.to_list(_lowest_bit_exponent(dev(x), axis=1))
    want = [lowest(r) for r in x]
    assert all(g in (w, w - 1) for g, w in zip(got, want))        # a bound, at most 1 low
    assert sum(g == w for g, w in zip(got, want)) >= 36
    powers = f32([[1.0, 2.0, 0.0], [0.5, 2.0 ** -149, 1.5]])
    assert backend.to_list(_lowest_bit_exponent(dev(powers), axis=1)) in ([0, -149], [-1, -149])
