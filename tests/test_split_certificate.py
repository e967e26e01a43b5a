"""The split certificate (``certificate.split_certify``) against the integer-limb exact sum,
the fast matmul's exact routes with the certificate switched off, bit for bit, the exact
step on ties and cancellations, and the signs of exact zero sums."""
from __future__ import annotations

import numpy as np
import pytest

from fpsim import backend
from fpsim.exact import fast_matmul, open_elements
from fpsim.exact.certificate import split_certify
from fpsim.exact.exact_dots import exact_matmul
from fpsim.exact.sums import round_to_odd_sum
from fpsim.formats import FP16, FP32
from fpsim.rounding import round_to

from bit_patterns import host, same_bits  # noqa: E402
from test_fastpaths import adversarial  # noqa: E402

f32, f64, i64 = backend.xp.float32, backend.xp.float64, backend.xp.int64


def exact_fp32(terms: np.ndarray) -> np.ndarray:
    """Host float32: the integer-limb sum of each row of the host ``terms``, rounded to odd,
    then cast."""
    sums = host(round_to_odd_sum(backend.asarray(terms, f64)))
    with np.errstate(over="ignore"):
        return sums.astype(np.float32)


def slow_reference(a, b, out_fmt, bias=None):
    """Host float32, test_fastpaths.slow_reference on host arrays for every backend: every
    element summed by integer limbs -> fp32 (nearest even) -> + bias in float32 -> one
    rounding to out_fmt (round_to)."""
    acc, _ = exact_matmul(backend.asarray(a[None], f32), backend.asarray(b[None], f32), FP32,
                          force_fallback=True)
    with np.errstate(over="ignore", invalid="ignore"):
        acc = host(acc)[0].astype(np.float32)
        if bias is not None:
            acc = acc + bias
        return round_to(acc, out_fmt)


def matmul_2d(a, b, out_fmt, bias=None):
    """fast_matmul.matmul_2d on backend arrays made from the host ones (their layouts as
    the backend keeps them), its float32 result brought to the host (None stays None)."""
    out = fast_matmul.matmul_2d(backend.asarray(a, f32), backend.asarray(b, f32), out_fmt,
                                None if bias is None else backend.asarray(bias, f32))
    if out is not None:
        assert out.dtype == f32
    return None if out is None else host(out)


def product_rows(rng, rows: int, k: int, kind: str) -> np.ndarray:
    """Rows of exact products of float32 values, built to cancel, tie and vanish."""
    scale = {"normal": (0, 1), "wide": (-60, 60), "tiny": (-149, -120), "huge": (60, 120)}[kind]
    a = rng.standard_normal((rows, k)) * 2.0 ** rng.integers(*scale, (rows, k))
    b = rng.standard_normal((rows, k)) * 2.0 ** rng.integers(-10, 10, (rows, k))
    with np.errstate(over="ignore", under="ignore"):
        a, b = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    terms = a * b
    half = k // 2
    terms[0, half:2 * half] = -terms[0, :half]                  # an exact zero (+0)
    terms[1, :] = -0.0                                          # all -0: -0
    terms[2, :] = 0.0
    terms[2, 0], terms[2, 1 % k] = 1.0, 2.0 ** -24              # an fp32 tie (k >= 2)
    terms[3, :] = 0.0
    terms[3, 0], terms[3, 1 % k] = 1.0, 2.0 ** -60              # just above a representable sum
    terms[4, half:2 * half] = -terms[4, :half]
    terms[4, -1] = 2.0 ** -200 if k % 2 else terms[4, -1]       # cancels down to a tiny rest
    terms[5, :] = 0.0
    terms[5, 0] = 1.0
    if k >= 3:                                                  # a tie hidden in low parts
        terms[5, 1], terms[5, 2] = 2.0 ** -24 + 2.0 ** -70, -(2.0 ** -70)
    return terms


