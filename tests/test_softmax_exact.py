"""Correctly rounded softmax, log-softmax and cross-entropy against MPFR (whole rows exact).

MPFR at 400 bits: every x_i - m of float32 values is exact there (at most 277 bits), the sums
of exponentials carry ~350 good bits, one rounding to the format's grid finishes it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

gmpy2 = pytest.importorskip("gmpy2")

import fpsim.exact as fx  # noqa: E402
from mpfr_oracle import (log_softmax_values, mpfr_rounded, row_terms,  # noqa: E402
                         softmax_values)
from fpsim import backend  # noqa: E402
from fpsim.autograd import Tensor, cross_entropy, use_policy  # noqa: E402
from fpsim.formats import get  # noqa: E402
from fpsim.rounding import round_to  # noqa: E402

FORMATS = ("fp32", "fp16", "bf16")
_CTX = gmpy2.context(precision=400)


def rows(seed: int, n: int, classes: int) -> np.ndarray:
    rng = np.random.default_rng([seed, classes])
    x = rng.standard_normal((n, classes)) * rng.choice([0.1, 1, 5, 30], (n, 1))
    dominant = rng.random(n) < 0.3          # one class far ahead: t tiny, log1p matters
    x[dominant, 0] += rng.uniform(5, 60, dominant.sum())
    tiny = rng.random(n) < 0.1
    x[tiny] *= 2.0 ** -rng.integers(10, 60, (tiny.sum(), 1))
    return x.astype(np.float32)


def _dev(x, dtype):
    """A host array as a backend array, for the engine's functions."""
    return backend.asarray(x, dtype)


# the correctly rounded functions on backend arrays made from host ones, their float64
# proxies brought back to the host
def cr_softmax(x, axis, fmt) -> np.ndarray:
    return backend.to_numpy(fx.cr_softmax(_dev(x, backend.xp.float32), axis, fmt))


def cr_log_softmax(x, axis, fmt) -> np.ndarray:
    return backend.to_numpy(fx.cr_log_softmax(_dev(x, backend.xp.float32), axis, fmt))


def cr_cross_entropy(x, labels, reduction, fmt) -> np.ndarray:
    return backend.to_numpy(fx.cr_cross_entropy(_dev(x, backend.xp.float32),
                                                _dev(labels, backend.xp.int64), reduction, fmt))


