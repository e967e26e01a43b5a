"""The exact model's batched fast path (``fast_matmul.matmul_batched``: a stack of products
folded into one 2-D certificate) against the general path, bit for bit: adversarial blocks
(ties, cancellation, signed zeros of zero lines and disjoint supports, subnormal and
overflowing sums, one block needing the exact step, inf/NaN in one block only), fp16 and
bf16 data through exact rows, K = 1, empty stacks, transposed and broadcast operands, every
certificate branch forced by the speed settings, and the count of open elements."""
from __future__ import annotations

import numpy as np
import pytest

from fpsim import backend
from fpsim.autograd import Tensor, use_policy
from fpsim.exact import accumulation, fast_matmul, product_count
from fpsim.exact.certificate import certify_fp32_open, width_factor
from fpsim.exact.exact_dots import exact_matmul
from fpsim.formats import BF16, FP16, FP32, get
from fpsim.rounding import round_to

from bit_patterns import host, same_bits  # noqa: E402
from test_fastpaths import adversarial  # noqa: E402

f32, f64 = backend.xp.float32, backend.xp.float64
OUT_FORMATS = [FP32, FP16, BF16, get("e4m3")]
KINDS = ["fp16", "wide", "tiny", "huge", "ints"]

#: speed settings that force each branch: exact rows tried everywhere; small chunks that
#: cross blocks, with the one-width pass and its gathered or whole-chunk recheck; the
#: broadcast outer product without the one-width pass; the sparse zero-sum test always
FORCED = [dict(exact_min_saving=-10 ** 9),
          dict(certificate_open_chunk=96, einsum_from=1, recheck_share=1),
          dict(certificate_open_chunk=96, einsum_from=1, recheck_share=10 ** 9),
          dict(certificate_open_chunk=64, einsum_from=1 << 30, widen_chunk=29),
          dict(sparse_from=1, support=16, sums_chunk=50)]


def dev(x):
    return backend.asarray(np.asarray(x), f32)


def general(a3, b3, out_fmt):
    """Host float32: every element by integer limbs (the general path's fallback forced)
    -> fp32 -> one rounding to out_fmt."""
    acc, _ = exact_matmul(dev(a3), dev(b3), FP32, force_fallback=True)
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to(host(acc).astype(np.float32), out_fmt)


def batched(a3, b3, out_fmt):
    """matmul_batched on backend arrays (transposed views stay views), result on the host."""
    out = fast_matmul.matmul_batched(_as_backend(a3), _as_backend(b3), out_fmt)
    return None if out is None else host(out)


def _as_backend(x):
    """A host stack as a backend array keeping its per-matrix layout (a transposed view
    becomes the transpose of a C-ordered array)."""
    if not x.flags.c_contiguous and np.swapaxes(x, 1, 2).flags.c_contiguous:
        return backend.xp.swapaxes(dev(np.swapaxes(x, 1, 2)), 1, 2)
    return dev(x)


def stack(rng, blocks, m, k, n, kinds):
    """(a3, b3): one adversarial product per block, kinds taking turns (blocks of very
    different widths side by side)."""
    pairs = [adversarial(rng, m, k, n, kinds[i % len(kinds)])[:2] for i in range(blocks)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def transposed(x):
    """The same stack as a view of its per-matrix transposes (attention's k^T, a^T @ g)."""
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, 1, 2)), 1, 2)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("forced", [None] + FORCED)
def test_batched_path_matches_the_limb_sums(kind, forced):
    """Each kind of block beside blocks of every other kind, both operands as stored
    matrices and as transposed views, every output format, every forced branch."""
    rng = np.random.default_rng(KINDS.index(kind) + 7)
    kinds = [kind] + [other for other in KINDS if other != kind]
    with backend.use_tuning(**(forced or {})):
        for blocks, m, k, n in ((5, 9, 12, 7), (3, 6, 33, 10), (4, 5, 2, 4)):
            a3, b3 = stack(rng, blocks, m, k, n, kinds)
            for out_fmt in OUT_FORMATS:
                want = general(a3, b3, out_fmt)
                for a_in, b_in in ((a3, b3), (transposed(a3), transposed(b3))):
                    with np.errstate(over="ignore", invalid="ignore"):
                        got = batched(a_in, b_in, out_fmt)
                    assert same_bits(got, want), (kind, forced, blocks, m, k, n, out_fmt)


