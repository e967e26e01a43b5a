"""The NumPy backend's fused kernels ``softmax_row_terms`` and ``softmax_proxy``
(``fpsim.backend.numba_softmax``) give the bits of ``fpsim.exact.softmax``'s own array code.

Each check runs both paths, ``use_compiled(True)`` (the kernels) and ``use_compiled(False)``
(the reference), and compares bit patterns (signs of zero and NaN payloads included) of every
array ``row_terms`` returns and of ``cr_softmax``, ``cr_log_softmax`` and ``cr_cross_entropy``
(every reduction, fp32/bf16/fp16): on random rows of widths 1 to 300 at several scales, and on
rows built for each branch: tied maxima, -inf entries (masks), all-equal rows, terms far below
the maximum (x - m < -400: exp's clamp), huge and tiny values, differences x - m that are not
floats (err nonzero), one-element rows of any value (NaN payloads, +-inf, +-0), a single +inf.
Inputs the kernels decline (a NaN or a second +inf in a row of several, a row of -inf, a zero
maximum of both signs, rows wider than 4096) must give None and the same bits. The sum of the
lo parts follows NumPy's pairwise order, checked against ``numpy.sum`` directly. Planted bugs
(err not zeroed where s is infinite, err dropped, no clamp, top taken as 1, lo summed one by
one) show that the inputs tell them apart. Without Numba these tests skip.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused kernels are Numba loops (pip install "
                                    "'fpsim[fast]'); without Numba the exact layer's code runs")

import fpsim.exact as fx                                     # noqa: E402
from fpsim.backend import numba_softmax as kernels           # noqa: E402
from fpsim.exact import elementary as el                     # noqa: E402
from fpsim.exact.softmax import row_terms                    # noqa: E402
from fpsim.formats import get                                # noqa: E402
from fpsim.rounding import use_compiled                      # noqa: E402

import fused_paths                                           # noqa: E402
from bit_patterns import same_bits                           # noqa: E402

pytestmark = pytest.mark.numpy_only      # the NumPy backend's kernels

FORMATS = [get(name) for name in ("fp32", "bf16", "fp16")]
NANS = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000123,
                 0xFFF4000000000001, 0x7FF0000000000001], np.uint64).view(np.float64)
RNG = np.random.default_rng(20240611)


@pytest.fixture(autouse=True)
def restore_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def both(function, *args):
    """``function(*args)`` with the fused kernels, then with the exact layer's own code."""
    return fused_paths.both("softmax_row_terms", function, *args)


def assert_same(function, *args):
    """Both paths give the same bits, for each result of a tuple."""
    fused, reference = both(function, *args)
    pairs = (zip(fused, reference, strict=True) if isinstance(reference, tuple)
             else [(fused, reference)])
    for k, (got, want) in enumerate(pairs):
        assert same_bits(got, want), f"result {k}: {_first_difference(got, want)}"


def _first_difference(got, want) -> str:
    got, want = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    bad = np.flatnonzero(got.view(np.uint64) != want.view(np.uint64))
    return f"{bad.size} differ, first at {bad[:1]}: {got.ravel()[bad[:1]]} {want.ravel()[bad[:1]]}"


def taken(x) -> bool:
    """Whether the kernel takes ``x`` (float64 rows) rather than declining it."""
    with np.errstate(all="ignore"):
        return kernels.softmax_row_terms(np.asarray(x, np.float64)) is not None


def random_rows(rows: int, width: int, scale: float) -> np.ndarray:
    return (RNG.standard_normal((rows, width)) * scale).astype(np.float32)


def built_rows(width: int) -> np.ndarray:
    """float32 rows of ``width`` for each branch the kernel takes (module doc)."""
    base = random_rows(14, width, 3.0)
    out = [base[0]]
    tied = base[1].copy()
    tied[RNG.choice(width, size=min(width, 3), replace=False)] = tied.max() + 1
    out.append(tied)
    masked = base[2].copy()
    masked[RNG.random(width) < 0.5] = -np.inf
    masked[RNG.integers(width)] = 1.5            # a finite maximum
    out.append(masked)
    out += [np.full(width, v, np.float32) for v in (0.0, -0.0, 2.5, -7.0, 3e38, -3e38)]
    far = base[3].copy()
    far[::2] -= 500                              # x - m < -400: exp's clamp
    out.append(far)
    out.append(np.where(RNG.random(width) < 0.5, 3e38, -3e38).astype(np.float32))
    tiny = (RNG.standard_normal(width) * 1e-44).astype(np.float32)   # subnormals
    out.append(tiny)
    inexact = np.full(width, 2.0 ** -100, np.float32)     # x - m of 2**-100 - 1: err != 0
    inexact[0] = 1.0
    inexact[1::3] = -(2.0 ** -120)
    out.append(inexact)
    one_inf = base[4].copy()
    one_inf[RNG.integers(width)] = np.inf        # m = inf: top NaN, the others' e = 0
    out.append(one_inf)
    return np.stack(out)


