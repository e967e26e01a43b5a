"""The fused kernel ``widen_with_norms`` (``fpsim.backend.numba_widening``, Numba) against the
exact layer's NumPy code (the reference, forced by ``use_compiled(False)``, in one chunk and
in many): the float64 copy and the lines' ``lowest_bit_patterns`` (and so the quanta) bit for
bit, the sums of squares within their error bound of the exact sums (they may be summed in
another order); on random data, subnormals, signed zeros, mixed magnitudes, all-zero lines,
1xN and Nx1, C, F, strided and reversed layouts, and inf / NaN payloads for the patterns; the
inputs the kernel declines; planted bugs the inputs catch; and ``matmul_2d`` /
``matmul_batched`` end to end, the same bits with the kernel offered or not, exact rows tried
or not. Without Numba these tests skip (the exact layer then runs its NumPy code only)."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("numba", reason="Numba is not installed (pip install 'fpsim[fast]'): "
                    "widen_with_norms runs its NumPy code only")

from fpsim import backend                                                   # noqa: E402
from fpsim.backend.numba_widening import widen_with_norms as fused          # noqa: E402
from fpsim.exact import fast_matmul, widening                               # noqa: E402
from fpsim.exact.certificate import (line_quanta, lowest_bit_patterns,      # noqa: E402
                                     quanta_from_patterns)
from fpsim.exact.fast_matmul import matmul_2d, matmul_batched               # noqa: E402
from fpsim.formats import BF16, FP16, FP32                                  # noqa: E402
from fpsim.rounding import round_to, use_compiled                           # noqa: E402
from bit_patterns import same_bits                                          # noqa: E402
from test_fastpaths import adversarial                                      # noqa: E402

f32, f64 = np.float32, np.float64
# the NumPy code's paths: one chunk; chunks of a few lines (lines crossing chunks), rows
# summed by einsum or by BLAS dot products
TUNINGS = [dict(), dict(widen_chunk=37, plain_factor=1), dict(widen_chunk=37, dot_from=1)]


@pytest.fixture(autouse=True)
def compiled_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def reference(x, axis, quanta, **settings):
    """The exact layer's NumPy code: (copy, norms, quanta or None), copies of its buffers."""
    use_compiled(False)
    try:
        with backend.use_tuning(**settings):
            wide, norms, found = widening.widen_with_norms(x, "test", axis, quanta)
    finally:
        use_compiled(True)
    return (wide.copy(order="K"), norms.copy(), None if found is None else found.copy())


def same_ints(x, y) -> bool:
    return x.dtype == y.dtype == np.int32 and np.array_equal(x, y)


def sums_of_squares(x, axis):
    """Each line's exact sum of squares, correctly rounded (the squares are exact)."""
    lines = x.astype(f64) if axis == 1 else x.astype(f64).T
    return np.array([math.fsum(v * v for v in line) for line in lines.tolist()])


def assert_within_bound(squares, x, axis):
    """Any summation order of n nonnegative terms: |error| <= (n - 1) u / (1 - (n - 1) u)
    times the exact sum, u = 2**-53 (checked with room for the correctly rounded reference's
    own half unit)."""
    exact = sums_of_squares(x, axis)
    n = x.shape[axis]
    bound = (n * 2.0 ** -53 / (1 - n * 2.0 ** -53) + 2.0 ** -52) * exact
    assert np.all(np.abs(squares - exact) <= bound), np.max(np.abs(squares - exact) - bound)


