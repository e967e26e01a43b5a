"""The exact 2-D matmul's newer branches against the general path, bit for bit: exact rows
(the second certificate a row at a time), the chunked fp32 ends that report only open
elements, all-zero product sets, the float32 gather, the chunked widening with norms, and
the underflow count; plus the kernels they lean on (line_quanta, round_to's small-array
path and its per-kind plan)."""
from __future__ import annotations

import numpy as np
import pytest

from fpsim import backend
from fpsim.exact import fast_matmul, open_elements, widening
from fpsim.exact.certificate import certify, certify_fp32_open, line_quanta, width_factor
from fpsim.exact.exact_dots import lowest_bit_exponent
from fpsim.exact.observers import backward_pass, rounded
from fpsim.exact.underflow import count_gradient_underflow
from fpsim.formats import BF16, FP16, FP32, get
from fpsim.rounding import round_to

from bit_patterns import host, same_bits  # noqa: E402
from test_fastpaths import adversarial  # noqa: E402
# host in, host out on every backend: matmul_2d gets backend arrays made from host ones
from test_split_certificate import matmul_2d, slow_reference  # noqa: E402

f32, f64, i64 = backend.xp.float32, backend.xp.float64, backend.xp.int64


def dev(x, dtype=None):
    """A host array as a backend array (its own dtype unless told)."""
    x = np.asarray(x)
    return backend.asarray(x, {np.float32: f32, np.float64: f64, np.int64: i64}[x.dtype.type]
                           if dtype is None else dtype)

OUT_FORMATS = [FP32, FP16, BF16, get("e4m3")]


