"""``round_to`` of exact rationals (Python ints, ``Fraction``): one rounding, never through
float64 first, in every deterministic mode, against MPFR; and the edges (beyond float64's
range, stochastic rounding of a value float64 does not hold)."""
from __future__ import annotations

from fractions import Fraction

import pytest

from fpsim import round_to
from fpsim.formats import get
from fpsim.rounding import float64_round_to_odd

pytest.importorskip("gmpy2")
from mpfr_oracle import DETERMINISTIC_MODES, mpfr_round_rational  # noqa: E402

FORMATS = ("fp32", "fp16", "bf16", "e4m3fn", "e5m2")
NUDGES = (Fraction(0), Fraction(1, 2 ** 60), Fraction(1, 2 ** 200), Fraction(1, 3 * 2 ** 54))


def hard_rationals(fmt):
    """Midpoints, format numbers, the overflow threshold and subnormal midpoints of ``fmt``,
    each exact and nudged by far less than a float64 ulp (relative), both signs."""
    f = get(fmt)
    ulp_one = Fraction(2) ** -f.man_bits
    tiny = Fraction(2) ** (f.emin - f.man_bits)
    top_ulp = Fraction(2) ** (f.emax - f.man_bits)
    centres = [1 + ulp_one / 2, 1 + 3 * ulp_one / 2, 1 + ulp_one, 3 * tiny / 2, tiny / 2,
               5 * tiny / 2, Fraction(f.max_finite) + top_ulp / 2, Fraction(f.max_finite),
               Fraction(f.min_normal) - tiny / 2]
    values = []
    for c in centres:
        for nudge in NUDGES:
            for v in (c * (1 + nudge), c * (1 - nudge)):
                values += [v, -v]
    return values


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
def test_rationals_round_once(fmt, mode):
    for q in hard_rationals(fmt):
        got = round_to(q, fmt, mode)
        want = mpfr_round_rational(q, fmt, mode)
        assert got == want or (got != got and want != want), (fmt, mode, q, got, want)


def test_big_integers_round_once():
    assert round_to(2 ** 60 + 2 ** 36 + 1, "fp32") == 2.0 ** 60 + 2.0 ** 37
    assert round_to(2 ** 60 + 2 ** 36, "fp32") == 2.0 ** 60            # the tie: to even
    assert round_to(10 ** 400, "fp16") == float("inf")
    assert round_to(-10 ** 400, "fp16", "toward_zero") == -65504.0
    assert round_to(1 + Fraction(1, 2 ** 60), "fp16", "up") == 1 + 2.0 ** -10


def test_round_to_odd_of_rationals():
    # 1/3 lies between 0x3FD5555555555555 (odd: the one) and 0x3FD5555555555556
    assert float64_round_to_odd(Fraction(1, 3)).hex() == "0x1.5555555555555p-2"
    assert float64_round_to_odd(Fraction(2, 3)).hex() == "0x1.5555555555555p-1"
    assert float64_round_to_odd(Fraction(0), side=1) == 5e-324
    assert float64_round_to_odd(2.0, side=-1) == 2.0 - 2.0 ** -52   # odd, just below
    assert float64_round_to_odd(1 + Fraction(1, 2 ** 52), side=1) == 1 + 2.0 ** -52


def test_stochastic_rounding_refuses_a_rational_float64_does_not_hold():
    with pytest.raises(ValueError, match="float64 holds exactly"):
        round_to(Fraction(1, 3), "bf16", "stochastic", seed=1)
    assert round_to(Fraction(1, 2), "bf16", "stochastic", seed=1) == 0.5