def check(x, axis, quanta=True):
    """The kernel, directly and through the exact layer, against the reference under every
    tuning: the same copy and patterns bits, squares and norms within the bound."""
    out = np.full(x.shape, np.nan, order="F" if x.flags.f_contiguous
                  and not x.flags.c_contiguous else "C")
    found = fused(x, out, axis, quanta)
    assert found is not None, "the kernel declined"
    squares, patterns = found
    assert same_bits(out, x.astype(f64))
    assert squares.dtype == f64 and squares.shape == (x.shape[1 - axis],)
    assert_within_bound(squares, x, axis)
    if quanta:
        assert same_ints(patterns, lowest_bit_patterns(x, axis))
    else:
        assert patterns is None
    wide, norms, line_quanta = widening.widen_with_norms(x, "test", axis, quanta)
    strides, wide = wide.strides, wide.copy(order="K")   # the reference reuses the buffer
    for settings in TUNINGS:
        want_wide, want_norms, want_quanta = reference(x, axis, quanta, **settings)
        assert same_bits(wide, want_wide) and strides == want_wide.strides
        assert (line_quanta is None) if not quanta else same_bits(line_quanta, want_quanta)
        assert np.allclose(norms, want_norms, rtol=2.0 ** -40, atol=0)


def operand(rng, shape, kind):
    """float32 data of ``kind``: normal values, fp16 values, subnormals, mixed magnitudes."""
    values = rng.standard_normal(shape)
    if kind == "fp16":
        return round_to(values.astype(f32) * 4, "fp16")
    if kind == "subnormal":
        values = values * 2.0 ** rng.integers(-149, -125, shape)
    elif kind == "mixed":
        values = values * 2.0 ** rng.integers(-149, 120, shape)
    with np.errstate(under="ignore"):
        x = values.astype(f32)
    x.flat[::5] = -0.0
    x.flat[1::7] = 0.0
    return x


def layouts(x):
    """x in C order, F order, every other column of a wider array, and reversed."""
    wider = np.repeat(x, 2, axis=1)
    yield np.ascontiguousarray(x)
    yield np.asfortranarray(x)
    yield wider[:, ::2]
    yield np.asfortranarray(x[::-1])[::-1]


@pytest.mark.parametrize("kind", ["normal", "fp16", "subnormal", "mixed"])
@pytest.mark.parametrize("shape", [(40, 64), (9, 300), (1, 50), (50, 1), (1, 1), (70, 8)])
def test_copy_squares_and_patterns(kind, shape):
    rng = np.random.default_rng(shape[0] * 7 + shape[1] + len(kind))
    x = operand(rng, shape, kind)
    if shape[0] > 3 and shape[1] > 3:
        x[2] = 0.0                                  # all-zero lines, either axis
        x[:, 3] = -0.0
    for laid_out in layouts(x):
        for axis in (0, 1):
            for quanta in (False, True):
                check(laid_out, axis, quanta)


def test_patterns_of_every_kind_of_element():
    """One element per pattern branch: +-0, subnormals of one bit and many, the smallest
    normal, powers of two (their lowest bit an exponent bit), odd fractions, the largest
    finite values, inf and NaNs with payloads (the kernel does the NumPy code's operations
    on these too, though the callers' norms turn them away)."""
    special = np.uint32([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00400000,
                         0x007FFFFF, 0x00800000, 0x00800001, 0x3F800000, 0xBF800000,
                         0x3F800001, 0x3FFFFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F000000,
                         0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001, 0xFFC0DEAD,
                         0x7F800001, 0x7FFFFFFF, 0x00000003, 0x4B000001]).view(f32)
    rng = np.random.default_rng(1)
    for trial in range(40):
        x = rng.choice(special, (6, 7))
        for laid_out in layouts(x):
            for axis in (0, 1):
                out = np.empty(laid_out.shape, order="C")
                _, patterns = fused(laid_out, out, axis, True)
                with np.errstate(invalid="ignore"):          # signalling NaNs quieted
                    assert same_ints(patterns, lowest_bit_patterns(laid_out, axis)), trial
                    assert same_bits(out, laid_out.astype(f64))
    lines = special.reshape(-1, 1)                  # every element alone on its line
    _, patterns = fused(lines, np.empty(lines.shape), 1, True)
    with np.errstate(invalid="ignore"):
        assert same_ints(patterns, lowest_bit_patterns(lines, 1))