def test_one_block_needing_the_exact_step():
    """Ties and cancellations in one block only: its elements reach the exact step (counted),
    the other blocks are certified; the bits are the limb sums'."""
    rng = np.random.default_rng(11)
    a3 = rng.standard_normal((4, 6, 8)).astype(np.float32)
    b3 = rng.standard_normal((4, 8, 5)).astype(np.float32)
    a3[2, :, :3] = np.float32([1.0, 2.0 ** -24, 2.0 ** -48])          # 1 + 2**-24 (+ tiny)
    b3[2, :3, :] = 1.0
    a3[2, :, 3:] = 0.0
    a3[2, 1, 2] = -2.0 ** -48                                         # an exact fp32 tie
    a3[2, 3, :4] = np.float32([2.0 ** 30, 1.0, -2.0 ** 30, 2.0 ** -30])   # cancellation
    with product_count.count_products() as counts:
        got = batched(a3, b3, FP32)
    assert same_bits(got, general(a3, b3, FP32))
    assert counts.fast == 4 and counts.elements == 4 * 6 * 5
    assert 0 < counts.exact <= counts.open <= 6 * 5
    assert counts.general == 0


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_values_in_one_block_take_the_general_path(bad):
    """inf or NaN in one block: the fast path declines (None) and accumulation.matmul gives
    the general path's IEEE results in that block and the exact ones elsewhere."""
    rng = np.random.default_rng(3)
    a3, b3 = stack(rng, 3, 5, 6, 4, ["fp16", "ints"])
    a3[1, 2, 3] = bad
    b3[2, 0, 1] = 0.0
    assert batched(a3, b3, FP16) is None
    with np.errstate(invalid="ignore"), product_count.count_products() as counts:
        got = host(accumulation.matmul(dev(a3), dev(b3), out_fmt=FP16))
    assert same_bits(got, general(a3, b3, FP16))
    assert counts.general == 3 and counts.fast == 0


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_narrow_data_takes_exact_rows_in_every_block(kind, monkeypatch):
    """fp16 and bf16 operands (attention's q, k, weights and v): the blocks' rows are exact
    float64 sums, taken by the second certificate (spied), no element left open."""
    taken = []
    original = fast_matmul._certify_exact_rows

    def spy(*args):
        taken.append(args[-1].count)
        return original(*args)

    monkeypatch.setattr(fast_matmul, "_certify_exact_rows", spy)
    rng = np.random.default_rng(5)
    a3 = round_to(rng.standard_normal((8, 32, 32)).astype(np.float32), kind)
    b3 = round_to(rng.standard_normal((8, 32, 16)).astype(np.float32) * 2.0 ** -20, kind)
    a3[3, :, 5:] = 0.0                                    # a causal mask's zeros
    a3[4, 7] = -0.0                                       # a zero row of -0 in one block
    b3[6, :, 2] = -0.0                                    # a zero column of -0 in another
    with backend.use_tuning(exact_min_saving=-10 ** 9), \
            product_count.count_products() as counts:
        for out_fmt in (FP32, FP16, BF16):
            assert same_bits(batched(a3, transposed(b3), out_fmt), general(a3, b3, out_fmt))
    assert taken == [8, 8, 8] and counts.open == 0


def test_exact_rows_are_judged_by_their_own_block():
    """A block whose columns are wide (1 + 2**-24 + 2**-80: the float64 sum rounds to an
    fp32 tie) beside blocks of small integers: its rows are not exact sums, though they
    would be against the other blocks' columns; exact rows forced."""
    a3 = np.ones((3, 4, 3), np.float32)
    b3 = np.float32([[1, 2], [-1, 3], [2, 0]]) * np.ones((3, 1, 1), np.float32)
    b3[1, :, 0] = [1.0, 2.0 ** -24, 2.0 ** -80]
    with backend.use_tuning(exact_min_saving=-10 ** 9):
        got = batched(a3, b3, FP32)
    assert same_bits(got, general(a3, b3, FP32))
    assert got[1, 0, 0] == np.float32(1.0 + 2.0 ** -23)


def test_k_one_and_empty_stacks():
    """K = 1 (one product per element: exact) through the fast path; empty stacks (no
    blocks, rows or columns) and K = 0 are left to the general path, which gives their
    shapes (and +0 for K = 0)."""
    rng = np.random.default_rng(9)
    a3, b3 = stack(rng, 3, 4, 1, 5, ["wide", "tiny", "huge"])
    for out_fmt in OUT_FORMATS:
        with np.errstate(over="ignore"):
            assert same_bits(batched(a3, b3, out_fmt), general(a3, b3, out_fmt))
    for shape_a, shape_b in (((0, 3, 4), (0, 4, 2)), ((2, 0, 4), (2, 4, 3)),
                             ((2, 3, 4), (2, 4, 0)), ((2, 3, 0), (2, 0, 5))):
        a3, b3 = np.ones(shape_a, np.float32), np.ones(shape_b, np.float32)
        assert batched(a3, b3, FP32) is None
        out = host(accumulation.matmul(dev(a3), dev(b3), out_fmt=FP16))
        assert same_bits(out, np.zeros(shape_a[:2] + shape_b[2:], np.float32))


@pytest.mark.parametrize("shapes", [((3, 5, 6), (2, 3, 6, 4)), ((5, 6), (4, 6, 3)),
                                    ((2, 1, 5, 6), (1, 3, 6, 4)), ((6,), (3, 6, 4)),
                                    ((2, 4, 6), (6,))])
