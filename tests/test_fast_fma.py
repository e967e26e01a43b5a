"""Arith.fma's float64 fast path gives the bits of the round-to-odd formulation, including on
the midpoints that force its fallback."""
import numpy as np
import pytest

from fpsim.optim import Arith
from fpsim.optim.arith import fma_round_to_odd


def _reference(ops, a, b, c):
    return ops.round(fma_round_to_odd(a, b, c))


def _same(x, y):
    return np.asarray(x, np.float32).tobytes() == np.asarray(y, np.float32).tobytes()


FORMATS = ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("seed", range(5))
def test_random_matches_round_to_odd(fmt, seed):
    ops = Arith(fmt)
    rng = np.random.default_rng(seed)
    a, b, c = (ops.round(rng.standard_normal(4096) * 10.0 ** rng.integers(-8, 8, 4096))
               for _ in range(3))
    assert _same(ops.fma(a, b, c), _reference(ops, a, b, c))
    assert _same(ops.fma(np.float32(-0.01), b, c), _reference(ops, np.float32(-0.01), b, c))


@pytest.mark.parametrize("scale", [2.0 ** k for k in (-100, -60, -1, 0, 1, 60, 100)])
def test_double_rounding_case_takes_the_exact_path(scale):
    # c = 1 + 2**-23 (odd last bit), a*b = 2**-24 (1 - 2**-46): the exact sum lies just below
    # the midpoint c + 2**-24, so the answer is c; the float64 sum rounds onto the midpoint
    # and ties-to-even would give 1 + 2**-22. The fast path must see the midpoint and fall back.
    ops = Arith("fp32")
    a = np.float32([1 + 2.0 ** -23])
    b = np.float32([(1 - 2.0 ** -23) * 2.0 ** -24 * scale])
    c = np.float32([(1 + 2.0 ** -23) * scale])
    naive = np.float32(a.astype(np.float64) * b + c.astype(np.float64))
    assert not _same(naive, c)
    assert _same(ops.fma(a, b, c), c)
    assert _same(ops.fma(a, b, c), _reference(ops, a, b, c))
    assert _same(ops.fma(-a, b, -c), -c)


