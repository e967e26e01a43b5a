"""The fused kernel ``certify_fp32_open`` (``fpsim.backend.numba_certificate``, Numba) against
the exact layer's NumPy code (the reference, forced by ``use_compiled(False)`` and run under
tunings that force each of its chunk paths): the same open indices (dtype included), ends and
``high`` bits, on random products of float32 and fp16-valued data (2-D, 1xN, Mx1, batched with
row blocks) and on inputs built for every branch: fp32 rounding midpoints straddled by tiny
widths, the overflow threshold, signed zeros, subnormal ends, non-finite products, infinite and
underflowing widths; the inputs the kernel declines; planted bugs the inputs catch; and
``matmul_2d`` / ``matmul_batched`` end to end with their product counts. Without Numba these
tests skip (the exact layer then runs its NumPy code only)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="Numba is not installed (pip install 'fpsim[fast]'): "
                    "certify_fp32_open runs its NumPy code only")

from fpsim import backend                                                   # noqa: E402
from fpsim.backend.numba_certificate import certify_fp32_open as fused      # noqa: E402
from fpsim.exact import certificate                                         # noqa: E402
from fpsim.exact.certificate import certify_fp32_open, width_factor         # noqa: E402
from fpsim.exact.fast_matmul import matmul_2d, matmul_batched               # noqa: E402
from fpsim.exact.product_count import count_products                        # noqa: E402
from fpsim.formats import BF16, FP16, FP32                                  # noqa: E402
from fpsim.rounding import use_compiled                                     # noqa: E402
from bit_patterns import same_bits                                          # noqa: E402

f32, f64 = np.float32, np.float64
# the NumPy code's paths: one chunk; small chunks with one width per chunk, then each element
# re-taken gathered, or (recheck_share 1 / 10**9) never / always the whole chunk; no chunk width
TUNINGS = [dict(), dict(certificate_open_chunk=64, einsum_from=1),
           dict(certificate_open_chunk=64, einsum_from=1, recheck_share=1),
           dict(certificate_open_chunk=64, einsum_from=1, recheck_share=10 ** 9),
           dict(certificate_open_chunk=64, einsum_from=1 << 30)]
NAN32 = np.uint32(0x7FC0DEAD).view(f32)          # garbage in high: unwritten elements show


@pytest.fixture(autouse=True)
def compiled_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def reference(approx, rows, cols, blocks=None, **settings):
    """The NumPy code's (open, low, high_open) and high array."""
    high = np.full(approx.shape, NAN32)
    use_compiled(False)
    try:
        with backend.use_tuning(**settings):
            found = certify_fp32_open(approx, rows, cols, high, blocks)
    finally:
        use_compiled(True)
    return found, high


def assert_same(want, got):
    (want_open, want_low, want_high), want_top = want
    (got_open, got_low, got_high), got_top = got
    assert got_open.dtype == want_open.dtype == np.intp
    assert np.array_equal(got_open, want_open)
    assert same_bits(got_low, want_low) and same_bits(got_high, want_high)
    assert same_bits(got_top, want_top)


def check(approx, rows, cols, blocks=None):
    """The fused kernel (directly and through the exact layer) against the reference under
    every tuning; returns the number of open elements."""
    high = np.full(approx.shape, np.float32(-1.5))
    found = fused(approx, rows, cols, high, blocks)
    assert found is not None, "the kernel declined"
    got = (found, high)
    wired = np.empty(approx.shape, f32)
    assert_same(got, (certify_fp32_open(approx, rows, cols, wired, blocks), wired))
    for settings in TUNINGS:
        assert_same(reference(approx, rows, cols, blocks, **settings), got)
    return found[0].shape[0]


def widths(a, b, k):
    """The fast path's widths for float64 operands a (M, K), b (K, N) (floors included)."""
    rows = np.maximum(np.linalg.norm(a, axis=1) * width_factor(k), 2.0 ** -600)
    return rows, np.maximum(np.linalg.norm(b, axis=0), 2.0 ** -400)