WIDTHS = (1, 2, 3, 7, 8, 9, 16, 17, 31, 32, 33, 100, 127, 128, 129, 130, 255, 256, 257, 300)


@pytest.mark.parametrize("width", WIDTHS)
def test_row_terms_bits_on_built_and_random_rows(width):
    x = np.concatenate([built_rows(width)] + [random_rows(5, width, scale)
                                              for scale in (0.01, 1.0, 30.0, 1000.0)])
    x64 = x.astype(np.float64)
    assert taken(x64)
    assert_same(row_terms, x64)
    assert_same(row_terms, np.asfortranarray(x64))        # the reference sums C-ordered rows
    if width > 1:
        assert np.count_nonzero(row_terms(x64)[1])        # err != 0 somewhere


def test_one_element_rows_of_every_value():
    values = np.concatenate([NANS, [np.inf, -np.inf, 0.0, -0.0, 1.0, -3e38, 5e-324]])
    x = values[:, None]
    assert taken(x)
    assert_same(row_terms, x)
    for fmt in FORMATS:
        assert_same(fx.cr_softmax, x, 1, fmt)
        assert_same(fx.cr_log_softmax, x, 1, fmt)


def test_float64_rows_with_inexact_differences_and_extremes():
    """row_terms takes float64 rows: differences far from floats, subnormals, 2**1023."""
    x = RNG.standard_normal((40, 24)) * np.exp2(RNG.integers(-1074, 1000, (40, 24)))
    x[5] = np.nextafter(1.0, 2.0) * np.exp2(RNG.integers(-1074, -1000, 24))   # subnormals
    x[6, :] = 2.0 ** 1023
    x[6, 3] = -(2.0 ** 1023)                          # s = -inf: err 0, e 0
    x[7, ::2] = -np.inf
    assert taken(x)
    assert_same(row_terms, x)


@pytest.mark.parametrize("case", ["nan", "two_inf", "all_minus_inf", "mixed_zero_max",
                                  "too_wide"])
def test_declined_inputs_give_none_and_the_same_bits(case):
    width = 4097 if case == "too_wide" else 12
    x = random_rows(4, width, 2.0).astype(np.float64)
    row = x[2]
    if case == "nan":
        row[5] = np.nan
    elif case == "two_inf":
        row[[1, 7]] = np.inf
    elif case == "all_minus_inf":
        row[:] = -np.inf
    elif case == "mixed_zero_max":
        row[:] = -1.0
        row[3], row[9] = 0.0, -0.0
    assert not taken(x)
    assert_same(row_terms, x)
    for fmt in FORMATS[:1]:
        assert_same(fx.cr_softmax, x, 1, fmt)
        assert_same(fx.cr_log_softmax, x, 1, fmt)


def test_widest_rows_taken():
    x = random_rows(3, 4096, 40.0).astype(np.float64)
    assert taken(x) and taken(x[:0])
    assert_same(row_terms, x)
    assert_same(row_terms, x[:0])                      # no rows


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_correctly_rounded_entry_points(fmt):
    for width in (1, 5, 32, 100, 257):
        x = np.concatenate([built_rows(width), random_rows(20, width, 4.0)])
        labels = RNG.integers(0, width, x.shape[0])
        assert_same(fx.cr_softmax, x, 1, fmt)
        assert_same(fx.cr_log_softmax, x, 1, fmt)
        finite = x[np.isfinite(x).all(axis=1)]
        for reduction in ("none", "sum", "mean"):
            assert_same(fx.cr_cross_entropy, x, labels, reduction, fmt)
            assert_same(lambda *a: fx.cr_cross_entropy(*a, with_log_softmax=True), finite,
                        labels[:finite.shape[0]], reduction, fmt)
    cube = random_rows(6 * 32, 32, 3.0).reshape(6, 32, 32)
    assert_same(fx.cr_softmax, cube, 1, fmt)             # a middle axis: strided rows
    assert_same(fx.cr_softmax, cube.transpose(2, 0, 1), 0, fmt)
    assert_same(fx.softmax64, cube[0].astype(np.float64))
    assert_same(fx.log_softmax64, cube[0].T.astype(np.float64))


def test_pairwise_sum_is_numpys_row_sum():
    for n in list(range(1, 140)) + [255, 256, 257, 1000, 1031, 2055, 4095, 4096, 70000]:
        a = RNG.standard_normal(n) * np.exp2(RNG.integers(-60, 60, n))
        assert kernels.numpy_pairwise_sum(a) == np.sum(a[None, :], axis=1)[0], n
    samples = RNG.standard_normal((20, 300))
    differ = [_one_by_one(a) != np.sum(a[None, :], axis=1)[0] for a in samples]
    assert sum(differ) > 5                                     # the order shows


