"""The graph's fast paths (everything of a training step but the matrix products and the
optimizer) against the straightforward computation they replace, bit for bit, on adversarial
data: ties, exact zeros of both signs, subnormals, overflow, inf and NaN payloads."""
from __future__ import annotations

import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy
from fpsim.autograd import tensor as tensor_module
from fpsim.autograd.ops_elementwise import _relu_values
from fpsim.exact import elementary as el
from fpsim.exact.accumulation import reduce_sum
from fpsim.exact.exact_dots import _sums_and_patterns, exact_rows_sum, exponent_window_open
from fpsim.exact.softmax import cr_cross_entropy, log_softmax64
from fpsim.formats import BF16, FP16, FP32
from fpsim.rounding import round_to
from bit_patterns import same_bits

SPECIALS = np.concatenate([
    np.array([-np.inf, -1.5, -2.0 ** -149, -0.0, 0.0, 2.0 ** -149, 1.0, 65504.0, 3e38, np.inf,
              np.nan, -np.nan], np.float32),
    np.uint32([0x7FC01234, 0xFFA00001, 0x00000003, 0x80000003]).view(np.float32)])


def _dev(x):
    """A host NumPy array as a backend array of the same dtype (no copy on NumPy)."""
    x = np.asarray(x)
    return backend.asarray(x, getattr(backend.xp, x.dtype.name))


def _fortran(x):
    """A 2-d host array as a column-major (F-ordered) backend array."""
    return _dev(np.ascontiguousarray(x.T)).T


host = backend.to_numpy


# --- relu ----------------------------------------------------------------------------------

def test_relu_forward_mask_is_np_where_bit_for_bit():
    """relu's forward (an AND with a 0 / all-ones mask) keeps -0.0, NaN payloads, subnormals
    and inf exactly as ``np.where(x < 0, +0, x)``, in any layout."""
    rng = np.random.default_rng(1)
    grid = np.tile(SPECIALS[:, None], (1, 3))
    noise = rng.standard_normal((64, 33)).astype(np.float32)
    layouts = [(SPECIALS, _dev(SPECIALS)), (grid, _dev(grid)), (grid.T, _dev(grid).T),
               (noise, _dev(noise)), (noise[::2, 1::3], _dev(noise)[::2, 1::3]),
               (noise.astype(np.float64), _dev(noise.astype(np.float64)))]
    for x, on_backend in layouts:
        with np.errstate(invalid="ignore"):
            want = np.where(x < 0, x.dtype.type(0), x)
        assert same_bits(host(_relu_values(on_backend)), want)


# --- bias-gradient column sums -------------------------------------------------------------

