"""Every fast path of the engine against the slow exact path it replaces, bit for bit, on
adversarial data: ties, cancellation, exact zeros of both signs, subnormals, overflow, inf/NaN."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import nn
from fpsim.autograd import Tensor, use_policy
from fpsim.autograd import ops_matmul
from fpsim.exact import accumulation
from fpsim.exact.exact_dots import exact_matmul
from fpsim.exact.fast_matmul import matmul_2d, round_out
from fpsim.exact.underflow import count_gradient_underflow
from fpsim.formats import BF16, FP16, FP32, get
from fpsim.rounding import round_to
from bit_patterns import same_bits

OUT_FORMATS = [FP32, FP16, BF16, get("e4m3"), get("e5m2")]


def slow_reference(a, b, out_fmt, bias=None):
    """The general path with every element summed by integer limbs: exact sum -> fp32
    (nearest even) -> + bias in float32 -> one rounding to out_fmt (round_to)."""
    acc, _ = exact_matmul(a[None], b[None], FP32, force_fallback=True)
    with np.errstate(over="ignore", invalid="ignore"):
        acc = acc[0].astype(np.float32)
        if bias is not None:
            acc = acc + bias
        return round_to(acc, out_fmt)


def adversarial(rng, m, k, n, kind):
    """float32 (a, b, bias) built to hit every corner of the certificate."""
    if kind == "fp16":          # low-precision data: exact fp32 ties are common
        a = round_to(rng.standard_normal((m, k)).astype(np.float32) * 4, "fp16")
        b = round_to(rng.standard_normal((k, n)).astype(np.float32) / 4, "fp16")
    elif kind == "wide":        # exponents spread over most of float32
        a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-60, 60, (m, k))
        b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-60, 60, (k, n))
    elif kind == "tiny":        # float32 subnormal inputs and results that underflow fp32
        a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-149, -120, (m, k))
        b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-30, 5, (k, n))
    elif kind == "huge":        # sums beyond fp32 and fp16 range: overflow to inf
        a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(40, 70, (m, k))
        b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(40, 70, (k, n))
    else:                       # "ints": small integers, exact products and sums, many ties
        a = rng.integers(-3, 4, (m, k)) * 2.0 ** rng.integers(-2, 3, (m, k))
        b = rng.integers(-3, 4, (k, n)) * 2.0 ** rng.integers(-26, 3, (k, n))
    with np.errstate(over="ignore", under="ignore"):
        a, b = a.astype(np.float32), b.astype(np.float32)
    if k >= 2:
        a[0, : k // 2 * 2] = np.repeat(a[0, ::2][: k // 2], 2)   # row 0: pairs x, x
        b[: k // 2 * 2, 0] = np.repeat(b[::2, 0][: k // 2], 2)
        b[1: k // 2 * 2: 2, 0] *= -1                             # column 0: y, -y: s = 0
        b[0, 1 % n], b[1, 1 % n] = 1.0, 2.0 ** -24                # 1 + 2**-24: an fp32 tie
        a[1 % m, :2] = 1.0
    if k >= 2 and m > 3 and n > 3:                       # disjoint supports, as after relu:
        a[m - 2, : k // 2] = -0.0                        # every product zero, no zero line
        b[k // 2:, n - 2] = 0.0
        b[k // 2:, n - 3] = -0.0                         # and every product -0 with row m-2
        b[: k // 2, n - 3] = np.abs(b[: k // 2, n - 3])
        a[m - 2, k // 2:] = -np.abs(a[m - 2, k // 2:])
    a[m - 1, :] = -0.0                                           # a zero row of -0
    b[:, n - 1] = rng.choice(np.float32([0.0, -0.0]), k)         # a zero column, mixed signs
    if m > 2:
        a[2, :] = np.float32(0.0)
        a[2, 0] = -0.0
        b[0, :] = np.abs(b[0, :]) + 1                            # all -0 products vs +0
    bias = rng.standard_normal(n).astype(np.float32) * 2.0 ** float(rng.integers(-30, 10))
    bias[0] = -0.0
    bias[n - 1] = 0.0
    return a, b, bias


@pytest.mark.parametrize("kind", ["fp16", "wide", "tiny", "huge", "ints"])
@pytest.mark.parametrize("seed", [0, 64, 10 ** 9])
def test_matmul_2d_matches_the_exact_fallback(kind, seed):
    rng = np.random.default_rng(len(kind) * 1000 + seed % 997)
    for trial in range(6):
        m, k, n = (int(v) for v in rng.integers(3, 20, 3))
        k = [1, 2, k, 3 * k][trial % 4]
        a, b, bias = adversarial(rng, m, k, n, kind)
        for out_fmt in OUT_FORMATS:
            for use_bias in (False, True):
                beta = bias if use_bias else None
                with np.errstate(over="ignore", invalid="ignore"):
                    fast = matmul_2d(a, b, out_fmt, beta)
                assert same_bits(fast, slow_reference(a, b, out_fmt, beta)), \
                    (kind, trial, out_fmt.name, use_bias)


def test_matmul_2d_exact_zeros_that_cancel_without_all_zero_products():
    """Sums that cancel to exactly zero while no element's products are all zero: the
    integer-limb route must fill every element (it once returned uninitialised memory when no
    zero-approx element had all-zero products)."""
    a, b = np.float32([[1.0, 1.0]]), np.float32([[1.0], [-1.0]])
    assert same_bits(matmul_2d(a, b, FP32), np.float32([[0.0]]))
    rng = np.random.default_rng(5)
    a = rng.integers(-3, 4, (300, 64)).astype(np.float32)
    b = rng.integers(-3, 4, (64, 300)).astype(np.float32)
    exact = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.float32)
    assert (exact == 0).sum() > 100
    for out_fmt in (FP32, FP16):
        assert same_bits(matmul_2d(a, b, out_fmt), slow_reference(a, b, out_fmt))


def test_matmul_2d_bias_cancels_the_accumulator():
    # pre = fl32(acc + bias) = 0 exactly: +0 under round to nearest, whatever the signs.
    a = np.float32([[1.0, 2.0 ** -30], [-3.0, 0.0]])
    b = np.float32([[1.0], [1.0]])
    bias = np.float32([-1.0])
    for out_fmt in OUT_FORMATS:
        assert same_bits(matmul_2d(a, b, out_fmt, bias), slow_reference(a, b, out_fmt, bias))


def test_matmul_2d_leaves_non_finite_and_empty_inputs_to_the_general_path():
    a = np.ones((2, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    for bad in (np.inf, -np.inf, np.nan):
        a_bad = a.copy()
        a_bad[1, 2] = bad
        assert matmul_2d(a_bad, b, FP32) is None and matmul_2d(b.T, a_bad.T, FP32) is None
        assert matmul_2d(a, b, FP16, np.float32([0, bad])) is None
    assert matmul_2d(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32), FP32) is None


def test_accumulation_matmul_fast_and_general_paths_agree(monkeypatch):
    rng = np.random.default_rng(5)
    a, b, _ = adversarial(rng, 9, 40, 7, "fp16")
    a3 = np.stack([a, -a[::-1], a * 2])                  # (3, 9, 40): rows stacked into M
    cases = [(a, b), (a3, b), (a[0], b), (a, b[:, 0]), (a3, b[:, 1]), (a[1], b[:, 2])]
    with np.errstate(over="ignore", invalid="ignore"):
        fast = [accumulation.matmul(x, y, out_fmt=f) for x, y in cases for f in OUT_FORMATS]
        monkeypatch.setattr(accumulation, "matmul_2d", lambda *args, **kw: None)
        slow = [accumulation.matmul(x, y, out_fmt=f) for x, y in cases for f in OUT_FORMATS]
    assert all(same_bits(x, y) for x, y in zip(fast, slow))


@pytest.mark.parametrize("fmt", OUT_FORMATS)
@pytest.mark.parametrize("n", [9, 40000])
def test_round_out_is_round_to(fmt, n):
    # Any float32 but a signalling NaN (IEEE arithmetic and float64 casts make none).
    rng = np.random.default_rng(n)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(n) * 2.0 ** rng.integers(-150, 129, n)).astype(np.float32)
    quiet_nans = np.uint32([0x7FC00001, 0xFFD00000, 0x7FFFFFFF]).view(np.float32)
    x[:9] = [np.inf, -np.inf, np.nan, -0.0, 65520.0, 2.0 ** -25, *quiet_nans]
    with np.errstate(over="ignore", invalid="ignore"):
        assert same_bits(round_out(x, fmt), round_to(x, fmt))


def _mlp_run(policy, sizes, batch, seed, counting):
    rng = np.random.default_rng(seed)
    with use_policy(policy):
        model = nn.MLP(sizes, rng=seed)
    x = (rng.standard_normal((batch, sizes[0])) * 2.0 ** rng.integers(-20, 4)).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    with use_policy(policy), count_gradient_underflow() as counts:
        out = model(Tensor(x))
        loss = ag.cross_entropy(out, labels)
        if counting:
            loss.backward(np.float32(2.0 ** -10))
    if not counting:
        with use_policy(policy):
            loss.backward()
    grads = [p.grad.data.copy() for p in model.parameters()]
    return out.data, loss.data, grads, (counts.flushed, counts.nonzero, counts.values)


@pytest.mark.parametrize("policy", ["32-true", "16-mixed", "bf16-mixed", "16-true"])
@pytest.mark.parametrize("counting", [False, True])
def test_training_step_bits_with_and_without_fast_paths(policy, counting, monkeypatch):
    fast = _mlp_run(policy, [12, 33, 17, 5], 23, 3, counting)
    monkeypatch.setattr(accumulation, "matmul_2d", lambda *args, **kw: None)
    monkeypatch.setattr(ops_matmul, "_fused_linear", lambda *args, **kw: None)
    slow = _mlp_run(policy, [12, 33, 17, 5], 23, 3, counting)
    assert same_bits(fast[0], slow[0]) and same_bits(fast[1], slow[1])
    assert all(same_bits(x, y) for x, y in zip(fast[2], slow[2]))
    assert fast[3] == slow[3]


def test_round_out_keeps_every_quiet_nan_as_round_to_does():
    patterns = np.arange(1 << 22, dtype=np.uint32) | np.uint32(0x7FC00000)
    x = np.concatenate([patterns, patterns | np.uint32(1 << 31)]).view(np.float32)
    with np.errstate(invalid="ignore"):
        for fmt in (FP32, FP16):
            small = [round_out(part, fmt) for part in np.split(x, 8192)]   # the cast path
            assert same_bits(np.concatenate(small), round_to(x, fmt))


def _counts(fn):
    from fpsim.exact.observers import backward_pass
    with count_gradient_underflow() as counts, backward_pass(), np.errstate(over="ignore"):
        out = fn()
    return out, (counts.flushed, counts.nonzero, counts.values)


@pytest.mark.parametrize("kind", ["tiny", "fp16", "ints"])
def test_fast_matmul_reports_the_same_underflow_as_the_general_path(kind, monkeypatch):
    rng = np.random.default_rng(21)
    a, b, _ = adversarial(rng, 11, 30, 9, kind)
    # 2**-75 * 2**-75 = 2**-150: an fp32 tie rounding to +0, ends at 0 and 2**-149 (both give
    # fp16 +0), so only the exact step knows the accumulator is zero, not 2**-149.
    a[3, :], b[:, 3] = 0.0, 0.0
    a[3, 0], b[0, 3] = 2.0 ** -75, 2.0 ** -75
    cases = [(a, b, f) for f in OUT_FORMATS]
    fast = [_counts(partial(accumulation.matmul, x, y, out_fmt=f)) for x, y, f in cases]
    monkeypatch.setattr(accumulation, "matmul_2d", lambda *args, **kw: None)
    slow = [_counts(partial(accumulation.matmul, x, y, out_fmt=f)) for x, y, f in cases]
    for (out_fast, count_fast), (out_slow, count_slow) in zip(fast, slow):
        assert same_bits(out_fast, out_slow) and count_fast == count_slow


def test_round_array_small_fp16_nans_follow_round_to():
    from fpsim.autograd.numerics import round_array
    from fpsim.formats import FP16
    from fpsim.rounding import round_to

    bits = np.array([0x7F800001, 0xFF812345, 0x7FC00001, 0x7FA00000, 0x3F800000], np.uint32)
    x32 = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        x64 = x32.astype(np.float64)
    for x in (x32, x64):
        ours = round_array(x, FP16)
        expected = round_to(x, FP16).astype(np.float32)
        assert np.array_equal(ours.view(np.uint32), expected.view(np.uint32))


def test_relu_gradient_mask_is_np_where_bit_for_bit():
    """relu's backward (an AND with a 0 / all-ones mask) gives ``np.where(y <= 0, 0, g)``'s
    bits for every pairing of special values: signed zeros, subnormals, inf, NaN payloads."""
    from fpsim.autograd.ops_elementwise import _zero_where_nonpositive

    specials = np.array([-np.inf, -1.5, -2.0 ** -149, -0.0, 0.0, 2.0 ** -149, 1.0, 65504.0,
                         np.inf, np.nan, -np.nan], np.float32)
    specials = np.concatenate([specials, np.uint32([0x7FC01234, 0xFFA00001]).view(np.float32)])
    d, g = np.meshgrid(specials, specials)
    rng = np.random.default_rng(3)
    d2 = rng.standard_normal((64, 33)).astype(np.float32)
    g2 = rng.standard_normal((64, 33)).astype(np.float32)
    for x, grad in ((d, g), (d2, g2), (d2.T, g2.T)):
        want = np.where(x <= 0, np.float32(0), grad)
        np.testing.assert_array_equal(_zero_where_nonpositive(x, grad).view(np.uint32),
                                      want.view(np.uint32))
