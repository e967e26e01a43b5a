"""Stochastic rounding: only the two neighbours, the documented draw rule, unbiased, repeatable.

``round_to(x, fmt, "stochastic", rng=g)`` draws u = g.random(x.size) (C order) and rounds |x|
away from zero exactly when u < p, p being the distance of |x| from its lower neighbour in units
of the gap (``round_to``'s docstring). The neighbours and p come from the MPFR oracle
(``tests/mpfr_oracle.py``), so every check here has an answer we did not compute with fpsim.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fpsim import round_to
from fpsim.formats import BF16, E4M3FN, E5M2, FP16, custom

pytest.importorskip("gmpy2")
from mpfr_oracle import stochastic_outcomes  # noqa: E402
from test_rounding_mpfr import ALL_FORMATS, CONTAINERS, hard_value, same  # noqa: E402


def expected_stochastic(x: np.ndarray, fmt, uniforms: np.ndarray, **options) -> list[float]:
    """What the documented rule gives with these uniforms: upper iff u < p (exact compare)."""
    answers = []
    for value, u in zip(x.reshape(-1).tolist(), uniforms.tolist()):
        lower, upper, p = stochastic_outcomes(value, fmt, options.get("saturate"),
                                              options.get("subnormals"),
                                              options.get("daz", False))
        answers.append(upper if Fraction(u) < p else lower)
    return answers


# --- (a) only the two neighbours; exact inputs unchanged; the draw rule itself -----------------

@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_result_is_a_neighbour_chosen_by_the_documented_rule(data):
    fmt = data.draw(st.sampled_from(ALL_FORMATS), label="fmt")
    dtype = data.draw(st.sampled_from(CONTAINERS), label="dtype")
    options = data.draw(st.fixed_dictionaries({
        "saturate": st.sampled_from([None, True]),
        "subnormals": st.sampled_from([None, None, False]),
        "daz": st.sampled_from([False, False, True])}), label="options")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    x = np.array(data.draw(st.lists(hard_value(fmt, dtype), min_size=1, max_size=16),
                           label="x"), dtype)
    got = round_to(x, fmt, "stochastic", rng=np.random.default_rng(seed), **options)
    assert got.dtype == x.dtype and got.shape == x.shape
    uniforms = np.random.default_rng(seed).random(x.size)
    expected = expected_stochastic(x, fmt, uniforms, **options)
    for value, result, answer in zip(x.tolist(), got.tolist(), expected):
        lower, upper, p = stochastic_outcomes(value, fmt, options["saturate"],
                                              options["subnormals"], options["daz"])
        assert same(result, lower) or same(result, upper), (value, result, lower, upper)
        if p == 0:  # representable (after daz/flush/overflow rules): unchanged by any draw
            assert same(result, lower)
        assert same(result, answer), (value.hex(), result, answer, float(p))


@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3FN, E5M2, custom(3, 4)], ids=str)
@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_representable_values_never_move(fmt, dtype):
    everything = np.random.default_rng(1).standard_normal(50_000).astype(dtype) * 8
    exact = round_to(everything, fmt)        # representable (inf/NaN for overflow)
    with np.errstate(invalid="ignore"):
        exact = exact[np.isfinite(exact)]
    got = round_to(exact, fmt, "stochastic", rng=np.random.default_rng(2))
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), exact.view(f"u{got.itemsize}"))


# --- (b) repeatable: same seed, same bits; another seed, other bits ------------------------------

@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3FN], ids=str)
@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_seed_determines_the_bits(fmt, dtype):
    x = np.random.default_rng(0).standard_normal(100_000).astype(dtype)
    first = round_to(x, fmt, "stochastic", rng=np.random.default_rng(42))
    again = round_to(x, fmt, "stochastic", rng=np.random.default_rng(42))
    other = round_to(x, fmt, "stochastic", rng=np.random.default_rng(43))
    uint = f"u{x.itemsize}"
    np.testing.assert_array_equal(first.view(uint), again.view(uint))
    differ = np.count_nonzero(first.view(uint) != other.view(uint))
    # Most values lie strictly between neighbours; two seeds disagree on a large share.
    assert differ > x.size // 10, differ


def test_rng_consumes_exactly_one_double_per_element():
    x = np.linspace(-3, 3, 12_345).reshape(3, 4115).astype(np.float32)
    rng, twin = np.random.default_rng(7), np.random.default_rng(7)
    round_to(x, FP16, "stochastic", rng=rng)
    twin.random(x.size)
    assert rng.random() == twin.random()


def test_rng_is_required_and_only_for_stochastic():
    with pytest.raises(ValueError, match="rng"):
        round_to(np.ones(3), FP16, "stochastic")
    with pytest.raises(ValueError, match="rng"):
        round_to(np.ones(3), FP16, "stochastic", rng=np.random.RandomState(0))
    with pytest.raises(ValueError, match="rng"):
        round_to(np.ones(3), FP16, "nearest_even", rng=np.random.default_rng(0))


# --- (c) unbiased, with a bound that a biased rounding cannot meet -------------------------------

N_DRAWS = 200_000
SIGMAS = 6  # a correct rounding fails this with probability ~2e-9; the seeds are fixed anyway


def up_count_is_binomial(counts_up: int, p: Fraction, n: int = N_DRAWS) -> bool:
    """|count - n p| <= 6 standard deviations of Binomial(n, p)."""
    p = float(p)
    return abs(counts_up - n * p) <= SIGMAS * math.sqrt(n * p * (1 - p))


BIAS_CASES = [
    (FP16, 1.0 + 0.25 * 2.0**-10),           # a quarter of the way from 1 to the next fp16
    (FP16, -(1.0 + 0.5 * 2.0**-10)),         # the midpoint, negative
    (FP16, 1024.9),                          # f = 0.9 (approximately; p is exact)
    (FP16, 2.0**-24 * 5.3),                  # subnormal range: gap 2**-24
    (BF16, 3.14159),
    (E4M3FN, 0.3),
    (custom(3, 4), -1.11),
]


@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt,value", BIAS_CASES, ids=lambda v: str(v))
def test_unbiased_and_the_check_can_fail(fmt, value, dtype):
    value = float(dtype(value))
    lower, upper, p = stochastic_outcomes(value, fmt)
    assert 0 < p < 1 and lower != upper
    x = np.full(N_DRAWS, value, dtype)
    seed = 20240601
    got = round_to(x, fmt, "stochastic", rng=np.random.default_rng(seed))
    assert set(np.unique(got).tolist()) <= {lower, upper}
    ups = int(np.count_nonzero(got == upper))
    assert up_count_is_binomial(ups, p), (ups, N_DRAWS * float(p))
    # The mean is the input value to within the same bound (what "unbiased" buys in training).
    spread = abs(upper - lower) * math.sqrt(float(p) * (1 - float(p)) / N_DRAWS)
    assert abs(got.astype(np.float64).mean() - value) <= SIGMAS * spread

    # The same check rejects deterministic roundings and a 1%-biased stochastic one.
    for mode in ("nearest_even", "toward_zero"):
        deterministic = round_to(x, fmt, mode)
        assert not up_count_is_binomial(int(np.count_nonzero(deterministic == upper)), p), mode
    uniforms = np.random.default_rng(seed).random(N_DRAWS)
    assert not up_count_is_binomial(int(np.count_nonzero(uniforms < float(p) + 0.01)), p)


# --- (d) chunk independence: one call equals the same array in pieces, same Generator -----------

@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3FN], ids=str)
@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_pieces_in_sequence_equal_one_call(fmt, dtype):
    x = np.random.default_rng(5).standard_normal(70_001).astype(dtype)
    whole = round_to(x, fmt, "stochastic", rng=np.random.default_rng(9))
    rng = np.random.default_rng(9)
    cuts = [0, 1, 1000, 16_385, 16_386, 50_000, x.size]  # across the kernel's 16384-chunks
    pieces = [round_to(x[a:b], fmt, "stochastic", rng=rng) for a, b in zip(cuts, cuts[1:])]
    uint = f"u{x.itemsize}"
    np.testing.assert_array_equal(np.concatenate(pieces).view(uint), whole.view(uint))


@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_draws_follow_c_order_whatever_the_layout(dtype):
    x = np.random.default_rng(3).standard_normal((300, 257)).astype(dtype)
    flat = round_to(x.reshape(-1), FP16, "stochastic", rng=np.random.default_rng(4))
    uint = f"u{x.itemsize}"
    for layout in (x, np.asfortranarray(x), x.T.copy().T):
        got = round_to(layout, FP16, "stochastic", rng=np.random.default_rng(4))
        assert got.shape == x.shape
        np.testing.assert_array_equal(np.ascontiguousarray(got).reshape(-1).view(uint),
                                      flat.view(uint))
    strided = x[:, ::2]
    got = round_to(strided, FP16, "stochastic", rng=np.random.default_rng(4))
    again = round_to(strided.copy(), FP16, "stochastic", rng=np.random.default_rng(4))
    np.testing.assert_array_equal(got.view(uint), again.view(uint))