def data(rng, shape, narrow):
    x = rng.standard_normal(shape).astype(np.float16 if narrow else f32)
    return x.astype(f32).astype(f64)


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 7, 40), (40, 7, 1), (33, 20, 17), (96, 64, 80)])
def test_random_products(m, k, n, narrow):
    rng = np.random.default_rng(m * n + narrow)
    a, b = data(rng, (m, k), narrow), data(rng, (k, n), narrow)
    a[m // 2] = 0                                       # exact zeros: ends -0 / +0
    rows, cols = widths(a, b, k)
    opened = check(a @ b, rows, cols)
    assert opened > 0 or m == 1


@pytest.mark.parametrize("narrow", [False, True])
def test_random_batched_products(narrow):
    rng = np.random.default_rng(7 + narrow)
    count, m, k, n = 6, 5, 3, 9
    a, b = data(rng, (count, m, k), narrow), data(rng, (count, k, n), narrow)
    b[2] *= 2.0 ** 20                                   # blocks of very different widths
    a[1, 2] = 0
    rows = np.maximum(np.linalg.norm(a, axis=2) * width_factor(k), 2.0 ** -600).reshape(-1)
    cols = np.maximum(np.linalg.norm(b, axis=1), 2.0 ** -400)
    approx = np.matmul(a, b).reshape(count * m, n)
    blocks = np.arange(count * m) // m
    assert check(approx, rows, cols, blocks) > 0
    assert check(approx, rows, cols, blocks.astype(np.int32)) > 0


def test_nothing_open_and_everything_open():
    rng = np.random.default_rng(3)
    approx = rng.standard_normal((20, 30))
    rows, cols = np.full(20, 2.0 ** -80), np.full(30, 1.0)
    assert check(approx, rows, cols) == 0
    (opened, low, high), _ = reference(approx, rows, cols)
    assert (opened.dtype, low.dtype, high.dtype, opened.shape) == (np.intp, f32, f32, (0,))
    assert check(approx, rows * 2.0 ** 80, cols) == approx.size


def float32_points(rng, count):
    """float32 values of every range: normal, subnormal, near the largest, both signs."""
    values = [rng.standard_normal(count) * 2.0 ** rng.integers(-140, 128, count),
              rng.integers(1, 1 << 10, count) * 2.0 ** -149, [np.finfo(f32).max, 2.0 ** -126,
                                                              2.0 ** -149, 1.0, 3.0]]
    points = np.concatenate(values).astype(f32)
    return np.concatenate([points, -points])


def adversarial_pairs():
    """(x, w) pairs at every branch: fp32 midpoints and their float64 neighbours with widths
    of a fraction of an ulp to a few; fp32 values +- half their spacing (ends on ties); the
    overflow threshold; signed zeros; subnormal ends; non-finite x; infinite w."""
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore"):
        f = float32_points(rng, 60)
        up = np.nextafter(f, np.inf * np.sign(f), dtype=f32).astype(f64)
    f, up = f[np.isfinite(up)], up[np.isfinite(up)]      # the largest: its midpoint is inf
    mid = (f.astype(f64) + up) / 2                       # exact: a float64 midpoint
    ulp = np.spacing(np.abs(mid))
    xs, ws = [], []
    for x in (mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)):
        for w in (ulp / 4, ulp, 2 * ulp, np.full_like(ulp, 2.0 ** -1074)):
            xs.append(x)
            ws.append(w)
    half_gap = np.abs(up - f.astype(f64)) / 2
    xs += [f.astype(f64)] * 3
    ws += [half_gap, half_gap * (1 - 2.0 ** -52), half_gap * (1 + 2.0 ** -52)]
    top = 2.0 ** 128 - 2.0 ** 103                        # from here up, fl32 is inf
    special_x = [top, np.nextafter(top, 0), np.nextafter(top, np.inf), float(np.finfo(f32).max),
                 2.0 ** 128, 1e300, -top, -1e300, 0.0, -0.0, 2.0 ** -150, -2.0 ** -150,
                 3 * 2.0 ** -150, 2.0 ** -149, 2.0 ** -126 - 2.0 ** -150, np.inf, -np.inf]
    special_w = [2.0 ** -1074, 1e-300, 2.0 ** -151, 2.0 ** -150, 2.0 ** -149, 2.0 ** 102,
                 2.0 ** 103, 1.0, 1e290, np.inf]
    grid_x, grid_w = np.meshgrid(special_x, special_w)
    nans = np.array([0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000012345,
                     0xFFF0000000000001, 0x7FF0000000000001], np.uint64).view(f64)
    xs += [grid_x.ravel(), np.repeat(nans, 3)]
    ws += [grid_w.ravel(), np.tile([1e-300, 1.0, np.inf], nans.shape[0])]
    return np.concatenate(xs), np.concatenate(ws)


