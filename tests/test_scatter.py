"""scatter_sum (the gradient of a gather with repeated indices): exact totals, checked against
Fractions; the same fp32 bits as NumPy's sequential add.at wherever that sum is exact; inf/NaN
and signed zeros as a sum starting from +0 gives them."""
from fractions import Fraction

import numpy as np
import pytest

from fpsim import backend
from fpsim.autograd import Tensor
from fpsim.exact import scatter_sum as _scatter_sum
from fpsim.rounding import round_to


def scatter_sum(positions, values, size):
    """``scatter_sum`` on backend arrays made from the host ones, its result brought back."""
    return backend.to_numpy(_scatter_sum(backend.asarray(positions, backend.xp.int64),
                                         backend.asarray(values, backend.xp.float64), size))


def _odd_round(value: Fraction) -> float:
    """``value`` rounded to odd at 53 bits (the oracle, from the definition)."""
    nearest = float(value)
    if Fraction(nearest) == value:
        return nearest
    below = nearest if Fraction(nearest) < value else float(np.nextafter(nearest, -np.inf))
    above = float(np.nextafter(below, np.inf))
    return below if np.frombuffer(np.float64(below).tobytes(), np.uint64)[0] & 1 else above


@pytest.mark.parametrize("seed", range(30))
def test_totals_are_exact_sums_rounded_to_odd(seed):
    rng = np.random.default_rng(seed)
    n, size = int(rng.integers(1, 200)), int(rng.integers(1, 12))
    positions = rng.integers(0, size, n)
    # wide exponents, so float64 sums in any order are often inexact
    values = rng.standard_normal(n) * np.exp2(rng.integers(-80, 80, n).astype(np.float64))
    got = scatter_sum(positions, values, size)
    for target in range(size):
        exact = sum((Fraction(v) for v in values[positions == target]), Fraction(0))
        assert got[target] == _odd_round(exact), target


def test_cancellation_that_sequential_float64_loses():
    values = np.array([1.0, 2.0 ** -60, -1.0])
    assert scatter_sum(np.zeros(3, np.int64), values, 1)[0] == 2.0 ** -60
    sequential = np.zeros(1)
    np.add.at(sequential, np.zeros(3, np.int64), values)
    assert sequential[0] == 0.0                      # the order-dependent answer it replaces


def test_specials_and_signed_zeros():
    got = scatter_sum(np.array([0, 0, 1, 1, 2, 3, 3]),
                      np.array([np.inf, 1.0, np.inf, -np.inf, -0.0, np.nan, 2.0]), 5)
    assert got[0] == np.inf and np.isnan(got[1]) and np.isnan(got[3])
    assert got[2] == 0.0 and not np.signbit(got[2])         # 0 + -0 is +0, as add.at
    assert got[4] == 0.0 and not np.signbit(got[4])


def test_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="positions"):
        scatter_sum(np.array([0, 1]), np.array([1.0]), 2)


def test_embedding_gradient_matches_add_at_in_fp16():
    rng = np.random.default_rng(0)
    table = Tensor(rng.standard_normal((7, 3)).astype(np.float32), "fp16", requires_grad=True)
    index = np.array([0, 3, 3, 6, 0, 3])
    seed_grad = rng.standard_normal((6, 3)).astype(np.float32)
    rows = table[index]
    (rows * Tensor(seed_grad, "fp16")).sum().backward()
    expected = np.zeros((7, 3))
    np.add.at(expected, index, round_to(seed_grad.astype(np.float64), "fp16").astype(np.float64))
    assert np.array_equal(backend.to_numpy(table.grad.data),
                          round_to(expected, "fp16").astype(np.float32))
