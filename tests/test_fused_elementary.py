"""The NumPy backend's fused kernels ``exp`` and ``normal_tail`` (``fpsim.backend.
numba_elementary``) give the bits of ``fpsim.exact.elementary``'s own array code.

Each check runs both paths, ``use_compiled(True)`` (the kernels) and ``use_compiled(False)``
(the reference), and compares bit patterns (the sign of zero and NaN payloads included) on
random values and on values built for every branch: ties of exp's rint(y log2 e) and their
neighbours, +-0, subnormals, the clamp at +-400 and just beyond, huge values, infinities,
quiet and signalling NaNs of both signs; for the table path the boundaries between centres
j/4 +- 1/8 (ties of rint(4a)) and their neighbours, +-20, 0, -0. Then the functions built on
them (gelu, normal_cdf, normal_cdf_pdf, sigmoid, the correctly rounded entry points), on
arrays of every layout. Planted bugs (rint as floor(t + 1/2), no clamp, a centre chosen the
other way at ties) show that the inputs tell them apart. Without Numba these tests skip.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="the fused kernels are Numba loops (pip install "
                                    "'fpsim[fast]'); without Numba the exact layer's code runs")

import fpsim.exact as fx                                     # noqa: E402
from fpsim import backend                                    # noqa: E402
from fpsim.backend import numba_elementary as kernels        # noqa: E402
from fpsim.exact import elementary as el                     # noqa: E402
from fpsim.formats import get                                # noqa: E402
from fpsim.rounding import use_compiled                      # noqa: E402

import fused_paths                                           # noqa: E402
from bit_patterns import same_bits                           # noqa: E402

pytestmark = pytest.mark.numpy_only      # the NumPy backend's kernels

NANS = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000123,
                 0xFFF4000000000001, 0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF],
                np.uint64).view(np.float64)


@pytest.fixture(autouse=True)
def restore_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def both(function, *args):
    """``function(*args)`` with the fused kernels, then with the exact layer's own code."""
    assert backend.fused("normal_tail") is not None
    return fused_paths.both("exp", function, *args)


def assert_same(function, *args):
    """Both paths give the same bits (each result of a tuple; masks and None alike)."""
    fused, reference = both(function, *args)
    pairs = zip(fused, reference, strict=True) if isinstance(reference, tuple) else [
        (fused, reference)]
    for got, want in pairs:
        if want is None or np.asarray(want).dtype == bool:     # gelu_parts' mask
            assert (got is None and want is None) or np.array_equal(got, want)
        else:
            assert same_bits(got, want), _first_difference(got, want)


def _first_difference(got, want) -> str:
    got, want = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    bad = np.flatnonzero(got.view(np.uint64) != want.view(np.uint64))
    return f"{bad.size} differ, first at {bad[:1]}: {got.ravel()[bad[:1]]} {want.ravel()[bad[:1]]}"


def neighbours(values, steps: int = 2) -> np.ndarray:
    """``values`` and their float64 neighbours up to ``steps`` ulps each way."""
    values = np.asarray(values, np.float64)
    out, up, down = [values], values, values
    with np.errstate(over="ignore"):         # the largest float64's neighbour up is inf
        for _ in range(steps):
            up, down = np.nextafter(up, np.inf), np.nextafter(down, -np.inf)
            out += [up, down]
    return np.concatenate(out)


def rint_ties() -> np.ndarray:
    """y with y * LOG2E exactly k + 1/2 (rint's ties, to the even k), |k| <= 580: found
    among the few float64 beside (k + 1/2) / LOG2E."""
    guesses = neighbours((np.arange(-580, 581) + 0.5) / el.LOG2E, 4)
    product = guesses * el.LOG2E
    return guesses[product - np.floor(product) == 0.5]


def exp_inputs() -> np.ndarray:
    rng = np.random.default_rng(1)
    ties = rint_ties()
    subnormals = rng.integers(1, 1 << 52, 200, dtype=np.uint64).view(np.float64)
    edges = neighbours([400.0, -400.0, 0.0, 709.782712893384, -745.1332191019412, 1e308,
                        -1e308, np.finfo(np.float64).max, -np.finfo(np.float64).max,
                        2.0 ** -1022, -(2.0 ** -1022)], 3)
    return np.concatenate([
        rng.uniform(-800, 800, 20000), rng.standard_normal(5000), ties, neighbours(ties, 1),
        neighbours((np.arange(-580, 581) + 0.5) * np.log(2.0), 2), subnormals, -subnormals,
        edges, [0.0, -0.0, np.inf, -np.inf], NANS,
        rng.integers(0, 2 ** 64 - 1, 5000, dtype=np.uint64, endpoint=True).view(np.float64)])