@pytest.mark.parametrize("kind", ["normal", "wide", "tiny", "huge"])
@pytest.mark.parametrize("k", [1, 2, 7, 300])
def test_split_certify_agrees_with_the_exact_sum_wherever_it_answers(kind, k):
    rng = np.random.default_rng(k * 7 + len(kind))
    terms = product_rows(rng, 64, k, kind)
    exact_abs = np.abs(terms).sum(axis=1) * (1 + 2 * k * 2.0 ** -52)     # >= sum |p|
    for upper in (exact_abs, exact_abs * 3.75, exact_abs * 2.0 ** 20):   # loose bounds too
        with np.errstate(over="ignore"):
            values, known = split_certify(backend.asarray(terms, f64),
                                          backend.asarray(upper, f64))
        assert known.dtype == backend.xp.bool_ and values.dtype == f32
        values, known = host(values), host(known)
        assert same_bits(values[known], exact_fp32(terms[known]))
        assert known[1] and known[2]            # exact sums: known without the limbs
        assert k < 3 or not known[5]            # a tie with nonzero low parts: declined
        assert known.mean() > 0.9               # generic rows: certified


@pytest.mark.parametrize("kind", ["fp16", "wide", "tiny", "ints"])
def test_matmul_2d_exact_route_alone_matches_the_reference(kind, monkeypatch):
    """With the split certificate answering nothing, every element it would take goes
    through the integer limbs: the same bits as the reference."""
    def certify_nothing(terms, upper):       # the engine's arrays, on any backend
        return (backend.xp.zeros(terms.shape[0], backend.xp.float32),
                backend.xp.zeros(terms.shape[0], bool))

    monkeypatch.setattr(open_elements, "split_certify", certify_nothing)
    rng = np.random.default_rng(len(kind))
    for m, k, n in ((5, 1, 4), (9, 2, 6), (12, 17, 8)):
        a, b, bias = adversarial(rng, m, k, n, kind)
        for out_fmt in (FP32, FP16):
            for beta in (None, bias):
                with np.errstate(over="ignore", invalid="ignore"):
                    fast = matmul_2d(a, b, out_fmt, beta)
                assert same_bits(fast, slow_reference(a, b, out_fmt, beta)), (m, k, n)


def test_matmul_2d_both_gather_layouts_give_the_same_bits():
    """The exact step gathers products k-major for a C-ordered b and row-major otherwise."""
    rng = np.random.default_rng(11)
    a, b, bias = adversarial(rng, 40, 64, 30, "fp16")
    results = []
    for b_layout in (np.ascontiguousarray(b), np.asfortranarray(b)):
        for a_layout in (np.ascontiguousarray(a), np.asfortranarray(a)):
            results.append(matmul_2d(a_layout, b_layout, FP16, bias))
    assert all(same_bits(r, results[0]) for r in results)
    assert same_bits(results[0], slow_reference(a, b, FP16, bias))