def _same(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    wrong = np.flatnonzero(got.view(np.uint32).ravel() != want.view(np.uint32).ravel())
    assert wrong.size == 0, f"{what}: {wrong.size} differ, e.g. {got.ravel()[wrong[:3]]} " \
                            f"vs {want.ravel()[wrong[:3]]}"


@pytest.mark.parametrize("classes", [1, 2, 10, 100])
def test_softmax_and_log_softmax(classes):
    x = rows(0, 4000 // classes + 20, classes)
    soft, logs = softmax_values(x), log_softmax_values(x)
    for fmt in FORMATS:
        f = get(fmt)
        _same(round_to(cr_softmax(x, 1, f), f), mpfr_rounded(soft, fmt).reshape(x.shape),
              f"softmax {fmt}")
        _same(round_to(cr_log_softmax(x, 1, f), f), mpfr_rounded(logs, fmt).reshape(x.shape),
              f"log_softmax {fmt}")


def test_softmax_along_axis_zero_matches_transpose():
    x = rows(1, 30, 7)
    f = get("bf16")
    assert np.array_equal(cr_softmax(x.T, 0, f), cr_softmax(x, 1, f).T)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
    rng = np.random.default_rng(2)
    for trial in range(40):
        x = rows(100 + trial, int(rng.integers(1, 40)), int(rng.integers(2, 30)))
        labels = rng.integers(0, x.shape[1], x.shape[0])
        exact = row_terms(x)
        with _CTX:
            losses = [lse - d[k] for (d, lse), k in zip(exact, labels.tolist())]
            total = gmpy2.fsum(losses)
            want = {"none": losses, "sum": [total], "mean": [total / len(losses)]}[reduction]
        for fmt in FORMATS:
            f = get(fmt)
            got = round_to(np.atleast_1d(cr_cross_entropy(x, labels, reduction, f)), f)
            _same(got, mpfr_rounded(want, fmt), f"cross_entropy {reduction} {fmt} trial {trial}")


def test_ops_round_the_correctly_rounded_values():
    x = rows(3, 64, 10)
    labels = np.arange(64) % 10
    with use_policy("32-true"):
        t = Tensor(x)
        _same(backend.to_numpy(t.softmax(-1).data),
              round_to(cr_softmax(x, 1, get("fp32")), get("fp32")), "Tensor.softmax")
        _same(backend.to_numpy(t.log_softmax(-1).data),
              round_to(cr_log_softmax(x, 1, get("fp32")), get("fp32")), "log_softmax")
        _same(backend.to_numpy(cross_entropy(t, labels).data),
              round_to(cr_cross_entropy(x, labels, "mean", get("fp32")), get("fp32")),
              "cross_entropy")


def test_the_fallback_row_path():
    """The Decimal path forced on every element (``ok`` all False), against MPFR."""
    x = rows(4, 12, 5)
    soft = softmax_values(x)
    f = get("fp32")
    before = fx.FALLBACK_COUNT["elements"]
    x64 = _dev(x.astype(np.float64), backend.xp.float64)
    ok = backend.xp.zeros(x.shape, backend.xp.bool_)
    _, _, e, t, _, _, top = fx.row_terms(x64)
    v = backend.to_numpy(fx.settle_rows(x64, e / (top + t), ok, f, "softmax"))
    assert fx.FALLBACK_COUNT["elements"] - before == x.size
    _same(round_to(v, f), mpfr_rounded(soft, "fp32").reshape(x.shape), "settled softmax")


def test_non_finite_rows_give_the_nans_they_gave_before():
    """Rows holding inf, -inf or NaN: the NaN bits of the earlier libm formulas."""
    x = np.float32([[np.inf, 1.0, 2.0], [-np.inf, 1.0, 2.0], [np.nan, 1.0, 2.0],
                    [-np.inf, -np.inf, -np.inf], [1.0, np.inf, np.inf], [0.5, 1.0, 2.0]])
    d = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = d - d.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        soft = e / e.sum(axis=1, keepdims=True)
        logs = shifted - np.log(e.sum(axis=1, keepdims=True))
        f = get("fp32")
        bits = [(cr_softmax(x, 1, f), soft), (cr_log_softmax(x, 1, f), logs)]
        ce = cr_cross_entropy(x, np.arange(6) % 3, "none", f)
        bits.append((ce, -logs[np.arange(6), np.arange(6) % 3]))
    for got, want in bits:
        got, want = round_to(got, f), round_to(want, f)
        bad = np.isnan(want)
        assert np.array_equal(got[bad].view(np.uint32), want[bad].view(np.uint32))
        assert np.array_equal(got[~bad], want[~bad])


def test_the_fallback_takes_rows_with_minus_infinity():
    """A -inf logit (an fp16 read-out that overflowed downwards) adds e**-inf = 0 exactly to
    the row's sum; the Decimal fallback took it to a Fraction and raised OverflowError."""
    from fractions import Fraction

    from fpsim.exact import softmax_ref as ref
    row = ref.Row([-np.inf, 1.0, 2.0, -np.inf])
    low, high = ref.cross_entropy_enclosure([row], [2], "mean")(30)
    assert high - low < Fraction(1, 10**25)
    assert abs(float(low) - math.log1p(math.exp(-1.0))) < 1e-15       # -log(e**2 / (e + e**2))
    assert ref.softmax_enclosure(row, 0)(30) == (0, 0)
    soft_low, soft_high = ref.softmax_enclosure(row, 1)(30)
    assert abs(float(soft_low) - 1 / (1 + math.e)) < 1e-15
    f = get("fp32")
    x = np.float32([[-np.inf, 1.0, 2.0], [0.5, -np.inf, -1.0]])
    x64 = _dev(x.astype(np.float64), backend.xp.float64)
    ok = backend.xp.zeros(x.shape, backend.xp.bool_)
    with np.errstate(invalid="ignore", divide="ignore"):
        _, _, e, t, _, _, top = fx.row_terms(x64)
        settled = backend.to_numpy(fx.settle_rows(x64, e / (top + t), ok, f, "softmax"))
    settled = round_to(settled, f)
    assert settled[0, 0] == 0 and settled[1, 1] == 0
    assert settled[0, 2] == np.float32(1 / (1 + math.exp(-1.0)))