def _count_calls(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


@pytest.mark.parametrize("widen_chunk", [1 << 17, 7])
@pytest.mark.parametrize("kind", ["fp16", "ints", "tiny", "huge"])
def test_exact_rows_match_the_reference(kind, widen_chunk, monkeypatch):
    """Exact rows forced on (any size; the quanta taken with the widening in one chunk or in
    many): fl32(approx) where the row's sums are exact, the ends elsewhere, the IEEE sign
    of exact zero sums; ties, signed zeros of disjoint supports, zero lines, subnormal and
    overflowing sums."""
    taken = _count_calls(monkeypatch, fast_matmul, "_certify_exact_rows")
    rng = np.random.default_rng(len(kind) + 40)
    with backend.use_tuning(exact_min_saving=-10 ** 9, widen_chunk=widen_chunk):
        for m, k, n in ((12, 9, 10), (17, 33, 8), (9, 2, 14)):
            a, b, bias = adversarial(rng, m, k, n, kind)
            for out_fmt in OUT_FORMATS:
                for beta in (None, bias):
                    with np.errstate(over="ignore", invalid="ignore"):
                        fast = matmul_2d(a, b, out_fmt, beta)
                    assert same_bits(fast, slow_reference(a, b, out_fmt, beta)), (m, k, n)
    if kind in ("fp16", "ints"):
        assert taken, "fp16 and small-integer data should make most rows exact"


def test_exact_rows_with_some_rows_left_to_the_ends(monkeypatch):
    """Rows of fp16 values are exact, rows of wide fp32 values are not: both kinds in one
    product, the exact-row path taken and the other rows certified by the ends."""
    taken = _count_calls(monkeypatch, fast_matmul, "_certify_exact_rows")
    rng = np.random.default_rng(3)
    a, b, bias = adversarial(rng, 40, 24, 30, "fp16")
    wide = rng.standard_normal((6, 24)) * 2.0 ** rng.integers(-20, 20, (6, 24))
    a[[5, 9, 17, 22, 30, 33]] = wide.astype(np.float32)
    with backend.use_tuning(exact_min_saving=-10 ** 9):
        for out_fmt in (FP32, FP16):
            for beta in (None, bias):
                rows = _exact_rows(a, b)
                assert rows is not None and not rows.all() and rows.sum() >= 20
                with np.errstate(over="ignore", invalid="ignore"):
                    fast = matmul_2d(a, b, out_fmt, beta)
                assert same_bits(fast, slow_reference(a, b, out_fmt, beta))
    assert taken


def _norms(a, b):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return np.sqrt((a64 * a64).sum(1)), np.sqrt((b64 * b64).sum(0))


def _exact_rows(a, b):
    """fast_matmul's exact rows of a @ b where the gate lets them be tried, else None."""
    m, k = a.shape
    if not fast_matmul._exact_rows_worth_trying(dev(a), dev(b), m, k, b.shape[1]):
        return None
    rows = fast_matmul._exact_rows(*map(dev, _norms(a, b)), line_quanta(dev(a), 1),
                                   line_quanta(dev(b), 0), k)
    return None if rows is None else host(rows)


@pytest.fixture
def exact_rows_everywhere():
    """Exact rows tried whatever the output's size against the operands'."""
    with backend.use_tuning(exact_min_saving=-10 ** 9):
        yield


def test_exact_rows_are_not_tried_for_wide_fp32_data(exact_rows_everywhere):
    rng = np.random.default_rng(8)
    a, b, _ = adversarial(rng, 30, 64, 20, "wide")
    assert not fast_matmul._exact_rows_worth_trying(dev(a), dev(b), 30, 64, 20)
    narrow_first = a.copy()
    narrow_first[0] = 1.0            # past the first-line check: the quanta turn it away
    ones = np.ones_like(b)
    assert fast_matmul._exact_rows_worth_trying(dev(narrow_first), dev(ones), 30, 64, 20)
    assert _exact_rows(narrow_first, ones) is None
    with np.errstate(over="ignore", invalid="ignore"):
        assert same_bits(matmul_2d(narrow_first, ones, FP16),
                         slow_reference(narrow_first, ones, FP16))


def test_zero_sums_of_nonzero_lines_take_the_ieee_sign():
    """Disjoint supports: every product zero though no row or column is; -0 exactly when
    every product is -0, through the all-zero shortcut of the exact step."""
    a = np.float32([[-0.0, 1.0], [0.0, 1.0], [2.0, 0.0]])
    b = np.float32([[1.0, 3.0], [-0.0, 0.0]])
    with np.errstate(invalid="ignore"):
        out = matmul_2d(a, b, FP32)
    assert same_bits(out, slow_reference(a, b, FP32))
    assert np.signbit(out[0, 0]) and not np.signbit(out[1, 0]) and out[2, 0] == 2.0


@pytest.mark.parametrize("order", ["C", "F", "strided"])
def test_gathered_products_from_any_operand_layout(order, monkeypatch):
    """The exact step gathers from the float32 operands where they are C- or F-ordered,
    else from their float64 copies: same bits for every layout, split certificate off."""
    def certify_nothing(terms, upper):       # the engine's arrays, on any backend
        return (backend.xp.zeros(terms.shape[0], backend.xp.float32),
                backend.xp.zeros(terms.shape[0], bool))

    monkeypatch.setattr(open_elements, "split_certify", certify_nothing)
    rng = np.random.default_rng(5)
    a, b, bias = adversarial(rng, 13, 40, 11, "ints")
    if order == "strided":
        big_a = np.zeros((13, 80), np.float32)
        big_a[:, ::2] = a
        big_b = np.zeros((40, 33), np.float32)
        big_b[:, ::3] = b
        a_in, b_in = big_a[:, ::2], big_b[:, ::3]
        assert not (a_in.flags.c_contiguous or a_in.flags.f_contiguous)
    else:
        a_in, b_in = np.asarray(a, order=order), np.asarray(b, order=order)
    for beta in (None, bias):
        assert same_bits(matmul_2d(a_in, b_in, FP16, beta),
                         slow_reference(a, b, FP16, beta))


@pytest.mark.parametrize("order", ["C", "F", "strided"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("shape", [(23, 19), (40, 7)])     # rows of dot products or einsum
def test_widening_with_norms_and_quanta_in_chunks(order, axis, shape):
    rng = np.random.default_rng(axis)
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-140, 120, shape)).astype(
        np.float32)
    x = np.asarray(x, order="C" if order == "strided" else order)
    if order == "strided":
        x = np.repeat(x, 2, axis=1)[:, ::2]
    x[3] = 0.0                                              # an all-zero line either way
    x[:, 4] = -0.0
    for quanta in (False, True):
        with backend.use_tuning(widen_chunk=37):        # many chunks, lines crossing them
            wide, norms, line_q = widening.widen_with_norms(dev(x), "test", axis, quanta)
        assert wide.dtype == f64
        wide, norms = host(wide), host(norms)
        line_q = None if line_q is None else host(line_q)
        assert np.array_equal(wide, x.astype(np.float64))
        exact = np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=axis))
        assert np.allclose(norms, exact, rtol=1e-13, atol=0)
        assert (line_q is None) if not quanta else np.array_equal(
            line_q, host(line_quanta(dev(x), axis)))