def test_adversarial_elements_in_every_layout():
    """One element per (x, w) pair as Mx1, 1xN, a square and a batched product (w = the row
    width times a column width of 1, exact)."""
    x, w = adversarial_pairs()
    ones = np.ones(x.shape[0])
    assert check(x[:, None], w, ones[:1]) > 0
    assert check(x[None, :], ones[:1], w) > 0
    side = int(np.sqrt(x.shape[0]))
    square = x[:side * side].reshape(side, side)
    check(square, w[:side * side:side], ones[:side])
    check(square.T.copy(), ones[:side], w[:side * side:side])
    blocks = np.arange(side) % 3
    check(square, ones[:side], np.stack([w[:side], w[side:2 * side], ones[:side]]), blocks)


def test_widths_whose_product_overflows_or_underflows():
    x = np.array([[0.0, -0.0, 1.0, -2.0 ** -149, 1e300, np.inf]] * 4)
    rows = np.array([1e-200, 1e200, 2.0 ** -600, 1e-300])
    cols = np.array([1e-200, 1e200, 2.0 ** -400, 1.0, 1e-160, 2.0 ** -474])
    assert check(x, rows, cols) > 0


def test_layouts_the_callers_do_not_pass():
    """approx a strided view, high an F-ordered array (written in place), int32 blocks."""
    rng = np.random.default_rng(5)
    base = rng.standard_normal((30, 40)) * 2.0 ** rng.integers(-3, 3, (30, 40))
    base[::4, 1::6] = 1.0 + 2.0 ** -24                   # fp32 ties
    approx = base[::2, 1::3]
    rows, cols = np.full(approx.shape[0], 2.0 ** -40), np.full(approx.shape[1], 1.0)
    want = reference(approx, rows, cols)
    high = np.asfortranarray(np.full(approx.shape, NAN32))
    found = fused(approx, rows, cols, high)
    assert found is not None and found[0].shape[0] > 0
    assert_same(want, (found, high))


def test_inputs_the_kernel_declines_run_the_reference():
    rng = np.random.default_rng(6)
    approx = rng.standard_normal((8, 6))
    rows, cols = np.full(8, 0.5), np.full(6, 2.0 ** -30)
    for bad_rows, bad_cols in ((rows * 0, cols), (rows, -cols), (rows, cols * np.nan),
                               (rows.astype(f32), cols)):
        assert fused(approx, bad_rows, bad_cols, np.empty((8, 6), f32)) is None
        high = np.empty((8, 6), f32)
        assert_same(reference(approx, bad_rows, bad_cols),
                    (certify_fp32_open(approx, bad_rows, bad_cols, high), high))
    assert fused(approx.astype(f32), rows, cols, np.empty((8, 6), f32)) is None
    assert fused(approx[:0], rows[:0], cols, np.empty((0, 6), f32)) is None
    per_block = np.stack([cols, cols * 4])
    wrapped = np.array([0, 1, -1, -2, 0, 1, 1, 0])      # NumPy wraps negative block numbers
    assert fused(approx, rows, per_block, np.empty((8, 6), f32), wrapped) is None
    high = np.empty((8, 6), f32)
    assert_same(reference(approx, rows, per_block, wrapped),
                (certify_fp32_open(approx, rows, per_block, high, wrapped), high))
    with pytest.raises(IndexError):
        certify_fp32_open(approx, rows, per_block, high, wrapped + 2)


