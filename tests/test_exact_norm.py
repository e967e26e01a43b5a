"""The certified global norm: the same bits as the exact round-to-odd reference on every
input, through the fast path and through the fallback."""
import numpy as np
import pytest

import fpsim.exact.norm as norm_mod
from fpsim import backend
from fpsim.exact import exact_global_norm as _exact_global_norm
from fpsim.exact import global_norm as _global_norm


def global_norm(grads):
    """The certified norm, brought to the host (a backend scalar array on every backend)."""
    return backend.to_numpy(_global_norm(grads))


def exact_global_norm(grads):
    return backend.to_numpy(_exact_global_norm(grads))


def _grads(rng, shapes, scale=1.0):
    return [(rng.standard_normal(s) * scale).astype(np.float32) for s in shapes]


def _same(a, b):
    return np.asarray(a, np.float32).tobytes() == np.asarray(b, np.float32).tobytes()


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("scale", [1.0, 1e-30, 1e-42, 1e30, 3e37])
def test_random_matches_reference(seed, scale):
    rng = np.random.default_rng(seed)
    grads = _grads(rng, [(17, 5), (5,), (3, 4, 2)], scale)
    assert _same(global_norm(grads), exact_global_norm(grads))


def test_huge_overflows_like_reference():
    grads = [np.full(4, 3e38, np.float32)]
    assert global_norm(grads) == exact_global_norm(grads) == np.float32(np.inf)


@pytest.mark.parametrize("bad, expected", [(np.inf, np.inf), (-np.inf, np.inf),
                                           (np.nan, np.nan)])
def test_nonfinite(bad, expected):
    grads = [np.array([1.0, bad], np.float32), np.array([np.inf, 2.0], np.float32)]
    if np.isnan(expected):
        assert np.isnan(global_norm(grads)) and np.isnan(exact_global_norm(grads))
    else:
        grads = [np.array([1.0, bad], np.float32)]
        assert global_norm(grads) == exact_global_norm(grads) == np.float32(expected)


def test_empty_and_zero():
    assert _same(global_norm([np.zeros(0, np.float32)]), np.float32(0))
    assert _same(global_norm([np.zeros(3, np.float32), -np.zeros(2, np.float32)]),
                 np.float32(0))


def _fallbacks(monkeypatch):
    calls = []
    real = norm_mod.round_to_odd_sum

    def counted(terms):
        calls.append(backend.size(terms))
        return real(terms)

    monkeypatch.setattr(norm_mod, "round_to_odd_sum", counted)
    return calls


def test_fallback_near_a_midpoint(monkeypatch):
    # |g|^2 = (1 + 2**-24)**2 (+ 2**-40): the norm is the fp32 midpoint 1 + 2**-24 (ties to
    # even: 1) or just above it (rounds up to 1 + 2**-23). A million zeros widen the fast
    # path's error bound past that gap, so the exact sum decides, and gives these bits.
    calls = _fallbacks(monkeypatch)
    zeros = np.zeros(1_000_000, np.float32)
    tie = np.array([1.0, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24], np.float32)
    above = np.append(tie, np.float32(2.0 ** -20))
    assert _same(global_norm([tie, zeros]), np.float32(1.0))
    assert _same(global_norm([above, zeros]), np.float32(1 + 2.0 ** -23))
    assert len(calls) == 2
    for g in (tie, above):
        assert _same(global_norm([g, zeros]), exact_global_norm([g, zeros]))
    # bits below float64's 53 that put sqrt(S) a hair above the midpoint round it up
    below53 = np.append(tie, np.float32(2.0 ** -60))
    assert _same(global_norm([below53]), exact_global_norm([below53]))
    assert _same(global_norm([below53]), np.float32(1 + 2.0 ** -23))


def _correctly_rounded_norm(grads):
    """fp32(sqrt(S)) from the exact S (Fraction), for a normal fp32 result: the nearest of
    the candidates around the float64 estimate, ties to even, decided on squares."""
    from fractions import Fraction
    total = sum(Fraction(float(v)) ** 2 for g in grads for v in np.ravel(g))
    guess = np.float32(np.sqrt(float(total)))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess,
                  np.nextafter(guess, np.float32(np.inf))]
    for low, high in zip(candidates, candidates[1:]):
        mid = (Fraction(float(low)) + Fraction(float(high))) / 2
        if total < mid * mid or (total == mid * mid and int(low.view(np.int32)) % 2 == 0):
            return low
    return candidates[-1]


@pytest.mark.parametrize("values", [
    # S = 1 + 2**-23 + 2**-48 + 2**-52: the float64 root is the midpoint 1 + 2**-24 (it
    # rounds to 1.0), sqrt(S) is above it: 1 + 2**-23
    [1.0, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24, 2.0 ** -26],
    [1.0, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24],                     # the exact tie: 1.0
    # S = (1.5 + 2**-24)**2 + 2**-51: the float64 root is one float64 step above the
    # midpoint, its float64 square above S: 1.5 + 2**-23, not the tie's 1.5
    [1.5, 2.0 ** -12, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24, 2.0 ** -26, 2.0 ** -26],
    [1.5, 2.0 ** -12, 2.0 ** -13, 2.0 ** -30, 2.0 ** -40],
])
def test_no_double_rounding_at_an_fp32_midpoint(values):
    grads = [np.array(values, np.float32)]
    expected = _correctly_rounded_norm(grads)
    assert _same(exact_global_norm(grads), expected)
    assert _same(global_norm(grads), expected)
    if len(values) == 5 and values[0] == 1.0:
        assert _same(expected, np.float32(1 + 2.0 ** -23))
    if len(values) == 7:
        assert _same(expected, np.float32(1.5 + 2.0 ** -23))


def test_fast_path_certifies_ordinary_input(monkeypatch):
    calls = _fallbacks(monkeypatch)
    grads = _grads(np.random.default_rng(0), [(256, 64), (256,)])
    fast = global_norm(grads)
    assert not calls, "an ordinary input is certified without the exact sum"
    assert _same(fast, exact_global_norm(grads))


@pytest.mark.parametrize("seed", range(40))
def test_near_midpoints_match_reference(seed):
    # gradients whose norm lies within a few float64 ulps of an fp32 midpoint, so that
    # certified and fallback cases both occur across the seeds
    rng = np.random.default_rng(seed)
    m = np.float64(np.float32(rng.uniform(1, 2))) + 2.0 ** -24 * (1 + (seed % 2))
    small = (rng.standard_normal(50) * 2.0 ** -30).astype(np.float32)
    head = np.float32(m)
    grads = [np.array([head], np.float32), small]
    assert _same(global_norm(grads), exact_global_norm(grads))