def test_inputs_the_kernel_declines_run_the_reference():
    x = operand(np.random.default_rng(2), (12, 10), "fp16")
    out = np.empty((12, 10))
    assert fused(x.astype(f64), out, 1, True) is None
    assert fused(x.astype(np.float16), out, 1, True) is None
    assert fused(x, out.astype(f32), 1, True) is None
    assert fused(x, np.empty((10, 12)), 1, True) is None
    assert fused(x, np.empty((12, 20))[:, ::2], 1, True) is None
    assert fused(x[:0], out[:0], 1, True) is None
    assert fused(x, out, 2, True) is None
    assert fused(x[None], out[None], 1, True) is None
    assert fused(x.tolist(), out, 1, True) is None
    read_only = np.empty((12, 10))
    read_only.flags.writeable = False
    assert fused(x, read_only, 1, True) is None
    with backend.use_backend("numpy-strict"):       # offers no fused kernels
        wide, norms, quanta = widening.widen_with_norms(backend.asarray(x, f32), "t", 0, True)
        got = [backend.to_numpy(v) for v in (wide, norms, quanta)]
    want = reference(x, 0, True)
    assert same_bits(got[0], want[0]) and same_bits(got[2], want[2])
    assert np.allclose(got[1], want[1], rtol=2.0 ** -40, atol=0)


def numpy_model(x, axis, bug=None):
    """(copy, squares, patterns) of the widening in NumPy, a planted bug on request."""
    wide = x.astype(f64)
    if bug == "copy rounded to bf16":
        wide = round_to(x, "bf16").astype(f64)
    if bug == "copy through + 0.0 (-0 becomes +0)":
        wide = x.astype(f64) + 0.0
    with np.errstate(under="ignore", over="ignore"):
        squares = ((x * x).astype(f64) if bug == "squares in float32" else wide * wide)
    squares = squares.sum(axis=axis)
    mag = x.view(np.int32) & 0x7FFFFFFF
    if bug == "sign bit kept in the magnitude":
        mag = x.view(np.int32)
    low = (mag - 1) if bug == "one unit off instead of the lowest bit" else (mag - 1) & mag
    if bug == "lowest bit's integer value":
        patterns = (low - mag).astype(np.int32)
    else:
        patterns = (low.view(f32) - mag.view(f32)).view(np.int32)
    return wide, squares, patterns.min(axis=axis)


PLANTED = ["copy rounded to bf16", "copy through + 0.0 (-0 becomes +0)", "squares in float32",
           "sign bit kept in the magnitude", "one unit off instead of the lowest bit",
           "lowest bit's integer value"]


def assert_model(model, x, axis, got):
    wide, squares, patterns = model
    out, (got_squares, got_patterns) = got
    assert same_bits(out, wide)
    assert_within_bound(squares, x, axis)
    assert same_ints(got_patterns, patterns)
    assert_within_bound(got_squares, x, axis)


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bugs_are_caught(bug):
    """The right NumPy model gives the kernel's results; each with a planted bug does not,
    on the adversarial data above (mixed magnitudes with subnormals and signed zeros)."""
    x = operand(np.random.default_rng(3), (30, 20), "mixed")
    for axis in (0, 1):
        out = np.empty(x.shape)
        got = out, fused(x, out, axis, True)
        assert_model(numpy_model(x, axis), x, axis, got)
        with pytest.raises(AssertionError):
            with np.errstate(under="ignore", over="ignore"):
                assert_model(numpy_model(x, axis, bug), x, axis, got)