def _adversarial_columns(rng, m, n):
    """(m, n) float32 gradients whose column sums hit every branch of exact_rows_sum."""
    x = rng.standard_normal((m, n)) * 2.0 ** rng.integers(-20, 20, (m, n))
    x = x.astype(np.float32)
    x[:, 0] = 0.0                                     # zero column of +0
    x[:, 1] = -0.0                                    # zero column of -0: sums to -0
    x[:, 2] = rng.choice(np.float32([0.0, -0.0]), m)  # mixed zeros: +0
    x[: m // 2 * 2, 3] = np.repeat(x[::2, 3][: m // 2], 2)
    x[1: m // 2 * 2: 2, 3] *= -1                      # exact cancellation: s = 0
    x[:, 4] = 0.0
    x[:2, 4] = [1.0, 2.0 ** -24]                      # an fp32 tie: 1 + 2**-24
    x[:, 5] = round_to(x[:, 5], FP16)                 # fp16 data: ties in fp16 output
    x[:, 6] = np.float32(2.0 ** -149) * rng.integers(-3, 4, m)   # float32 subnormals
    x[:, 7] = np.float32(3e38)                        # overflows fp32 and fp16
    x[:, 8] = rng.standard_normal(m).astype(np.float32) * 1e-3
    x[0, 8] = 1e4                                     # heavy cancellation below
    x[1, 8] = -1e4
    return x


def _reference_column_sums(x, out_fmt):
    """Each column summed exactly (integer limbs), rounded to fp32, then to out_fmt."""
    rows = _dev(np.ascontiguousarray(x.T))
    acc, _ = exact_rows_sum(rows, FP32, force_fallback=True)
    with np.errstate(over="ignore", invalid="ignore"):
        return round_to(host(acc).astype(np.float32), out_fmt)


@pytest.mark.parametrize("out_fmt", [FP32, FP16, BF16])
@pytest.mark.parametrize("m", [1, 2, 7, 128])
def test_column_sums_in_the_gradients_layout_match_exact_sums(out_fmt, m):
    rng = np.random.default_rng(m)
    x = _adversarial_columns(rng, max(m, 2), 40)[:m]
    got = host(reduce_sum(_dev(x), 0, out_fmt=out_fmt))   # rows = x.T: column-major, no copy
    assert same_bits(got, _reference_column_sums(x, out_fmt))
    assert got[1] == 0 and np.signbit(got[1]) and not np.signbit(got[2])


def test_column_sums_with_inf_and_nan_follow_ieee():
    rng = np.random.default_rng(5)
    x = _adversarial_columns(rng, 16, 12)
    x[3, 9], x[4, 10], x[5, 10], x[6, 11] = np.inf, np.inf, -np.inf, np.nan
    with backend.errstate(invalid="ignore"):
        got = host(reduce_sum(_dev(x), 0, out_fmt=FP32))
    assert got[9] == np.inf and np.isnan(got[10]) and np.isnan(got[11])
    finite = np.arange(9)
    assert same_bits(got[finite], _reference_column_sums(x[:, finite], FP32))


def test_column_major_rows_give_the_row_major_bits():
    """exact_rows_sum on a column-major view and on its C-ordered copy: the same bits (also
    for the other accumulation models, which now receive the view)."""
    rng = np.random.default_rng(6)
    x = _adversarial_columns(rng, 64, 30)
    view, copy = _dev(x).T, _dev(np.ascontiguousarray(x.T))
    assert backend.is_contiguous(view, "F") and not backend.is_contiguous(view, "C")
    for acc in (FP32, FP16, BF16):
        assert same_bits(host(exact_rows_sum(view, acc)[0]), host(exact_rows_sum(copy, acc)[0]))
    for model in ("exact", "sequential:fp16", "blocked:4:fp32", "a100"):
        assert same_bits(host(reduce_sum(_dev(x), 0, out_fmt=FP16, model=model)),
                         host(reduce_sum(copy, 1, out_fmt=FP16, model=model)))
    batch = _adversarial_columns(rng, 24, 10).reshape(4, 6, 10)       # axes (0, 1): a view
    assert same_bits(host(reduce_sum(_dev(batch), (0, 1), out_fmt=FP32)),
                     _reference_column_sums(batch.reshape(24, 10), FP32))


def _window_rows(rng, k):
    """Rows of k float32 values whose exponents span 0 to 40 binades (the window at k terms
    is 29 - ceil(log2 k)), with ties, cancellations, zeros of both signs, subnormals."""
    rows = []
    for spread in range(41):
        exponents = rng.integers(0, spread + 1, k) - spread // 2
        row = rng.integers(1 << 23, 1 << 24, k) * np.ldexp(1.0, exponents - 23)
        row = (row * rng.choice([-1.0, 1.0], k)).astype(np.float32)
        row[rng.random(k) < 0.4] = rng.choice(np.float32([0.0, -0.0]))     # ReLU zeros
        rows.append(row)
    rows.append(np.zeros(k, np.float32))
    rows.append(np.full(k, -0.0, np.float32))
    rows.append(np.float32(2.0 ** -149) * rng.integers(-5, 6, k).astype(np.float32))
    pair = rng.standard_normal(k).astype(np.float32)
    pair[1::2] = -pair[0::2][: k // 2]                 # exact cancellation (s = 0 for even k)
    rows.append(pair)
    tie = np.zeros(k, np.float32)
    tie[0], tie[-1] = 1.0, 2.0 ** -24                 # an fp32 tie (k >= 2)
    rows.append(tie)
    return np.stack(rows)


def _double_rounding_row():
    """8 terms, exponents 27 binades apart (the window at 8 terms is 26): the float64 sum
    rounds (a tie, to even) onto an fp32 midpoint, and fp32's tie then goes the wrong way."""
    u = 2.0 ** -23
    return np.float32([2 - 3 * u] + [2 - 2 * u] * 5 + [2.0 ** -23 - 2.0 ** -27,
                                                       2.0 ** -27 + 2.0 ** -50])


@pytest.mark.parametrize("k", [1, 2, 3, 8, 127, 128, 129, 300])
def test_exponent_window_sums_match_exact_sums(k):
    """Rows the exponent window passes are rounded from the float64 sum: the same bits as
    the exact integer sums, whatever the spread, layout or accumulator."""
    rng = np.random.default_rng(k)
    rows = _window_rows(rng, k)
    if k == 8:
        rows = np.concatenate([rows, _double_rounding_row()[None]])
    top_open = host(exponent_window_open(*_sums_and_patterns(_dev(rows))[1:], k))
    assert not top_open[:29 - (k - 1).bit_length()].any()     # narrow rows: float64 sums
    for acc in (FP32, FP16, BF16):
        want, _ = exact_rows_sum(_dev(rows), acc, force_fallback=True)
        # (a backend without negative steps gets a copy of the doubly reversed view)
        for layout in (_dev(rows), _fortran(rows), _dev(rows[::-1][::-1])):
            got, _ = exact_rows_sum(layout, acc)
            assert same_bits(host(got), host(want)), (k, acc.name)


def test_exponent_window_sums_in_blocks_give_the_same_bits():
    """Large inputs are read in blocks (partial sums, maxima and minima combined): blocks
    of two lines give the bits of one block, in both layouts (the double-rounding row's
    smallest term sits in its last block)."""
    rows = np.concatenate([_window_rows(np.random.default_rng(9), 8),
                           _double_rounding_row()[None]])
    want, _ = exact_rows_sum(_dev(rows), FP32, force_fallback=True)
    for layout, block in ((_dev(rows), 16), (_fortran(rows), 2 * len(rows))):
        with backend.use_tuning(certified_pattern_block=block):
            assert same_bits(host(exact_rows_sum(layout, FP32)[0]), host(want))


def test_exponent_window_is_tight_where_float64_double_rounds():
    """One binade past the window the float64 sum can be wrong: the row stays open (and the
    certified path gives the exact bits), which a window one binade wider would miss."""
    row = _double_rounding_row()
    approx, top, low = _sums_and_patterns(_dev(row[None]))
    exact = host(exact_rows_sum(_dev(row[None]), FP32, force_fallback=True)[0])
    assert np.float32(host(approx)[0]) != np.float32(exact[0])
    assert host(exponent_window_open(top, low, 8))[0]
    got = host(reduce_sum(_dev(np.tile(row[:, None], (1, 3))), 0, out_fmt=FP32))  # column sums
    assert same_bits(got, np.full(3, np.float32(12 - 2.0 ** -20)))


def test_exponent_window_rows_with_inf_and_nan_follow_ieee():
    """Rows holding inf or NaN are always open: they get the general path's bits, NaN
    payloads included (two NaNs in a row: which one wins depends on the order)."""
    rng = np.random.default_rng(3)
    rows = _window_rows(rng, 16)
    rows[5, 3], rows[6, 0], rows[6, 9], rows[7, 2], rows[8, 4] = np.inf, np.inf, -np.inf, \
        np.nan, -np.inf
    rows[9] = 0.0                                       # inf among zeros only
    rows[9, 7] = np.inf
    rows[10] = np.float32(3e38)                         # NaNs among the largest exponents
    rows[10, [2, 9]] = SPECIALS[[12, 13]]
    rows[11] = np.float32(3e38)                         # a finite sum beyond fp32: inf
    for acc in (FP32, FP16, BF16):
        with backend.errstate(invalid="ignore"):
            got, _ = exact_rows_sum(_dev(rows), acc)
            want, _ = exact_rows_sum(_dev(rows), acc, force_fallback=True)
        got, want = host(got), host(want)
        assert got[5] == np.inf and np.isnan(got[6]) and np.isnan(got[7]) and got[8] == -np.inf
        assert got[9] == np.inf and np.isnan(got[10]) and got[11] == np.inf
        assert same_bits(got, want)


# --- cross-entropy -------------------------------------------------------------------------

def test_cross_entropy_hands_its_backward_log_softmax64_bits():
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((12, 5)) * 3).astype(np.float32)
    logits[0] = [1.0, 1.0, 1.0, 1.0, 1.0]                # ties for the maximum
    logits[1, 2] = -np.inf
    logits[2, 0] = np.inf
    logits[3, 1] = np.nan
    logits[4] = [-0.0, 0.0, -0.0, 2.0 ** -149, 0.0]
    logits[5] = [80.0, -80.0, 0.0, 1e-30, 80.0]
    labels = np.arange(12) % 5
    with backend.errstate(invalid="ignore", over="ignore"):
        want_logp = host(log_softmax64(_dev(logits.astype(np.float64))))
        for reduction in ("mean", "sum", "none"):
            for fmt in (FP32, FP16):
                value, logp = cr_cross_entropy(_dev(logits), _dev(labels), reduction, fmt,
                                               with_log_softmax=True)
                assert same_bits(host(logp), want_logp)
                assert same_bits(host(value), host(cr_cross_entropy(_dev(logits), _dev(labels),
                                                                    reduction, fmt)))
    finite = logits[[0, 4, 5, 6, 7]]
    value, _ = cr_cross_entropy(_dev(finite), _dev(labels[:5]), "none", FP32,
                                with_log_softmax=True)
    with backend.errstate(under="ignore"):
        direct = -host(log_softmax64(_dev(finite.astype(np.float64))))[np.arange(5), labels[:5]]
    assert same_bits(round_to(host(value), FP32), round_to(direct, FP32))


def test_log1p_single_branch_matches_the_two_branch_formula():
    def two_branch(t):
        small = t < 0.4
        ts = np.where(small, t, 0.0)
        return np.where(small, host(el._atanh2(_dev(ts / (2.0 + ts)))),
                        host(el.log(_dev(1.0 + np.where(small, 0.0, t)))))

    tiny = np.array([0.0, 2.0 ** -1074, 1e-300, 1e-17, 0.1, 0.3999999999])
    big = np.array([0.4, 0.5, 1.0, 9.0, 1e10, 1e300, np.inf])
    for t in (tiny, big, np.concatenate([tiny, big]), np.array([np.nan, 1.0]),
              np.array([np.nan, 0.1]), tiny[:, None], big.reshape(7, 1)):
        assert same_bits(host(el.log1p(_dev(t))), two_branch(t))


def test_horner_and_exp_clamp_match_their_plain_formulations():
    """``_horner`` starts from x * c_n (no filled array) and ``exp`` clamps with maximum
    and minimum (no clip): the bits of the plain formulations, signed zeros, subnormals,
    inf and NaN payloads included."""
    def plain_horner(x, coeffs):
        acc = np.full_like(x, coeffs[-1])
        for c in coeffs[-2::-1]:
            acc *= x
            acc += c
        return acc

    def plain_exp(y):
        finite = np.isfinite(y)
        k, p = el.exp_parts(_dev(np.clip(np.where(finite, y, 0.0), -400.0, 400.0)))
        p = (host(p) + 1.0) * host(el.pow2(k))
        return np.where(np.isinf(y), np.where(y > 0, np.inf, 0.0), np.where(np.isnan(y), y, p))

    rng = np.random.default_rng(4)
    with np.errstate(all="ignore"):                   # (signalling NaNs widen quietly)
        special = np.concatenate([SPECIALS.astype(np.float64), [2.0 ** -1074, -5e-324, 1e300]])
        x = np.concatenate([special, rng.standard_normal(200) * 0.3,
                            rng.standard_normal(200) * 10.0 ** rng.integers(-30, 3, 200)])
        for coeffs in (el._EXPM1_Q, el._ATANH_W, (3.0, -0.5)):
            assert same_bits(host(el._horner(_dev(x), coeffs)), plain_horner(x, coeffs))
        for y in (x, x * 500.0, rng.standard_normal((7, 9)) * 300.0):
            assert same_bits(host(el.exp(_dev(y))), plain_exp(y))


# --- leaf gradients: kept when unshared, copied when shared --------------------------------

@pytest.mark.numpy_only    # reference counts: the NumPy backend's buffer reuse
def test_unshared_tells_a_sole_array_from_a_shared_one():
    unshared = backend.is_unshared
    fresh = np.ones(4, np.float32)
    assert unshared(fresh)
    other = fresh
    assert not unshared(fresh)
    del other
    view = fresh[:2]
    assert not unshared(fresh) and not unshared(view)
    del view
    holder = {"g": fresh}
    assert not unshared(fresh)
    del holder
    reshaped = np.ones(6, np.float32).reshape(2, 3)     # a fresh result, reshaped
    assert unshared(reshaped)
    part = np.ones(8, np.float32)[:6]                    # part of a bigger buffer
    transposed = np.ones((3, 2), np.float32).T
    assert not unshared(part) and not unshared(transposed)


def _all_grad_arrays(tensors):
    return [t.grad.data for t in tensors if t.grad is not None]


@pytest.mark.numpy_only    # reference counts: the NumPy backend's buffer reuse
def test_no_two_gradients_share_memory_and_values_are_unchanged():
    rng = np.random.default_rng(8)
    x = Tensor(rng.standard_normal(5).astype(np.float32), requires_grad=True)
    y = Tensor(rng.standard_normal(5).astype(np.float32), requires_grad=True)
    seed = np.float32([1.0, 2.0, 3.0, 4.0, 5.0])
    (x + y).backward(seed)                               # add hands g to both leaves
    (x * 1.0).sum().backward()
    hidden = x * 2.0
    hidden.retain_grad()
    (hidden + y).sum().backward()
    x.backward(seed)                                     # the seed itself reaches a leaf
    arrays = _all_grad_arrays([x, y, hidden]) + [seed]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)
    assert x.grad.data.tolist() == [2 * s + 3.0 for s in (1.0, 2.0, 3.0, 4.0, 5.0)]
    assert y.grad.data.tolist() == [s + 1.0 for s in (1.0, 2.0, 3.0, 4.0, 5.0)]
    seed[:] = 0                                          # the caller's array stays theirs
    assert x.grad.data[0] == 5.0


@pytest.mark.numpy_only    # reference counts: the NumPy backend's buffer reuse
@pytest.mark.parametrize("policy", ["32-true", "16-mixed"])
def test_mlp_gradients_are_kept_without_copies_and_match_copies(policy, monkeypatch):
    def run():
        rng = np.random.default_rng(9)
        with use_policy(policy):
            model = nn.MLP([6, 8, 3], rng=2)
            x = Tensor(rng.standard_normal((4, 6)).astype(np.float32))
            ag.cross_entropy(model(x), [0, 1, 2, 1]).backward(np.float32(1024.0))
        return model.parameters()

    accumulate, owned = tensor_module._accumulate_leaf, []

    def spy(node, g, keep):
        owned.append(keep)
        accumulate(node, g, keep)

    monkeypatch.setattr(tensor_module, "_accumulate_leaf", spy)
    kept = run()
    assert owned == [True] * 4                           # every gradient kept, none copied
    monkeypatch.setattr(backend, "is_unshared", lambda g: False)
    copied = run()
    for a, b in zip(kept, copied):
        assert same_bits(a.grad.data, b.grad.data)
        assert a.grad.data.flags.c_contiguous
    arrays = _all_grad_arrays(kept)
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)