def table_inputs() -> np.ndarray:
    """|x| <= 20: random, the centre boundaries (2j + 1)/8 (ties of rint(4a)) and the
    centres with their neighbours, in both signs, 0, -0, +-20, subnormals, tiny values."""
    boundaries = neighbours(np.arange(0, 161) / 8.0, 2)
    boundaries = boundaries[np.abs(boundaries) <= 20.0]
    rng = np.random.default_rng(2)
    tiny = np.array([5e-324, 2.0 ** -1074 * 3, 2.0 ** -1022, 1e-300, 2.0 ** -60, 1e-20])
    x = np.concatenate([rng.uniform(-20, 20, 20000), rng.standard_normal(5000) * 3,
                        boundaries, tiny, [0.0, 20.0, np.nextafter(20.0, 0.0)]])
    x = np.concatenate([x, -x])
    assert np.all(np.abs(x) <= 20.0)
    return x


def layouts(x: np.ndarray):
    """``x`` as it is, as a strided view, a transposed and an F-ordered 2-D array, 3-D, one
    element 0-d, and empty."""
    yield x
    yield x[::3]
    n = (x.size // 12) * 12
    yield x[:n].reshape(12, -1).T
    yield np.asfortranarray(x[:n].reshape(-1, 12))
    yield x[:n].reshape(3, 4, -1)
    yield np.asarray(x[7])
    yield x[:0]


def test_the_constants_are_the_exact_layers():
    assert (kernels.LOG2E, kernels.LN2_HI, kernels.LN2_LO) == (el.LOG2E, el.LN2_HI, el.LN2_LO)
    assert kernels.EXPM1_Q == el._EXPM1_Q
    assert kernels.CLAMP == el._CLAMP
    assert kernels.TABLE_SHAPE == el._gelu_table(backend.name()).shape == (el._DEGREE + 1,
                                                                           el._CENTRES)
    # Q(0) = exp(-0) M(0) = 1/2 exactly: gelu_tail_q's kernel call at a = 0 takes 1 - Q(0)
    assert el._gelu_coefficients()[0][0] == 0.5


def test_exp_is_the_exact_layers_on_every_branch_and_layout():
    x = exp_inputs()
    assert rint_ties().size > 500
    for y in layouts(x):
        assert_same(el.exp, y)
        got = kernels.exp(y)
        assert got.shape == y.shape and not np.shares_memory(got, y)


def test_exp_keeps_nan_payloads_and_maps_infinities():
    got = kernels.exp(np.concatenate([NANS, [np.inf, -np.inf]]))
    assert np.array_equal(got[:-2].view(np.uint64), NANS.view(np.uint64))
    assert got[-2] == np.inf and got[-1] == 0.0 and not np.signbit(got[-1])


def _reference_tail(x):
    use_compiled(False)
    with np.errstate(all="ignore"):
        return el._phi_on_table(x, np.abs(x)), el.exp(-(x * x) * 0.5)


def test_normal_tail_is_the_table_path_on_every_branch_and_layout():
    table = el._gelu_table(backend.name())
    for x in layouts(table_inputs()):
        phi, gauss = kernels.normal_tail(x, table)
        want_phi, want_gauss = _reference_tail(x)
        assert same_bits(phi, want_phi), _first_difference(phi, want_phi)
        assert same_bits(gauss, want_gauss), _first_difference(gauss, want_gauss)
    # the kernel takes eight elements at a time and the rest one by one: arrays of 7
    x = table_inputs()[::7][:2100]
    got = np.concatenate([kernels.normal_tail(x[i:i + 7], table)[0] for i in range(0, x.size, 7)])
    assert same_bits(got, _reference_tail(x)[0])


def test_normal_tail_gives_nan_off_the_table_and_checks_the_table():
    table = el._gelu_table(backend.name())
    phi, gauss = kernels.normal_tail(np.concatenate([[20.5, -21.0, np.inf, -np.inf, 1e300],
                                                     NANS, [1.0]]), table)
    assert np.isnan(phi[:-1]).all() and np.isnan(gauss[:-1]).all()
    assert not np.isnan(phi[-1])
    with pytest.raises(ValueError, match="table"):
        kernels.normal_tail(np.zeros(3), table.T)


def mixed_inputs() -> np.ndarray:
    """Table values with every off-table case among them: NaNs, +-inf, x >= 10, x <= -20,
    |x| > 20, tiny x, and ties of the table's centres."""
    off = np.concatenate([NANS, [np.inf, -np.inf, 10.0, np.nextafter(10.0, 0.0), -20.0,
                                 np.nextafter(-20.0, 0.0), 20.0, np.nextafter(20.0, 21.0),
                                 -np.nextafter(20.0, 21.0), 2.0 ** -60, -(2.0 ** -60),
                                 np.nextafter(2.0 ** -60, 0.0), 5e-324, -5e-324, 1e300, -1e300,
                                 0.0, -0.0, 450.0, -800.0]])
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(3000) * 4, off, table_inputs()[::20]])
    return rng.permutation(x)