def test_broadcast_products_match_the_general_path(shapes, monkeypatch):
    """Broadcast batch axes (copied into the folded blocks) and 1-D operands: the same bits
    as the general path with both fast paths switched off."""
    rng = np.random.default_rng(len(shapes[0]) * 10 + len(shapes[1]))
    a = round_to(rng.standard_normal(shapes[0]).astype(np.float32), "fp16")
    b = (rng.integers(-3, 4, shapes[1]) * 2.0 ** rng.integers(-26, 3, shapes[1])).astype(
        np.float32)
    a[..., 0] = -0.0                                    # signed zeros in both operands
    b = np.where(b == 0, np.float32(-0.0), b)
    fast = {fmt: host(accumulation.matmul(dev(a), dev(b), out_fmt=fmt)) for fmt in OUT_FORMATS}
    monkeypatch.setattr(accumulation, "matmul_batched", lambda *args, **kw: None)
    monkeypatch.setattr(accumulation, "matmul_2d", lambda *args, **kw: None)
    for fmt in OUT_FORMATS:
        want = host(accumulation.matmul(dev(a), dev(b), out_fmt=fmt))
        assert want.shape == np.matmul(a, b).shape
        assert same_bits(fast[fmt], want)


def test_attention_gradients_match_the_general_path(monkeypatch):
    """An attention layer's forward and backward under 16-mixed (the products q @ k^T,
    weights @ v and their gradients, with a causal mask's zeros): the same bits with the
    batched fast path as without it, counted as fast products."""
    def step():
        with use_policy("16-mixed"):
            layer = ag_attention()
            x = Tensor(np.random.default_rng(1).standard_normal((3, 8, 16)).astype(np.float32),
                       requires_grad=True)
            mask = np.triu(np.ones((8, 8), bool), 1)
            out, _ = layer(x, attn_mask=mask)
            (out * out).sum().backward()
        return [host(out.data), host(x.grad.data)] + [host(p.grad.data)
                                                     for p in layer.parameters()]

    with product_count.count_products() as counts:
        fast = step()
    assert counts.fast >= 3 * 4 * 3 and counts.general == 0
    monkeypatch.setattr(accumulation, "matmul_batched", lambda *args, **kw: None)
    with product_count.count_products() as counts:
        slow = step()
    assert counts.general >= 3 * 4 * 3
    assert all(same_bits(x, y) for x, y in zip(fast, slow))


def ag_attention():
    from fpsim import nn
    return nn.MultiheadAttention(16, 4, rng=0)


@pytest.mark.parametrize("settings", [dict(), dict(certificate_open_chunk=40, einsum_from=1),
                                      dict(certificate_open_chunk=40, einsum_from=1,
                                           recheck_share=1),
                                      dict(certificate_open_chunk=40, einsum_from=1 << 30)])
def test_fp32_open_ends_with_column_widths_per_block(settings):
    """certify_fp32_open with row_blocks (each row takes its block's column widths) gives
    the open elements, ends and high array of the 2-D certificate run block by block."""
    rng = np.random.default_rng(4)
    count, m, n = 5, 7, 9
    approx = rng.standard_normal((count * m, n)) * 2.0 ** rng.integers(0, 4, (count * m, n))
    rows = np.abs(rng.standard_normal(count * m)) * width_factor(300) * 2.0 ** 12
    cols = np.abs(rng.standard_normal((count, n))) * 2.0 ** rng.integers(-8, 8, (count, 1))
    approx[::6, ::4] = np.float64(np.float32(1.0)) + 2.0 ** -24          # fp32 ties
    approx[10] = 0.0
    approx[3, 3] = -0.0
    want_high = np.empty((count * m, n), np.float32)
    want = []
    for block in range(count):
        part = slice(block * m, (block + 1) * m)
        high = backend.xp.empty((m, n), f32)
        opened, low, top = map(host, certify_fp32_open(backend.asarray(approx[part], f64),
                                                       backend.asarray(rows[part], f64),
                                                       backend.asarray(cols[block], f64), high))
        want_high[part] = host(high)
        want.append((opened + block * m * n, low, top))
    high = backend.xp.empty((count * m, n), f32)
    with backend.use_tuning(**settings):
        got = certify_fp32_open(backend.asarray(approx, f64), backend.asarray(rows, f64),
                                backend.asarray(cols, f64), high,
                                backend.asarray(np.arange(count * m) // m, backend.xp.int64))
    assert same_bits(high, want_high)
    for got_part, want_part in zip(map(host, got), map(np.concatenate, zip(*want))):
        assert np.array_equal(got_part, want_part) if got_part.dtype != np.float32 else \
            same_bits(got_part, want_part)
    assert len(want[0][0]) + len(want[2][0]) > 0
