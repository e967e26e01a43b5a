"""The correctly rounded functions' fast paths (issue 44) give the bits of the plain ones.

- ``elementary.gelu`` and ``normal_cdf`` take the Taylor table only for the elements it
  serves (-20 < x < 10 with |x| >= 2**-60 or x = 0) and one formula each for the others;
  the coefficients are gathered row by row (``take``) and Horner runs in place. Each is
  compared with the formula of every element at once (``gelu_every_element``: 2-D fancy
  indexing, fresh arrays, every ``where``), on arrays where the off-table elements stand
  alone, among table ones, in 0-d and in transposed arrays.
- ``normal_cdf_pdf`` (GELU's gradient) and ``sigmoid_pair`` (the tanh GELU's bound) share
  one exp between two results: the bits of the two separate calls.
- ``correctly_rounded``'s chunks, its fused value-and-bound evaluations and its per-chunk
  float64 conversion give the proxies of the whole-array evaluation, certification and
  settling (``finish_reference``) at every chunk size, and forcing the Decimal fallback on
  inputs beside rounding boundaries (``hard_cases``) rounds every element alike.
- ``FALLBACK_COUNT`` counts the elements checked and those settled.
"""
from __future__ import annotations

import numpy as np
import pytest

import fpsim.exact as fx
from fpsim import backend
from fpsim.backend import use_tuning, xp
from fpsim.exact import correctly_rounded as cr
from fpsim.exact import decimal_ref as ref
from fpsim.exact import elementary as el
from fpsim.formats import get
from fpsim.rounding import round_to
from bit_patterns import host, same_bits
from hard_cases import closest_to_midpoints, few_bit_floats, tiny_midpoint_inputs

ULP_BELOW_10, ULP_ABOVE_MINUS_20 = np.nextafter(10.0, 0.0), np.nextafter(-20.0, 0.0)
NAN_PAYLOADS = np.array([0x7FF8000000000123, 0xFFF4000000000001], np.uint64).view(np.float64)
#: each side of every boundary of the table path, of the tails' formulas and of the centres
EDGES = np.concatenate([NAN_PAYLOADS, [
    0.0, -0.0, np.inf, -np.inf, 10.0, ULP_BELOW_10, -10.0, -20.0, ULP_ABOVE_MINUS_20,
    20.0, -20.0, np.nextafter(20.0, 21.0), -np.nextafter(20.0, 21.0), 2.0 ** -60,
    -2.0 ** -60, np.nextafter(2.0 ** -60, 0.0), -np.nextafter(2.0 ** -60, 0.0), 5e-324,
    -5e-324, 3e-320, -1e-310, 1e300, -1e300, 0.125, -0.125, 0.375, 19.875, -19.875,
    3.0, -3.0, 88.72, -103.97, 1e-30, -1e-30]])
FORMATS = ("fp32", "fp16", "bf16", "e4m3fn")


def _dev(x):
    return xp.asarray(np.asarray(x, np.float64))


def tail_q_every_element(a):
    """Q(a), 0 <= a <= 20, as before the row gathers: table[degree, j] fancy indexing and
    a fresh array per Horner step."""
    table = np.array(el._gelu_coefficients(), np.float64).T
    centre = np.rint(a * 4)
    j = centre.astype(np.intp)
    h = a - centre / 4
    acc = table[15, j]
    for degree in range(14, -1, -1):
        acc = acc * h + table[degree, j]
    return host(el.exp(_dev(-(a * a) * 0.5))) * acc


def gelu_every_element(x):
    """gelu as one formula over every element, each case a ``where`` (the module doc's
    cases: the table, x >= 10 rounded to odd, x <= -20, tiny x, +-inf, NaN)."""
    x = np.asarray(x, np.float64)
    a = np.abs(x)
    q = tail_q_every_element(np.minimum(np.where(np.isnan(a), 0.0, a), 20.0))
    out = np.where(x < 0, x * q, x * (1.0 - q))
    big = x >= 10.0
    out = np.where(big, host(fx.round_to_odd(_dev(x), _dev(np.where(big, -1.0, 0.0)))), out)
    out = np.where(x <= -20.0, -(2.0 ** -1000), out)
    half = x * 0.5
    residual = x - 2.0 * half             # nonzero for an odd subnormal x: its half is a tie
    tiny = host(fx.round_to_odd(_dev(half), _dev(np.where(residual == 0, 1.0, residual))))
    out = np.where((a < 2.0 ** -60) & (x != 0), tiny, out)
    out = np.where(x == np.inf, np.inf, np.where(x == -np.inf, el.DEFAULT_NAN, out))
    return np.where(np.isnan(x), x, out)