@pytest.mark.parametrize("name", ["exp", "gelu", "gelu_parts", "normal_cdf", "normal_pdf",
                                  "normal_cdf_pdf", "sigmoid", "sigmoid_pair"])
def test_the_elementary_functions_are_the_same_under_both_paths(name):
    function = getattr(el, name)
    table_only = np.random.default_rng(4).standard_normal(4000) * 3
    for x in (*layouts(mixed_inputs()), *layouts(table_only), np.float64(-1.5), NANS):
        assert_same(function, x)
    a = np.abs(table_inputs())
    assert_same(el.gelu_tail_q, a)
    assert_same(el.gelu_tail_q, np.array([0.0, -0.0, 20.0]))


@pytest.mark.parametrize("name", ["cr_gelu", "cr_exp", "cr_sigmoid", "cr_silu",
                                  "cr_gelu_tanh"])
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16"])
def test_the_correctly_rounded_functions_are_the_same_under_both_paths(name, fmt):
    with np.errstate(all="ignore"):             # +-1e300 to +-inf, NaN payloads
        x = mixed_inputs()[:2000].astype(np.float32)
    assert_same(getattr(fx, name), x, get(fmt))
    assert_same(getattr(fx, name), x.reshape(40, 50).T, get(fmt))


def _exp_variant(y, *, half_up=False, clamp=el._CLAMP):
    """``elementary.exp``'s formula on finite y, with one planted change."""
    y = np.minimum(np.maximum(y, -clamp), clamp)
    t = y * el.LOG2E
    k = np.floor(t + 0.5) if half_up else np.rint(t)
    r = y - k * el.LN2_HI
    r -= k * el.LN2_LO
    p = r * r * el._horner(r, el._EXPM1_Q) + r
    return (p + 1.0) * el.pow2(k)


def _tail_q_variant(a, *, half_up=False):
    """Q(a) by the table path's formula, with the centre rounded half up if asked."""
    table = el._gelu_table(backend.name())
    centre = np.floor(a * 4 + 0.5) if half_up else np.rint(a * 4)
    j = centre.astype(np.intp)
    h = a - centre / 4
    m = table[15, j]
    for degree in range(14, -1, -1):
        m = m * h + table[degree, j]
    return kernels.exp(-(a * a) * 0.5) * m


def test_planted_bugs_are_caught_by_these_inputs():
    finite = exp_inputs()
    finite = finite[np.isfinite(finite) & (np.abs(finite) <= 1000)]
    _, want = both(el.exp, finite)
    assert same_bits(_exp_variant(finite), want)                     # the variant is faithful
    assert not same_bits(_exp_variant(finite, half_up=True), want)   # rint's ties
    assert not same_bits(_exp_variant(finite, clamp=700.0), want)    # the clamp
    a = np.abs(table_inputs())
    _, want = both(el.gelu_tail_q, a)
    assert same_bits(_tail_q_variant(a), want)
    assert not same_bits(_tail_q_variant(a, half_up=True), want)     # centres' ties