def test_fp32_open_ends_agree_with_the_certificate():
    """certify_fp32_open (chunks, both outer-product forms) leaves open exactly the
    elements ``certify`` does not certify, with the same ends."""
    rng = np.random.default_rng(2)
    m, n = 37, 29
    approx = rng.standard_normal((m, n)) * 2.0 ** rng.integers(-30, 30, (m, n))
    approx[::3, ::4] = np.float64(np.float32(1.0)) + 2.0 ** -24          # fp32 ties
    approx[5] = 0.0
    rows = np.abs(rng.standard_normal(m)) * width_factor(40) * 2.0 ** 20
    cols = np.abs(rng.standard_normal(n))
    low, high, certified = map(host, certify(dev(approx), dev(rows[:, None]), dev(cols)))
    low, high, certified = low.copy(), high.copy(), certified.copy()
    for chunk, einsum_from in ((1 << 17, 1 << 15), (64, 1), (64, 1 << 30)):
        with backend.use_tuning(certificate_open_chunk=chunk, einsum_from=einsum_from):
            _assert_open_ends_match(approx, rows, cols, low, high, certified)


def _assert_open_ends_match(approx, rows, cols, low, high, certified):
    """certify_fp32_open gives certify's high array, and its open elements with their ends."""
    out = backend.xp.empty(approx.shape, f32)
    opened, low_open, high_open = map(host, certify_fp32_open(dev(approx), dev(rows), dev(cols),
                                                              out))
    assert same_bits(out, high)
    assert np.array_equal(opened, np.flatnonzero(~certified))
    assert same_bits(low_open, low.reshape(-1)[opened])
    assert same_bits(high_open, high.reshape(-1)[opened])


@pytest.mark.parametrize("recheck_share", [1, 16, 10 ** 9])
@pytest.mark.parametrize("chunk", [1 << 17, 64])
def test_fp32_open_ends_with_one_width_per_chunk(recheck_share, chunk):
    """The one-width-per-chunk pass (W = max row width * max column width), its elements
    taken again with their own widths (gathered, or the whole chunk where many are left):
    the same open elements, ends and high array as ``certify``; widths of very different
    sizes, ties, zeros."""
    rng = np.random.default_rng(21)
    m, n = 41, 33
    approx = rng.standard_normal((m, n)) * 2.0 ** rng.integers(0, 4, (m, n))
    rows = np.abs(rng.standard_normal(m)) * width_factor(300) * 2.0 ** rng.integers(0, 16, m)
    cols = np.abs(rng.standard_normal(n)) * 2.0 ** rng.integers(-2, 2, n)
    near = rng.random((m, n)) < 0.3           # 3 w beside an fp32 tie: w certifies, W not
    ties = 1.0 + 2.0 ** -24 + 2.0 ** -23 * rng.integers(0, 100, (m, n))
    approx[near] = (ties + 3 * rows[:, None] * cols)[near]
    approx[::7, ::5] = np.float64(np.float32(1.0)) + 2.0 ** -24          # fp32 ties
    approx[4] = 0.0
    approx[9, 3] = -0.0
    low, high, certified = map(host, certify(dev(approx), dev(rows[:, None]), dev(cols)))
    low, high, certified = low.copy(), high.copy(), certified.copy()
    one_width = host(certify(dev(approx), dev(np.full((m, 1), rows.max() * cols.max())),
                             dev(np.ones(n)))[2])
    assert 0 < (~certified).sum() < (~one_width).sum() - 100
    with backend.use_tuning(certificate_open_chunk=chunk, einsum_from=1,
                            recheck_share=recheck_share):
        _assert_open_ends_match(approx, rows, cols, low, high, certified)


def test_f_level_certificate_keeps_the_zero_pattern_near_underflow(monkeypatch):
    """Sums of -+1.25 * 2**-150 under a cancelling pair: rnd32 gives -+2**-149, the fp32 ends
    are -+2**-149 and -+0 (both rounding to the same fp16 and bf16 zero), so only a test
    of pre at both ends (nonzero, one sign) sends them to the exact step; the underflow
    counter then sees the general path's nonzero accumulators."""
    agree = _count_calls(monkeypatch, fast_matmul, "_f_agree")
    x = 2.0 ** -51
    a = np.float32([[x, -x, -2.0 ** -75, -2.0 ** -77], [x, -x, 2.0 ** -75, 2.0 ** -77]])
    b = np.float32([[x], [x], [2.0 ** -75], [2.0 ** -75]])
    for out_fmt in (FP16, BF16):
        with count_gradient_underflow() as fast, backward_pass():
            out = matmul_2d(a, b, out_fmt)
        assert same_bits(out, slow_reference(a, b, out_fmt))
        assert (fast.flushed, fast.nonzero, fast.values) == (2, 2, 2)
    assert agree