def normal_cdf_every_element(x):
    x = np.asarray(x, np.float64)
    a = np.minimum(np.abs(x), 20.0)
    q = tail_q_every_element(np.where(np.isnan(a), 0.0, a))
    out = np.where(x < 0, q, 1.0 - q)
    out = np.where(x < -20.0, 0.0, np.where(x > 20.0, 1.0, out))
    return np.where(np.isnan(x), x, out)


def _inputs():
    """Table-only arrays, the edges alone, each edge among table values, 0-d, transposed."""
    rng = np.random.default_rng(44)
    table = rng.standard_normal(5000) * 4
    yield table
    yield EDGES
    for edge in EDGES:
        yield np.concatenate([table[:50], [edge], table[50:99]])
        yield np.float64(edge)
    yield (rng.standard_normal((40, 30)) * 8).T
    yield rng.uniform(-25, 15, 20000).astype(np.float32).astype(np.float64)
    yield np.abs(rng.standard_normal(200)) * 2.0 ** -62 * rng.choice([-1, 1], 200)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gelu_and_normal_cdf_take_the_table_only_where_it_serves():
    with np.errstate(all="ignore"):
        for x in _inputs():
            want = gelu_every_element(x)
            value, outside = el.gelu_parts(_dev(x))
            assert same_bits(value, want), f"gelu at {np.ravel(x)[:6]}"
            off = ~((x < 10) & (x > -20) & ((np.abs(x) >= 2.0 ** -60) | (x == 0)))
            assert (outside is None) == (not off.any())
            assert outside is None or np.array_equal(host(outside), off)
            cdf = normal_cdf_every_element(x)
            assert same_bits(el.normal_cdf(_dev(x)), cdf), f"normal_cdf at {np.ravel(x)[:6]}"
            both = el.normal_cdf_pdf(_dev(x))
            assert same_bits(both[0], cdf) and same_bits(both[1], el.normal_pdf(_dev(x)))
            a = np.abs(np.ravel(x))
            a = a[a <= 20]
            assert same_bits(el.gelu_tail_q(_dev(a)), tail_q_every_element(a))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_gradients_cdf_and_pdf_chunk_by_chunk_are_the_whole_arrays():
    x = np.concatenate([EDGES, np.random.default_rng(5).standard_normal(1000) * 8])
    with np.errstate(all="ignore"):
        for values in (x, np.reshape(x[:1024], (32, 32)).T):
            want = (normal_cdf_every_element(values), host(el.normal_pdf(_dev(values))))
            for chunk in (7, 256, 1 << 16):
                with use_tuning(correctly_rounded_chunk=chunk):
                    cdf, pdf = el.normal_cdf_pdf(_dev(values))
                assert same_bits(cdf, want[0]) and same_bits(pdf, want[1]), f"chunks of {chunk}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_sigmoid_pair_gives_the_bits_of_two_sigmoids():
    with np.errstate(all="ignore"):
        for x in _inputs():
            s, s_neg = el.sigmoid_pair(_dev(x))
            assert same_bits(s, el.sigmoid(_dev(x)))
            assert same_bits(s_neg, el.sigmoid(_dev(-np.asarray(x))))


#: (correctly rounded function, float64 evaluation, its bound at float64 x, Decimal reference)
FUNCTIONS = {
    "exp": (fx.cr_exp, el.exp, lambda x: el.EXP_BOUND, ref.dexp),
    "log": (fx.cr_log, el.log, lambda x: el.LOG_BOUND, ref.dln),
    "tanh": (fx.cr_tanh, el.tanh, lambda x: el.TANH_BOUND, ref.dtanh),
    "sigmoid": (fx.cr_sigmoid, el.sigmoid, lambda x: el.SIGMOID_BOUND, ref.dsigmoid),
    "silu": (fx.cr_silu, cr.silu64, lambda x: cr.SILU_BOUND, ref.dsilu),
    "gelu": (fx.cr_gelu, el.gelu, cr.gelu_bound, ref.dgelu),
    "gelu_tanh": (fx.cr_gelu_tanh, cr.gelu_tanh64, cr.gelu_tanh_bound, ref.dgelu_tanh),
}


