"""Hopper's FP8 GEMM accumulation (``fpsim.exact.promoted``): the model against a slow reference
written here with Fractions, following the documented steps; against H100 outputs measured by
Khattak & Mikaitis; DeepSeek-V3's finding (error grows with K without promotion); the specs;
and the model in the autograd ops."""
from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend
from fpsim.autograd import Tensor, use_policy
from fpsim.exact import accumulation
from fpsim.exact.accumulation import SequentialAccumulation, get_accumulation
from fpsim.exact.promoted import PromotedAccumulation, hopper_fp8_tensor_core

HARDWARE_VECTORS = Path(__file__).resolve().parent / "data" / "h100_fp8_khattak_mikaitis.npz"
FP8 = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}       # exponent bits, fraction bits, bias
INTERVALS = [None, 1, 31, 32, 96, 128, 1000]       # None: no promotion


def matmul(a, b, model) -> np.ndarray:
    """``accumulation.matmul`` to fp32, host arrays in and out (every backend)."""
    return backend.to_numpy(accumulation.matmul(a, b, out_fmt="fp32", model=model))


def bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


# --- the reference: the documented steps, one dot product, Fractions -----------------------

def floor_log2(q: Fraction) -> int:
    """floor(log2(q)) of a positive Fraction, exactly."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e - 1 if q < Fraction(2) ** e else e


def round_binary(q: Fraction, fraction_bits: int, nearest: bool) -> Fraction:
    """q rounded to ``fraction_bits`` with fp32's exponent range (subnormals below 2**-126),
    to nearest even or toward zero. The tests stay below overflow (asserted)."""
    if q == 0:
        return Fraction(0)
    quantum = Fraction(2) ** (max(floor_log2(abs(q)), -126) - fraction_bits)
    count, rest = divmod(abs(q), quantum)
    if nearest and (2 * rest > quantum or (2 * rest == quantum and count % 2)):
        count += 1
    assert count * quantum < 2 ** 128
    return count * quantum if q > 0 else -count * quantum


def tensor_core_chunk(pairs, input_emin: int) -> Fraction:
    """The tensor core over one chunk, from +0: blocks of 32 products; in each block every
    nonzero term (products, exponent e(a) + e(b) with e(x) = max(floor(log2|x|), input emin);
    the accumulator, exponent at least -126) truncated toward zero to a multiple of
    2**(E - 13), E the largest exponent; their exact sum rounded toward zero to 13 bits."""
    acc = Fraction(0)
    for start in range(0, len(pairs), 32):
        terms = [(Fraction(x) * Fraction(y), max(floor_log2(abs(Fraction(x))), input_emin)
                  + max(floor_log2(abs(Fraction(y))), input_emin))
                 for x, y in pairs[start:start + 32] if x != 0 and y != 0]
        if acc != 0:
            terms.append((acc, max(floor_log2(abs(acc)), -126)))
        if terms:
            quantum = Fraction(2) ** (max(e for _, e in terms) - 13)
            total = sum((abs(t) // quantum) * quantum * (1 if t > 0 else -1) for t, _ in terms)
            acc = round_binary(total, 13, nearest=False)
    return acc


def reference_dot(a_row, b_col, interval, input_emin: int) -> float:
    """Chunks of ``interval`` products, each chunk's tensor-core result added into fp32
    (nearest even) from +0; ``interval=None``: the tensor core over all of K. Non-finite
    products: IEEE addition of them (what every chunk and promotion passes on)."""
    pairs = [(float(x), float(y)) for x, y in zip(a_row, b_col)]
    specials = [x * y for x, y in pairs if not math.isfinite(x * y)]
    if specials:
        return float(sum(specials))
    if interval is None:
        return float(tensor_core_chunk(pairs, input_emin))
    acc = Fraction(0)
    for start in range(0, len(pairs), interval):
        part = tensor_core_chunk(pairs[start:start + interval], input_emin)
        acc = round_binary(acc + part, 23, nearest=True)
    return float(acc)


def reference_matmul(a, b, interval, fp8: str) -> np.ndarray:
    emin = 1 - FP8[fp8][2]
    return np.float32([[reference_dot(row, col, interval, emin) for col in b.T] for row in a])


# --- FP8-valued inputs, made here from the formats' definitions ----------------------------

def fp8_grid(fp8: str) -> np.ndarray:
    """Every finite value >= 0 of e4m3fn (S.1111.111 is its NaN) or e5m2 (IEEE-style)."""
    exp_bits, man_bits, bias = FP8[fp8]
    values = []
    for field in range(2 ** exp_bits):
        for man in range(2 ** man_bits):
            if (fp8 == "e5m2" and field == 31) or (fp8 == "e4m3" and field == 15 and man == 7):
                continue
            lead = 2 ** man_bits if field else 0
            values.append((lead + man) * 2.0 ** (max(field, 1) - bias - man_bits))
    return np.float32(values)


def random_fp8(rng, shape, fp8: str, scale_exp: int = 0) -> np.ndarray:
    """FP8 values drawn uniformly from the grid (every binade alike: a wide range), random
    signs, times 2**scale_exp (a per-tensor scale, as the FP8 recipes apply)."""
    grid = fp8_grid(fp8)
    values = grid[rng.integers(0, len(grid), shape)] * rng.choice([-1, 1], shape)
    return np.float32(values * 2.0 ** scale_exp)


def test_the_grids_are_the_formats():
    e4m3, e5m2 = fp8_grid("e4m3"), fp8_grid("e5m2")
    assert (len(e4m3), e4m3.max(), e4m3[1]) == (127, 448.0, 2.0 ** -9)
    assert (len(e5m2), e5m2.max(), e5m2[1]) == (124, 57344.0, 2.0 ** -16)


# --- the model against the reference --------------------------------------------------------

@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_matches_reference_on_random_fp8_inputs(fp8, interval):
    rng = np.random.default_rng(INTERVALS.index(interval) + 10 * (fp8 == "e5m2"))
    a = random_fp8(rng, (3, 300), fp8, scale_exp=-5)
    b = random_fp8(rng, (300, 2), fp8, scale_exp=3)
    model = PromotedAccumulation.h100_fp8(interval, fp8)
    want = reference_matmul(a, b, interval, fp8)
    assert np.array_equal(bits(matmul(a, b, model)), bits(want))


def hard_cases():
    """(name, a row, b column): each one dot product."""
    k = 300
    ones = np.ones(k, np.float32)
    cancel = ones.copy()
    cancel[:150] = 448.0
    cancel[150:] = -448.0
    cancel[7] = 0.015625                      # left over after the cancellation
    huge_range = ones * 2.0 ** -9             # e4m3's smallest subnormal ...
    huge_range[::40] = 448.0                  # ... beside its largest, inside every chunk
    tie_like = np.float32(np.resize([1.0, 2.0 ** -13, 2.0 ** -14, -(2.0 ** -14)], k))
    growing = np.float32(np.resize([2.0 ** e for e in range(-6, 9)], k))
    # a partial sum with 14 significant bits, then subnormal e4m3 inputs: read at exponent -6
    # (not -9), 2**-9 * 448 counts as exponent 2 and truncates more of the partial sum
    sub_a = np.float32(np.resize([1.125, 1.375, 1.625, 1.875], 64))
    sub_b = np.float32(np.resize([2.0 ** -3, 2.0 ** -5, 2.0 ** -7, 2.0 ** -9], 64))
    sub_a[32:40], sub_b[32:40] = 2.0 ** -9, 448.0
    return [("cancellation", cancel, ones), ("subnormal inputs", sub_a, sub_b),
            ("huge range in a chunk", huge_range, ones),
            ("bits at the truncation edge", tie_like, ones), ("growing exponents", growing,
                                                              growing[::-1].copy()),
            ("K < 32", ones[:5] * 3.0, ones[:5] * 0.125),
            ("K = 33, one product past a block", ones[:33] * 448.0, ones[:33]),
            ("zeros", ones * 0, ones), ("negative zeros", -ones * 0, ones)]


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("name,a_row,b_col", hard_cases(), ids=[c[0] for c in hard_cases()])
def test_matches_reference_on_hard_cases(name, a_row, b_col, interval):
    model = PromotedAccumulation.h100_fp8(interval)
    got = matmul(a_row[None, :], b_col[:, None], model)
    want = reference_matmul(a_row[None, :], b_col[:, None], interval, "e4m3")
    assert np.array_equal(bits(got), bits(want)), (name, got, want)


@pytest.mark.parametrize("interval", [None, 32, 128])
def test_non_finite_products_follow_ieee(interval):
    k = 300
    a = np.ones((4, k), np.float32)
    b = np.ones((k, 1), np.float32)
    a[0, 3], b[3, 0] = np.inf, 0.0             # inf * 0: NaN
    a[1, 10], a[1, 250] = np.inf, -np.inf      # in different chunks: NaN at the promotion
    a[2, 299] = -np.inf
    a[3, 40] = np.nan
    got = matmul(a, b, PromotedAccumulation.h100_fp8(interval))[:, 0]
    want = [reference_dot(a[i], b[:, 0], interval, -6) for i in range(4)]
    assert np.array_equal(got, np.float32(want), equal_nan=True), got
    assert np.isnan(got[[0, 1, 3]]).all() and got[2] == -np.inf


@pytest.mark.parametrize("interval", [None, 32, 100])
def test_reduce_sum_is_the_dot_product_with_ones(interval):
    rng = np.random.default_rng(5)
    x = random_fp8(rng, (3, 200), "e5m2", scale_exp=-2)
    model = PromotedAccumulation.h100_fp8(interval, "e5m2")
    got = backend.to_numpy(accumulation.reduce_sum(x, axis=1, out_fmt="fp32", model=model))
    want = reference_matmul(x, np.ones((200, 1), np.float32), interval, "e5m2")[:, 0]
    assert np.array_equal(bits(got), bits(want))


def test_promotion_after_every_product_is_sequential_fp32():
    """One product per chunk: the tensor core adds nothing (a product of two FP8 values has at
    most 8 significant bits), so each promotion is one fp32 addition in index order."""
    rng = np.random.default_rng(9)
    a, b = random_fp8(rng, (4, 150), "e4m3"), random_fp8(rng, (150, 3), "e4m3")
    assert np.array_equal(bits(matmul(a, b, PromotedAccumulation.h100_fp8(1))),
                          bits(matmul(a, b, SequentialAccumulation("fp32"))))


def test_power_of_two_scales_commute_with_normal_inputs():
    """The module's claim: per-operand scales 2**4 and 2**3 on normal FP8 inputs scale the
    result by 2**7, bit for bit."""
    rng = np.random.default_rng(11)
    grid = fp8_grid("e4m3")
    normal = grid[grid >= 2.0 ** -6]
    a = normal[rng.integers(0, len(normal), (4, 300))] * rng.choice([-1, 1], (4, 300))
    b = normal[rng.integers(0, len(normal), (300, 3))] * rng.choice([-1, 1], (300, 3))
    for interval in (None, 128):
        model = PromotedAccumulation.h100_fp8(interval)
        plain = matmul(np.float32(a), np.float32(b), model)
        scaled = matmul(np.float32(a * 2.0 ** 4), np.float32(b * 2.0 ** 3), model)
        assert np.array_equal(bits(scaled), bits(plain * np.float32(2.0 ** 7)))


# --- H100 outputs measured by Khattak & Mikaitis ---------------------------------------------

@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_one_block_reproduces_h100_outputs(fp8):
    """500 dot products of 32 FP8 products each, C = 0, as an H100 computed them (their
    model-validation data, tests/data/h100_fp8_khattak_mikaitis.LICENCE.txt): every bit."""
    data = np.load(HARDWARE_VECTORS)
    a = data[f"{fp8}_a"].view(np.float32)
    b = data[f"{fp8}_b"].view(np.float32)
    measured = data[f"{fp8}_d"]
    got = matmul(a[:, None, :], b[:, :, None], PromotedAccumulation.h100_fp8(None, fp8))
    assert np.array_equal(bits(got).ravel(), measured)
    # the data tells the models apart: the exact dot product misses many of them
    exact = matmul(a[:, None, :], b[:, :, None], "exact")
    assert np.count_nonzero(bits(exact).ravel() != measured) > 100


# --- DeepSeek-V3's finding -------------------------------------------------------------------

def test_error_grows_with_k_without_promotion_and_not_with_it():
    """DeepSeek-V3 (3.3.2): without promotion the relative error grows with K (theirs: nearly
    2% at K = 4096); promoting every 128 products keeps it at the error of one chunk."""
    rng = np.random.default_rng(2024)
    grid = fp8_grid("e4m3")
    unit = grid[(grid > 0) & (grid < 1)]               # positive data: relative error defined
    errors = {}
    for k in (128, 512, 1024, 4096):
        a = unit[rng.integers(0, len(unit), (8, k))]
        b = unit[rng.integers(0, len(unit), (k, 8))]
        exact = np.array([[math.fsum(np.float64(r) * np.float64(c)) for c in b.T] for r in a])
        for name in ("h100-fp8", "h100-fp8:promote=128"):
            got = matmul(a, b, name).astype(np.float64)
            errors[name, k] = float(np.max(np.abs(got - exact) / exact))
    table = ", ".join(f"{n} K={k}: {e:.2e}" for (n, k), e in errors.items())
    alone = [errors["h100-fp8", k] for k in (128, 512, 1024, 4096)]
    promoted = [errors["h100-fp8:promote=128", k] for k in (128, 512, 1024, 4096)]
    assert alone == sorted(alone) and alone[-1] > 20 * alone[0] and alone[-1] > 0.01, table
    assert max(promoted) <= 1.5 * promoted[0] and promoted[-1] < alone[-1] / 20, table


# --- specs and the ops that take a model ------------------------------------------------------

@pytest.mark.parametrize("spec,interval,fp8", [
    ("h100-fp8", None, "e4m3"), ("h100-fp8:promote=128", 128, "e4m3"),
    ("H100-FP8:input=e5m2:promote=64", 64, "e5m2"), ("h100-fp8:input=e4m3fn", None, "e4m3")])
def test_specs(spec, interval, fp8):
    model = get_accumulation(spec)
    assert model == PromotedAccumulation(hopper_fp8_tensor_core(fp8), interval)
    assert get_accumulation(str(model)) == model


def test_general_specs_round_trip():
    for model in (PromotedAccumulation(get_accumulation("h100"), 64),
                  PromotedAccumulation(get_accumulation("blocked:8:fp16"), None)):
        assert get_accumulation(str(model)) == model, str(model)
    assert str(get_accumulation("promoted:128:h100")) == "promoted:128:h100"


@pytest.mark.parametrize("spec,message", [
    ("h100-fp8:promote=0", "positive int"), ("h100-fp8:promote=x", "positive integer"),
    ("h100-fp8:input=fp16", "e4m3 and e5m2"), ("h100-fp8:round=nearest_even", "option"),
    ("h100-fp8:promote=8:promote=16", "repeated"), ("promoted:128:exact", "BlockedAccumulation"),
    ("promoted:h100", "promoted:N:BLOCKED")])
def test_bad_specs_say_why(spec, message):
    with pytest.raises(ValueError, match=message):
        get_accumulation(spec)


def test_the_autograd_ops_take_the_model():
    """matmul, conv2d and sum, by argument and by policy: 448 * 448 then 4095 ones, as in
    the module's example."""
    a = np.ones((1, 4096), np.float32)
    a[0, 0] = 448.0
    want = {"h100-fp8": 200704.0, "h100-fp8:promote=128": 204672.0}
    x, w = a.reshape(1, 1024, 2, 2), a.reshape(1, 1024, 2, 2)
    with use_policy("32-true"):
        for spec, value in want.items():
            assert ag.matmul(Tensor(a), Tensor(a.T), accumulation=spec).item() == value
            assert ag.conv2d(Tensor(x), Tensor(w), accumulation=spec).item() == value
            squares = Tensor(a * a)
            assert ag.sum(squares, accumulation=spec).item() == value
    with use_policy(ag.get_policy("32-true").replace(accumulation="h100-fp8:promote=128")):
        weights = Tensor(a.T, requires_grad=True)
        product = ag.matmul(Tensor(a), weights)
        product.backward()
        assert product.item() == 204672.0
        assert np.array_equal(backend.to_numpy(weights.grad.data), a.T)   # 1 * a, exact


@pytest.mark.parametrize("interval,kind", [(0, ValueError), (2.5, TypeError), (True, TypeError)])
def test_a_promotion_interval_that_is_not_a_positive_integer_is_refused(interval, kind):
    from fpsim.exact.promoted import PromotedAccumulation
    inner = PromotedAccumulation.h100_fp8(128).inner
    with pytest.raises(kind, match=f"^promoted: interval must be a positive integer, got "
                                   f"{interval!r}$"):
        PromotedAccumulation(inner, interval)
    assert PromotedAccumulation(inner, np.int64(64)).interval == 64
