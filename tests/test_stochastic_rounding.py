"""Stochastic rounding: only the two neighbours, the documented draw rule, unbiased, repeatable.

``round_to(x, fmt, "stochastic", seed=s, offset=o)`` takes u = philox_uniforms(s, o, x.size)
(Philox4x32-10, checked here against Random123's known answers; C order) and rounds |x|
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
from fpsim.rounding import philox4x32, philox_uniforms
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
    got = round_to(x, fmt, "stochastic", seed=seed, offset=seed // 3, **options)
    assert got.dtype == x.dtype and got.shape == x.shape
    uniforms = philox_uniforms(seed, seed // 3, x.size)
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
    got = round_to(exact, fmt, "stochastic", seed=2)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), exact.view(f"u{got.itemsize}"))


# --- (b) repeatable: same seed, same bits; another seed, other bits ------------------------------

@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3FN], ids=str)
@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_seed_determines_the_bits(fmt, dtype):
    x = np.random.default_rng(0).standard_normal(100_000).astype(dtype)
    first = round_to(x, fmt, "stochastic", seed=42)
    again = round_to(x, fmt, "stochastic", seed=42, offset=0)
    uint = f"u{x.itemsize}"
    np.testing.assert_array_equal(first.view(uint), again.view(uint))
    # Most values lie strictly between neighbours; another seed or offset disagrees a lot.
    for other in (round_to(x, fmt, "stochastic", seed=43),
                  round_to(x, fmt, "stochastic", seed=42, offset=1),
                  round_to(x, fmt, "stochastic", seed=42 + 2**32)):
        differ = np.count_nonzero(first.view(uint) != other.view(uint))
        assert differ > x.size // 10, differ


def test_rng_draws_one_64_bit_key_and_rounds_as_that_seed():
    x = np.linspace(-3, 3, 12_345).reshape(3, 4115).astype(np.float32)
    rng, twin = np.random.default_rng(7), np.random.default_rng(7)
    got = round_to(x, FP16, "stochastic", rng=rng)
    key = int(twin.integers(0, 2**64, dtype=np.uint64))
    np.testing.assert_array_equal(got.view(np.uint32),
                                  round_to(x, FP16, "stochastic", seed=key).view(np.uint32))
    assert rng.random() == twin.random()


@pytest.mark.parametrize("kwargs,kind,match", [
    ({}, ValueError, "exactly one of seed"),
    ({"seed": 1, "rng": np.random.default_rng(0)}, ValueError, "exactly one of seed"),
    ({"offset": 3}, ValueError, "exactly one of seed"),
    ({"rng": np.random.RandomState(0)}, TypeError, "rng must be a numpy.random.Generator, "
                                                   "got RandomState"),
    ({"rng": np.random.default_rng(0), "offset": 1}, ValueError, "offset goes with seed"),
    ({"seed": -1}, ValueError, "^seed must be an integer from 0 to 18446744073709551615, "
                               "got -1$"),
    ({"seed": 2**64}, ValueError, "seed must be an integer from 0 to 18446744073709551615"),
    ({"seed": 1.0}, TypeError, "^seed must be an integer from 0 to 18446744073709551615, "
                               "got 1.0$"),
    ({"seed": True}, TypeError, "seed must be an integer"),
    ({"seed": 1, "offset": -2}, ValueError, "offset must be an integer from 0 to"),
    ({"seed": 1, "offset": 2**64 - 2}, ValueError, "must not pass 2"),
])
def test_stochastic_argument_errors(kwargs, kind, match):
    with pytest.raises(kind, match=match):
        round_to(np.ones(3), FP16, "stochastic", **kwargs)


@pytest.mark.parametrize("kwargs", [{"rng": np.random.default_rng(0)}, {"seed": 0},
                                    {"offset": 0}])
def test_seed_offset_rng_only_for_stochastic(kwargs):
    with pytest.raises(ValueError, match="only used by mode='stochastic'"):
        round_to(np.ones(3), FP16, "nearest_even", **kwargs)


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
    got = round_to(x, fmt, "stochastic", seed=seed)
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
    uniforms = philox_uniforms(seed, 0, N_DRAWS)
    assert not up_count_is_binomial(int(np.count_nonzero(uniforms < float(p) + 0.01)), p)


# --- (d) chunk independence: one call equals the same array in pieces at their offsets ----------

@pytest.mark.parametrize("fmt", [FP16, BF16, E4M3FN], ids=str)
@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_pieces_at_their_offsets_equal_one_call(fmt, dtype):
    x = np.random.default_rng(5).standard_normal(300_001).astype(dtype)
    whole = round_to(x, fmt, "stochastic", seed=9, offset=5)
    cuts = [0, 1, 1000, 131_073, 131_074, 250_000, x.size]  # across the 131072-chunks
    pieces = [round_to(x[a:b], fmt, "stochastic", seed=9, offset=5 + a)
              for a, b in zip(cuts, cuts[1:])]
    uint = f"u{x.itemsize}"
    np.testing.assert_array_equal(np.concatenate(pieces).view(uint), whole.view(uint))


@pytest.mark.parametrize("dtype", CONTAINERS, ids=lambda d: np.dtype(d).name)
def test_draws_follow_c_order_whatever_the_layout(dtype):
    x = np.random.default_rng(3).standard_normal((300, 257)).astype(dtype)
    flat = round_to(x.reshape(-1), FP16, "stochastic", seed=4)
    uint = f"u{x.itemsize}"
    for layout in (x, np.asfortranarray(x), x.T.copy().T):
        got = round_to(layout, FP16, "stochastic", seed=4)
        assert got.shape == x.shape
        np.testing.assert_array_equal(np.ascontiguousarray(got).reshape(-1).view(uint),
                                      flat.view(uint))
    strided = x[:, ::2]
    got = round_to(strided, FP16, "stochastic", seed=4)
    again = round_to(strided.copy(), FP16, "stochastic", seed=4)
    np.testing.assert_array_equal(got.view(uint), again.view(uint))


# --- (e) the generator: Random123's known answers, streams, and statistics a bad one fails ------

# Random123 kat_vectors (Salmon et al.): counter[4], key[2] -> philox4x32-10 output[4].
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    words = philox4x32([np.array([c], np.uint32) for c in counter], key)
    assert tuple(int(w[0]) for w in words) == expected


def test_uniforms_follow_the_documented_layout():
    seed, offset = 0x299F31D0A4093822, 2**32 - 2   # crosses into the counter's high word
    index = np.arange(offset, offset + 4, dtype=np.uint64)
    w0, w1, _, _ = philox4x32((index.astype(np.uint32), (index >> np.uint64(32)).astype(
        np.uint32), np.zeros(4, np.uint32), np.zeros(4, np.uint32)), (0xA4093822, 0x299F31D0))
    expected = [((int(a) << 32 | int(b)) >> 11) / 2**53 for a, b in zip(w0, w1)]
    assert philox_uniforms(seed, offset, 4).tolist() == expected


def uniform_statistics_ok(u: np.ndarray, v: np.ndarray) -> bool:
    """Mean 1/2, variance 1/12, no lag-1 correlation, no correlation with ``v``: each within
    6 standard errors (standard errors of n independent uniforms)."""
    n = u.size
    mean_ok = abs(u.mean() - 0.5) <= SIGMAS * math.sqrt(1 / 12 / n)
    var_ok = abs(u.var() - 1 / 12) <= SIGMAS * math.sqrt(1 / 180 / n)
    c = u - 0.5
    lag_ok = abs(np.mean(c[1:] * c[:-1])) <= SIGMAS * (1 / 12) / math.sqrt(n)
    cross_ok = abs(np.mean(c * (v - 0.5))) <= SIGMAS * (1 / 12) / math.sqrt(n)
    return bool(mean_ok and var_ok and lag_ok and cross_ok)


def test_uniforms_look_independent_and_a_broken_generator_does_not():
    n = 1_000_000
    u = philox_uniforms(11, 0, n)
    assert uniform_statistics_ok(u, philox_uniforms(12, 0, n))   # adjacent seed
    assert uniform_statistics_ok(u, philox_uniforms(11, n, n))   # next stream
    # Planted bugs: a counter that ignores the offset (streams repeat), a smoothed stream
    # (adjacent draws correlated), and a low-resolution generator (variance off).
    assert not uniform_statistics_ok(u, philox_uniforms(11, 0, n))
    assert not uniform_statistics_ok((u + np.roll(u, 1)) / 2, philox_uniforms(12, 0, n))
    assert not uniform_statistics_ok(np.floor(u * 4) / 4, philox_uniforms(12, 0, n))