def finish_reference(name, x, fmt):
    """The proxies as the whole array gives them: one float64 evaluation and bound, one
    certificate, ``settle`` for each element it leaves."""
    _, evaluate, bound, dref = FUNCTIONS[name]
    x64 = np.asarray(x, np.float64)
    v = host(evaluate(_dev(x64))).copy()
    ok = host(fx.certified(_dev(v), xp.asarray(bound(_dev(x64)), xp.float64), fmt))
    for j in np.flatnonzero(~ok):
        xj = float(x64[j])
        v[j] = fx.settle(lambda d, xj=xj: fx.enclosure(*dref(xj, d)), fmt)
    return v


def hard_inputs(name, fmt):
    """float32 inputs beside ``fmt``'s midpoints: the 40 closest among the few-bit floats, the
    tiny midpoints (tanh x, gelu 2x lie a relative x*x beside them), and the edges."""
    few = few_bit_floats(10, -30, 6)
    few = few if name == "log" else np.concatenate([few, -few])
    _, evaluate, _, _ = FUNCTIONS[name]
    with np.errstate(all="ignore"):
        values = host(evaluate(_dev(few.astype(np.float64))))
    tiny = tiny_midpoint_inputs(get(fmt), -40, -20)[::97]
    edges = EDGES[np.isfinite(EDGES) & (np.abs(EDGES) < 3e38)].astype(np.float32)
    rng = np.random.default_rng(7)
    return np.concatenate([closest_to_midpoints(few, values, get(fmt), 40), tiny, 2 * tiny,
                           -tiny, edges, NAN_PAYLOADS.astype(np.float32),
                           (rng.standard_normal(300) * 3).astype(np.float32)])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_chunks_and_fused_evaluations_give_the_whole_array_proxies(name):
    for fmt_name in FORMATS:
        fmt = get(fmt_name)
        x = hard_inputs(name, fmt_name)
        with np.errstate(all="ignore"):
            want = finish_reference(name, x, fmt)
            for chunk in (7, 256, 1 << 16):
                with use_tuning(correctly_rounded_chunk=chunk):
                    got = FUNCTIONS[name][0](xp.asarray(x), fmt)
                assert same_bits(got, want), f"{name} -> {fmt_name}, chunks of {chunk}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_forced_fallback_and_the_certificate_round_alike(name):
    for fmt_name in FORMATS:
        fmt = get(fmt_name)
        x = xp.asarray(hard_inputs(name, fmt_name))
        with np.errstate(all="ignore"):
            fast = round_to(FUNCTIONS[name][0](x, fmt), fmt)
            before = dict(fx.FALLBACK_COUNT)
            with fx.forced_fallback():
                slow = round_to(FUNCTIONS[name][0](x, fmt), fmt)
        settled = fx.FALLBACK_COUNT["elements"] - before["elements"]
        assert fx.FALLBACK_COUNT["checked"] - before["checked"] == backend.size(x)
        assert settled == _settle_takes(name, x), f"{name} -> {fmt_name}"
        assert same_bits(fast, slow), f"{name} -> {fmt_name}"


def _settle_takes(name, x):
    """How many elements ``forced_fallback`` sends to ``settle``: all but NaN, +-inf, zeros,
    values exact by argument (bound 0) and values beyond 2**+-160 (its doc)."""
    _, evaluate, bound, _ = FUNCTIONS[name]
    with np.errstate(all="ignore"):
        v = np.abs(host(evaluate(_dev(x))))
        b = np.broadcast_to(host(xp.asarray(bound(_dev(x)), xp.float64)), v.shape)
    return int(np.count_nonzero(np.isfinite(v) & (v != 0) & (b != 0) & (v <= 2.0 ** 160)
                                & (v >= 2.0 ** -160)))


def test_the_count_reads_checked_and_settled_elements():
    x = xp.asarray(np.random.default_rng(3).standard_normal(1000).astype(np.float32))
    before = dict(fx.FALLBACK_COUNT)
    fx.cr_gelu(x, get("fp32"))
    assert fx.FALLBACK_COUNT["checked"] - before["checked"] == 1000
    assert fx.FALLBACK_COUNT["elements"] - before["elements"] < 10
    before = dict(fx.FALLBACK_COUNT)
    with fx.forced_fallback():
        fx.cr_gelu(x, get("fp32"))
    assert fx.FALLBACK_COUNT["elements"] - before["elements"] == 1000    # none exact or far