def _one_by_one_cases(rng):
    """(a, b) float32 with a[e] . b[:, e] built to tie, cancel, vanish and overflow: fp32
    ties with a remainder far below float64's last bit on either side (nearest-even alone
    would round them the wrong way), exact ties, sums with an odd last bit, zero sums of
    every sign pattern, subnormal and huge products, then random rows of every scale."""
    k = 6
    special = [
        ([1, 2.0 ** -24, 2.0 ** -40, 0, 0, 0], [1, 1, 2.0 ** -40, 0, 0, 0]),     # tie + 2**-80
        ([1, 2.0 ** -24, 2.0 ** -40, 0, 0, 0], [1, 1, -2.0 ** -40, 0, 0, 0]),    # tie - 2**-80
        ([-1, -2.0 ** -24, 2.0 ** -40, 0, 0, 0], [1, 1, 2.0 ** -40, 0, 0, 0]),   # -tie + rest
        ([1, 2.0 ** -24, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]),                      # an exact tie
        ([1, 2.0 ** -26, 2.0 ** -26, 2.0 ** -40, 0, 0], [1, 2.0 ** -26, 2.0 ** -26, 2.0 ** -40,
                                                         0, 0]),                 # odd last bit
        ([-0.0] * k, [1.0] * k),                                                 # every -0
        ([-0.0, 0.0, -0.0, -0.0, -0.0, -0.0], [1.0] * k),                        # one +0
        ([3, -3, 0, 0, 0, 0], [2, 2, 0, 0, 0, 0]),                               # cancels: +0
        ([2.0 ** -149, 2.0 ** -149, 0, 0, 0, 0], [2.0 ** -149, -2.0 ** -149, 0, 0, 0, 0]),
        ([2.0 ** 127, 2.0 ** 127, 0, 0, 0, 0], [2.0 ** 100, 1, 0, 0, 0, 0]),     # beyond fp32
    ]
    a = [row for row, _ in special]
    b = [col for _, col in special]
    for scale in ((0, 1), (-60, 60), (-149, -120), (60, 120)):
        for _ in range(6):
            a.append(rng.standard_normal(k) * 2.0 ** rng.integers(*scale, k))
            b.append(rng.standard_normal(k) * 2.0 ** rng.integers(-10, 10, k))
    fp16 = round_to(rng.standard_normal((8, k)).astype(np.float32), "fp16")
    with np.errstate(over="ignore", under="ignore"):
        a = np.concatenate([np.float32(a), fp16])
        b = np.concatenate([np.float32(b), fp16[::-1]]).T
    return a, b


@pytest.mark.parametrize("order", ["C", "F"])
def test_exact_step_on_ties_cancellations_and_zero_signs(order):
    """``exact_elements`` (the exact step for open elements) gives each element's exact sum
    rounded once to fp32: the integer-limb sum rounded to odd, then cast, zero signs
    included, on sums built to tie, cancel, vanish and overflow."""
    a, b = _one_by_one_cases(np.random.default_rng(17))
    a, b = np.asarray(a, order=order), np.asarray(b, order=order)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    every = np.arange(a.shape[0])
    terms = a64 * b64.T
    with np.errstate(over="ignore"):
        got = open_elements.exact_elements(
            backend.asarray(a, f32), backend.asarray(b, f32),
            backend.asarray(np.sqrt((a64 * a64).sum(axis=1)), f64),
            backend.asarray(np.sqrt((b64 * b64).sum(axis=0)), f64),
            backend.asarray(every, i64), backend.asarray(every, i64),
            backend.asarray(terms.sum(axis=1), f64))
    assert same_bits(got, exact_fp32(terms))


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("b_signs", ["mixed", "none"])
def test_exact_zero_signs_follow_the_sign_bits(order, b_signs):
    """exact_zero_signs: -0 exactly where signbit(a_ik) != signbit(b_kj) for every k, through
    b with and without sign bits, for every element."""
    rng = np.random.default_rng(31)
    m, k, n = 12, 37, 9
    a = rng.choice(np.float32([-0.0, 0.0, -1.5, 2.0]), (m, k), p=[0.4, 0.2, 0.2, 0.2])
    a[:4] = -np.abs(a[:4])                          # rows of sign bits only
    b = rng.choice(np.float32([-0.0, 0.0, 3.0, -0.25]), (k, n))
    b[:, :3] = -np.abs(b[:, :3])
    b[:, 3:5] = np.abs(b[:, 3:5])
    if b_signs == "none":
        b = np.abs(b)
    a, b = np.asarray(a, order=order), np.asarray(b, order=order)
    rows, cols = (x.reshape(-1) for x in np.meshgrid(np.arange(m), np.arange(n), indexing="ij"))
    expected = np.all(np.signbit(a)[:, :, None] != np.signbit(b)[None], axis=1).reshape(-1)
    assert expected.any() and not expected.all()
    for source in (backend.asarray(a, f32), backend.asarray(a, f64)):
        got = open_elements.exact_zero_signs(source, backend.asarray(b, f32),
                                             backend.asarray(rows, i64),
                                             backend.asarray(cols, i64))
        assert got.dtype == f32
        got = host(got)
        assert np.all(got == 0)
        assert np.array_equal(np.signbit(got), expected)