def _lo_order_row(width: int) -> np.ndarray:
    """A float64 row (max 0 at index 0, e_1 about 0.9, the others' e in (2**-42, 2**-41), so
    hi = 0 and lo = e there) whose t = hi + lo rounds differently with the lo added one by one
    than in NumPy's pairwise order: x_2 steered (Newton on exp) until a midpoint of t's
    spacing 2**-53 lies between the two sums. A few seeds fail (the two sums agree)."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        x = np.concatenate([[0.0, -0.1], rng.uniform(-29.1, -28.8, width - 2)])
        for _ in range(4):
            rest = el.exp(x)                  # s = x - 0 = x
            rest[0] = 0.0
            big = 1.5 * 2.0 ** 12             # max rest in [1/2, 1): E = 0
            hi = (rest + big) - big
            lo = rest - hi
            high, pairwise, one_by_one = np.sum(hi), np.sum(lo[None, :]), _one_by_one(lo)
            if high + pairwise != high + one_by_one:
                return x
            centre = Fraction(high) + (Fraction(pairwise) + Fraction(one_by_one)) / 2
            midpoint = (math.floor(centre * 2 ** 53) + Fraction(1, 2)) / 2 ** 53
            x[2] += float((midpoint - centre) / Fraction(rest[2]))
    raise AssertionError(f"no row of width {width} found")


@pytest.mark.parametrize("width", [20, 100, 300, 1000, 4096])
def test_rows_where_the_order_of_the_lo_sum_shows(width):
    x = _lo_order_row(width)[None, :]
    assert taken(x)
    assert_same(row_terms, x)
    assert_same(fx.softmax64, x)


def test_constants_are_the_exact_layers():
    assert kernels.EXP_BOUND == el.EXP_BOUND
    assert kernels.WIDEST == 4096


def _one_by_one(terms) -> float:
    total = 0.0
    for v in terms:
        total += v
    return total


def _row_terms_variant(x, *, keep_err=False, no_err=False, no_clamp=False, top_one=False,
                       last_max=False, lo_one_by_one=False):
    """``row_terms``' formula on float64 rows the kernel takes, with one planted change."""
    m = np.max(x, axis=1, keepdims=True)
    s = x - m
    bp = s - x
    err = (x - (s - bp)) + (-m - bp)
    err = err if keep_err else np.where(np.isfinite(s), err, 0.0)
    err = np.zeros_like(err) if no_err else err
    e = el.exp(s)
    if no_clamp:
        e = np.where(s < -400, 0.0, e)
    index = (x.shape[1] - 1 - np.argmax(x[:, ::-1], axis=1)) if last_max else np.argmax(x, 1)
    first = (np.arange(x.shape[0]), index)
    top = np.ones((x.shape[0], 1)) if top_one else e[first][:, None]
    rest = e.copy()
    rest[first] = 0.0
    _, ex = np.frexp(np.max(rest, axis=1, keepdims=True))
    big = 1.5 * np.exp2(ex + 12.0)
    hi = (rest + big) - big
    lo = rest - hi
    lo_sums = (np.array([[_one_by_one(row)] for row in lo]) if lo_one_by_one
               else np.sum(lo, axis=1, keepdims=True))
    t = np.sum(hi, axis=1, keepdims=True) + lo_sums
    eps_e = el.EXP_BOUND + 1.01 * np.abs(err)
    return s, err, e, t, eps_e, np.max(eps_e, axis=1, keepdims=True) + 3 * 2.0 ** -53, top


def _same_terms(got, want) -> bool:
    return all(same_bits(a, b) for a, b in zip(got, want, strict=True))


def test_planted_bugs_are_caught_by_these_inputs():
    x = np.concatenate([built_rows(33), random_rows(8, 33, 300.0)]).astype(np.float64)
    fused, want = both(row_terms, x)
    assert _same_terms(fused, want)
    with np.errstate(all="ignore"):
        assert _same_terms(_row_terms_variant(x), want)             # the variant is faithful
        for planted in ("keep_err", "no_err", "no_clamp", "top_one"):
            assert not _same_terms(_row_terms_variant(x, **{planted: True}), want), planted
        for width in (300, 1000):
            row = _lo_order_row(width)[None, :]
            fused_row, want_row = both(row_terms, row)
            assert _same_terms(fused_row, want_row)
            assert _same_terms(_row_terms_variant(row), want_row)
            assert not _same_terms(_row_terms_variant(row, lo_one_by_one=True), want_row)
        # which of tied maxima leaves ``rest`` changes no bit: each has e = 1 and lo = 0
        # (ties of +0 and -0, which would, are declined), so the first-index rule is free
        assert _same_terms(_row_terms_variant(x, last_max=True), want)