def run_both(product, *args):
    """The product with the kernel offered (checking it was called and not declined), then
    with NumPy only."""
    calls = []

    def counted(kernel):
        found = backend.fused(kernel)
        if found is None or kernel != "widen_with_norms":
            return found
        return lambda *a: calls.append(found(*a)) or calls[-1]
    results = []
    for compiled in (True, False):
        use_compiled(compiled)
        with pytest.MonkeyPatch.context() as patch, np.errstate(over="ignore",
                                                                invalid="ignore"):
            patch.setattr(widening, "fused", counted)
            results.append(product(*args))
    use_compiled(True)
    assert calls and all(found is not None for found in calls)
    return results


END_TUNINGS = [dict(), dict(exact_min_saving=-10 ** 9), dict(exact_min_saving=10 ** 9),
               dict(exact_min_saving=-10 ** 9, widen_chunk=7)]


@pytest.mark.parametrize("kind", ["fp16", "wide", "tiny", "huge", "ints"])
def test_products_end_to_end(kind, monkeypatch):
    """matmul_2d and matmul_batched give the same bits with the kernel offered or not, in
    every layout and out format, with a bias, exact rows tried or not."""
    tried = []
    original = fast_matmul._certify_exact_rows
    monkeypatch.setattr(fast_matmul, "_certify_exact_rows",
                        lambda *args: tried.append(1) or original(*args))
    rng = np.random.default_rng(len(kind) + 11)
    for settings in END_TUNINGS:
        with backend.use_tuning(**settings):
            for m, k, n in ((13, 9, 11), (24, 33, 7), (1, 5, 6), (6, 5, 1)):
                a, b, bias = adversarial(rng, m, k, n, kind)
                for left, right in ((a, b), (np.asfortranarray(a), np.asfortranarray(b)),
                                    (np.repeat(a, 2, axis=1)[:, ::2], b[::-1][::-1])):
                    for fmt in (FP32, FP16, BF16):
                        for beta in (None, bias):
                            got, want = run_both(matmul_2d, left, right, fmt, beta)
                            assert same_bits(got, want), (kind, settings, m, k, n, fmt.name)
            q, keys = adversarial(rng, 4 * 6, 8, 4 * 5, kind)[:2]
            q, keys = q.reshape(4, 6, 8), np.ascontiguousarray(keys.reshape(8, 4, 5)
                                                                .transpose(1, 0, 2))
            transposed = np.swapaxes(np.ascontiguousarray(np.swapaxes(keys, 1, 2)), 1, 2)
            for right in (keys, transposed, keys.transpose(1, 0, 2).transpose(1, 0, 2)):
                for fmt in (FP32, FP16, BF16):
                    got, want = run_both(matmul_batched, q, right, fmt)
                    assert same_bits(got, want), (kind, settings, fmt.name)
    if kind in ("fp16", "ints"):
        assert tried, "fp16 and small-integer data should make rows exact"


def test_non_finite_operands_leave_the_fast_path_either_way():
    a, b, _ = adversarial(np.random.default_rng(4), 8, 6, 5, "fp16")
    for bad in (np.inf, -np.inf, np.nan):
        left = a.copy()
        left[3, 2] = bad
        for compiled in (True, False):
            use_compiled(compiled)
            with np.errstate(over="ignore", invalid="ignore"):
                assert matmul_2d(left, b, FP16) is None
        use_compiled(True)


def test_quanta_from_the_kernels_patterns():
    """``quanta_from_patterns`` on the kernel's patterns: the NumPy ``line_quanta`` (checked
    through ``check`` too), spot values: 0.5's lowest set bit is an exponent bit (clearing it
    leaves 0.25: quantum 0.25), an all-zero line's quantum is 1, a subnormal's its bit."""
    x = f32([[3.0, 0.5, -0.0], [0.0, 0.0, -0.0], [2.0 ** -149, 1.0, 6.0], [6.0, -1.5, 12.0]])
    _, patterns = fused(x, np.empty(x.shape), 1, True)
    quanta = quanta_from_patterns(patterns)
    assert same_bits(quanta, line_quanta(x, 1))
    assert same_bits(quanta, f64([0.25, 1.0, 2.0 ** -149, 0.5]))