def test_line_quanta_divide_every_element():
    rng = np.random.default_rng(4)
    cases = [
        (rng.standard_normal((9, 14)) * 2.0 ** rng.integers(-149, 127, (9, 14))),
        rng.integers(-5, 6, (9, 14)) * 2.0 ** -140,                        # subnormals
        2.0 ** rng.integers(-149, 127, (9, 14)) * rng.choice([-1, 0, 1], (9, 14)),
        round_to(rng.standard_normal((9, 14)).astype(np.float32), "fp16"),
    ]
    for x in cases:
        with np.errstate(over="ignore"):
            x = np.where(np.isfinite(x), x, 1.0).astype(np.float32)
        x[2] = 0.0
        x[:, 3] = -0.0
        for axis in (0, 1):
            for arr in (x, np.asfortranarray(x)):
                q = host(line_quanta(dev(arr), axis))
                mantissa, exponent = np.frexp(q)
                assert np.all(mantissa == 0.5)                             # powers of two
                assert np.all(np.fmod(arr.astype(np.float64), np.expand_dims(q, axis)) == 0)
                reference = host(lowest_bit_exponent(dev(arr), axis))     # the general path's
                assert np.all((reference >= 2000) | (exponent - 1 >= reference))
                assert np.all(q[np.all(arr == 0, axis=axis)] == 1.0)


def test_note_counts_nonzeros_before_less_after():
    rng = np.random.default_rng(6)
    before = (rng.standard_normal(4000) * 2.0 ** rng.integers(-30, 20, 4000)).astype(np.float32)
    before[:50] = 0.0
    before[50:60] = -0.0
    before[60:65] = np.float32([np.nan, np.inf, -np.inf, np.nan, 2.0 ** -149])
    with np.errstate(over="ignore", invalid="ignore"):
        after = round_to(before, FP16)
    with count_gradient_underflow() as counts, backward_pass():
        rounded(dev(before), dev(after))
        rounded(dev(before.reshape(40, 100)), dev(after.reshape(40, 100)))
        rounded(dev(before), dev(before))
    nonzero = int(np.count_nonzero(before != 0))
    flushed = int(np.count_nonzero((before != 0) & (after == 0)))
    assert (counts.nonzero, counts.flushed, counts.values) == (3 * nonzero, 2 * flushed,
                                                                3 * before.size)


@pytest.mark.parametrize("fmt", ["fp16", "e5m2", "e4m3", "e4m3fnuz", "e2m1", "tf32"])
def test_round_to_small_arrays_take_the_same_bits_as_large_ones(fmt):
    """The magic kernel clips with maximum + minimum below 8192 elements and with np.clip
    above; every format's plan is resolved once per kind of call (flags and dtype)."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(20000) * 2.0 ** rng.integers(-150, 130, 20000))
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    x32[:4] = np.float32([np.nan, -np.inf, -0.0, 2.0 ** -149])
    for data in (x32, x32.astype(np.float64)):
        for flags in ({}, {"subnormals": False}, {"saturate": True}):
            with np.errstate(over="ignore", invalid="ignore"):
                whole = round_to(data, fmt, **flags)
                pieces = np.concatenate([round_to(part, fmt, **flags)
                                         for part in np.array_split(data, 40)])
            assert same_bits(whole, pieces), (fmt, flags, data.dtype)


def _sparse_row_case(rng, m, k, n):
    """Rows of a with few nonzeros (fired for few samples) against b with zeros on them:
    exact zero sums of every sign pattern, next to live sums of the same rows."""
    a = np.where(rng.random((m, k)) < 0.06, rng.standard_normal((m, k)), 0.0)
    a = np.where(rng.random((m, k)) < 0.5, a, -a).astype(np.float32)   # +-0 off the support
    b = np.where(rng.random((k, n)) < 0.5, rng.standard_normal((k, n)), 0.0).astype(np.float32)
    a[1] = -0.0                                   # an all-zero row of -0
    a[2, 5] = 3.0                                 # support {5}: b zero there in most columns
    a[2, :5] = -0.0
    a[2, 6:] = -0.0
    b[5, : n // 2] = 0.0
    b[:, [0, 1, 3]] = np.abs(b[:, [0, 1, 3]])
    b[5, 0] = -0.0                                # every product -0: row 2 in column 0,
    #                                               row 1 in column 3 ...
    b[k - 1, 1] = -0.0                            # ... one +0 product, off the sign probes
    a[3] = np.float32(1.0)                        # a dense row: the gathered route
    a[4, :20] = np.float32(1.0)                   # more nonzeros than the support test takes
    a[4, 20:] = 0.0
    b[:20, 2] = 0.0
    return a, b, rng.standard_normal(n).astype(np.float32)


@pytest.fixture
def support_test_always():
    """The exact step's support test tried however few products the zero sums hold."""
    with backend.use_tuning(sparse_from=0):
        yield