def test_strict_backend_arrays_run_the_reference():
    rng = np.random.default_rng(8)
    approx = rng.standard_normal((9, 7))
    approx[::2, ::3] = 1.0 + 2.0 ** -24
    rows, cols = np.full(9, 2.0 ** -30), np.full(7, 1.0)
    want = reference(approx, rows, cols)
    with backend.use_backend("numpy-strict"):
        high = backend.xp.empty((9, 7), f32)
        found = certify_fp32_open(*(backend.asarray(v, f64) for v in (approx, rows, cols)), high)
        got = tuple(backend.to_numpy(v) for v in found), backend.to_numpy(high)
    assert_same(want, got)


PLANTED = {
    "ends compared as values (-0 == +0)": lambda x, w: (f32(x - w), f32(x + w), "values"),
    "ends in float32 arithmetic": lambda x, w: (f32(x) - f32(w), f32(x) + f32(w), "bits"),
    "w rounded to float32 first": lambda x, w: (f32(x - f32(w)), f32(x + f32(w)), "bits"),
    "one width for all (no re-take)": lambda x, w: (f32(x - w.max()), f32(x + w.max()), "bits"),
    "high without its width": lambda x, w: (f32(x - w), f32(x), "bits"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bugs_are_caught(bug):
    """Per-element NumPy models of the certificate: the right one gives the kernel's results;
    each with a planted bug gives other results on the adversarial inputs."""
    x, w = adversarial_pairs()
    high = np.empty((x.shape[0], 1), f32)
    got = fused(x[:, None], w, np.ones(1), high), high

    def model(low, up, compare):
        differ = low != up if compare == "values" else low.view(np.uint32) != up.view(np.uint32)
        where = np.flatnonzero(differ)
        return (where, low[where], up[where]), up[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        assert_same(model(f32(x - w), f32(x + w), "bits"), got)
        planted = model(*PLANTED[bug](x, w))
    with pytest.raises(AssertionError):
        assert_same(planted, got)


def run_both(product, *args, **kwargs):
    """(result, counts, fused calls) with the kernel offered, then with NumPy only."""
    calls = []

    def counted(kernel):
        found = backend.fused(kernel)
        if found is None or kernel != "certify_fp32_open":
            return found
        return lambda *a: calls.append(found(*a)) or calls[-1]
    results = []
    for compiled in (True, False):
        use_compiled(compiled)
        with count_products() as counts, pytest.MonkeyPatch.context() as patch:
            patch.setattr(certificate, "fused", counted)
            results.append((product(*args, **kwargs), counts))
    use_compiled(True)
    return results, calls


@pytest.mark.parametrize("fmt", [FP32, FP16, BF16])
@pytest.mark.parametrize("narrow", [False, True])
def test_products_end_to_end(fmt, narrow):
    rng = np.random.default_rng(9 + narrow)
    a = data(rng, (48, 24), narrow).astype(f32)
    b = data(rng, (24, 40), narrow).astype(f32)
    a[3] = 0
    a[5, 0], a[7, 1] = 2.0 ** -60, -2.0 ** -70            # rows that are not exact sums
    bias = data(rng, 40, narrow).astype(f32)
    for args in ((a, b, fmt), (a, b, fmt, bias), (a[:1], b, fmt, bias), (a, b[:, :1], fmt)):
        (got, got_counts), (want, want_counts) = run_both(matmul_2d, *args)[0]
        assert same_bits(got, want) and got_counts == want_counts
    _, calls = run_both(matmul_2d, a, b, fmt, bias)
    assert calls and all(found is not None for found in calls)
    q = data(rng, (6, 12, 8), narrow).astype(f32)
    k = data(rng, (6, 8, 16), narrow).astype(f32)
    q[2, 3, 0] = 2.0 ** -60
    for right in (k, np.swapaxes(np.ascontiguousarray(np.swapaxes(k, 1, 2)), 1, 2)):
        ((got, got_counts), (want, want_counts)), calls = run_both(matmul_batched, q, right, fmt)
        assert same_bits(got, want) and got_counts == want_counts
        assert calls and all(found is not None for found in calls)