@pytest.mark.parametrize("a_order", ["C", "F"])
@pytest.mark.parametrize("b_order", ["C", "F"])
def test_zero_sums_of_sparse_rows_take_the_ieee_sign(a_order, b_order, monkeypatch,
                                                      support_test_always):
    """The support test of the exact step (every product zero where b vanishes on a sparse
    row's nonzeros; -0 exactly when every product is -0) against the reference, in every
    operand order, output format and with a bias; the test must be taken."""
    taken = _count_calls(monkeypatch, open_elements, "_zero_sums_of_sparse_rows")
    rng = np.random.default_rng(11)
    for m, k, n in ((9, 40, 12), (14, 129, 7)):
        a, b, bias = _sparse_row_case(rng, m, k, n)
        a_in, b_in = np.asarray(a, order=a_order), np.asarray(b, order=b_order)
        for out_fmt in (FP32, FP16, BF16):
            for beta in (None, bias):
                assert same_bits(matmul_2d(a_in, b_in, out_fmt, beta),
                                 slow_reference(a, b, out_fmt, beta)), (m, k, n, out_fmt)
        out = matmul_2d(a_in, b_in, FP32)
        assert np.signbit(out[1, 3]) and np.signbit(out[2, 0]) and out[2, 0] == 0
        assert not np.signbit(out[1, 1]) and out[1, 1] == 0
    assert taken


@pytest.mark.parametrize("a_order", ["C", "F"])
def test_zero_sums_of_sparse_rows_against_unsigned_b(a_order, monkeypatch,
                                                    support_test_always):
    """b without a sign bit (relu activations): the sign of a zero sum from a's row alone,
    -0 exactly where every a_ik has its sign bit; rows of -0 and negative values, rows with
    one +0, against the reference; the shortcut must be taken."""
    unsigned = []
    original = open_elements._has_sign_bits
    monkeypatch.setattr(open_elements, "_has_sign_bits",
                        lambda x: original(x) or unsigned.append(1) or False)
    rng = np.random.default_rng(13)
    for m, k, n in ((9, 40, 12), (14, 129, 7)):
        a, b, bias = _sparse_row_case(rng, m, k, n)
        b = np.abs(b)                                   # no sign bit, zeros +0
        a[2, 5] = -3.0                                  # row 2: every a_ik with its sign bit
        a[5] = -0.0
        a[5, [1, 7]] = np.float32([-2.0, -0.5])         # the same, two nonzeros
        a[6] = np.where(np.signbit(a[5]), a[5], -a[5])
        a[6, 3] = 0.0                                   # one +0 in row 6: +0 sums
        b[[1, 7], : n // 2] = 0.0
        a_in = np.asarray(a, order=a_order)
        for out_fmt in (FP32, FP16):
            for beta in (None, bias):
                assert same_bits(matmul_2d(a_in, b, out_fmt, beta),
                                 slow_reference(a, b, out_fmt, beta)), (m, k, n, out_fmt)
        out = matmul_2d(a_in, b, FP32)
        assert np.signbit(out[5, 0]) and out[5, 0] == 0 and np.signbit(out[2, 1])
        assert not np.signbit(out[6, 0]) and out[6, 0] == 0
    assert unsigned


def test_exact_rows_gate_reads_first_lines_before_the_quanta(monkeypatch):
    """Narrow data (fp16 values) whose output outweighs the operands take the exact rows at
    the default gate, their quanta taken with the widening; fp32 data are turned away by
    a's first row before any quanta (counted where the widening turns its lines' patterns
    into quanta: once a request, on the NumPy path and the fused kernel's alike)."""
    patterns = _count_calls(monkeypatch, widening, "quanta_from_patterns")
    taken = _count_calls(monkeypatch, fast_matmul, "_certify_exact_rows")
    rng = np.random.default_rng(12)
    a = round_to(rng.standard_normal((64, 16)).astype(np.float32), "fp16")
    b = round_to(rng.standard_normal((16, 48)).astype(np.float32), "fp16")
    wide = rng.standard_normal((64, 16)).astype(np.float32)
    for out_fmt in (FP32, FP16):
        assert same_bits(matmul_2d(a, b, out_fmt), slow_reference(a, b, out_fmt))
    assert patterns and taken
    patterns.clear()
    taken.clear()
    for out_fmt in (FP32, FP16):
        assert same_bits(matmul_2d(wide, b, out_fmt),
                         slow_reference(wide, b, out_fmt))
    assert not patterns and not taken
