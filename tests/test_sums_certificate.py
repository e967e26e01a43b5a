"""The certified row sums of ``round_to_odd_sum`` (``fpsim.exact.sums``: two error-free splits
and a float64 error bound decide a row, integer limbs take the rest) against the limbs alone
(``forced_limbs``), bit for bit, and against exact rational sums; adversarial rows where the
certificate must decide (exact ties, cancellation to zero, signed zeros, huge dynamic range)
or must hand the row to the limbs (subnormal results, overflow, cancellation it cannot
settle); ``SUM_ROWS`` counts each path; layer and batch norm give the same bits either way,
rows with inf and NaN included."""
from __future__ import annotations


import numpy as np
import pytest

from fpsim import backend
from fpsim.autograd import Tensor, batch_norm, layer_norm, mse_loss
from fpsim.exact import scatter_sum
from fpsim.exact.sums import SUM_ROWS, forced_limbs, round_to_odd_sum
from fpsim.rounding import use_compiled

from bit_patterns import host, same_bits  # noqa: E402
from odd_sums import rodd, rows_of  # noqa: E402

f64 = backend.xp.float64


def both_paths(rows) -> tuple[np.ndarray, np.ndarray, dict]:
    """(default result, limbs-only result, rows each path took in the default call)."""
    terms = backend.asarray(np.asarray(rows, np.float64), f64)
    before = dict(SUM_ROWS)
    with np.errstate(over="ignore"):        # the limbs' own overflow to inf
        got = host(round_to_odd_sum(terms))
        counts = {k: SUM_ROWS[k] - before[k] for k in before}
        with forced_limbs():
            want = host(round_to_odd_sum(terms))
    return got, want, counts


# Rows the certificate decides (with their exact rodd sums below).
DECIDED = rows_of(
    [1.0, 2.0 ** -53],                       # a float64 tie: rodd is 1 + 2**-52
    [1.0, -(2.0 ** -54)],                    # below a power of two: the half-size gap
    [1.0, 2.0 ** -24],                       # an fp32 tie, exact in float64
    [1.0, 2.0 ** -11, 2.0 ** -60],           # just above an fp16 tie
    [1.0, 2.0 ** -11, -(2.0 ** -60)],        # just below it
    [3.0, 2.0 ** -52, 2.0 ** -105],          # a float64 midpoint plus a far bit
    [2.0 ** 100, 2.0 ** -100],               # 200 binades apart: level 1
    [2.0 ** 100, 2.0 ** -100, -(2.0 ** 100)],            # cancels to 2**-100: level 2
    [1.0, 2.0 ** -60, -(2.0 ** -60)],                    # lo parts cancel: level 2, exact
    [1.0, 2.0 ** -60, -(2.0 ** -60), 2.0 ** -200],       # level 2, residual r2
    [2.0 ** 1000, 1.0, -(2.0 ** 1000), 2.0 ** -900],     # cancels to 1 + 2**-900
    [2.0 ** 1017, 2.0 ** 1016],              # the largest sums the certificate takes
    [2.0 ** -900, 3 * 2.0 ** -952],          # small, normal, 53 bits: level 2, exact
    [2.0 ** -900, 2.0 ** -959],              # small, normal and inexact
    [0.1, 0.2, 0.3, -0.6],                   # decimal fractions, a tiny remainder
    [1e300, 1e-280, -1e300, -3e-280],        # hi parts cancel: the lo parts' sum
    [1.0, 2.0 ** -60, -(2.0 ** -60), 2.0 ** -200, -(2.0 ** -200), 2.0 ** -400],  # r2's sign
    #                                          below its bound: again on (s, lo2)
    [1.0, 2.0 ** -60, 2.0 ** -109 - 2.0 ** -60] + [-(2.0 ** -150)] * 3,   # level 2, |t| above
    #                                          the bound on the lo2 parts
)


def test_certificate_decides_ties_ranges_and_cancellation():
    got, want, counts = both_paths(DECIDED)
    assert same_bits(got, want)
    assert counts == {"certified": len(DECIDED), "limbs": 0}
    assert [float(v) for v in got] == [rodd(row) for row in DECIDED]


@pytest.mark.parametrize("row, zero", [
    ([-0.0, -0.0, -0.0], "-0"), ([0.0, -0.0], "+0"), ([-0.0], "-0"), ([5.0, -5.0], "+0"),
    ([-0.0, 2.0 ** 90, 1.5, -(2.0 ** 90), -1.5], "+0"), ([2.0 ** -900, -(2.0 ** -900)], "+0"),
    ([1e300, 1e-300, -1e300, -1e-300], "+0")])
def test_exact_zero_sums_take_the_ieee_sign(row, zero):
    got, want, counts = both_paths([row])
    assert same_bits(got, want) and counts["certified"] == 1
    assert np.signbit(got[0]) == (zero == "-0") and got[0] == 0


# Rows the certificate must leave to the limbs.
UNDECIDED = rows_of(
    [2.0 ** -1070, 2.0 ** -1073],            # a subnormal result
    [1e-310, -1e-311],                       # another
    [1.0, -1.0, 2.0 ** -1000],               # cancels to below 2**-960
    [1.7e308, 1.7e308],                      # overflows to inf
    [2.0 ** 1018, 2.0 ** 1018],              # sum |x| reaches 2**1019
    [2.0 ** -1074, -(2.0 ** -1074)],         # subnormal terms cancelling to zero
    [1.0, 2.0 ** -60, 2.0 ** -109 - 2.0 ** -60] + [-3 * 2.0 ** -112] * 3,  # level 2: the lo2
    #                                          parts outweigh t (S = 1 - 2**-112 < s = 1)
)


@pytest.fixture
def numpy_certificate():
    """The NumPy certificate itself: the compiled kernel (``fpsim.backend.numba_sums``,
    tests/test_fused_sums.py) decides some of these rows by its own exact steps."""
    previous = use_compiled(False)
    yield
    use_compiled(previous)


def test_certificate_hands_what_it_cannot_decide_to_the_limbs(numpy_certificate):
    got, want, counts = both_paths(UNDECIDED)
    assert same_bits(got, want)
    assert counts == {"certified": 0, "limbs": len(UNDECIDED)}
    assert got[3] == np.inf
    assert float(got[-1]) == rodd(UNDECIDED[-1]) == 1 - 2.0 ** -53


def test_mixed_rows_keep_their_places(numpy_certificate):
    mixed = rows_of(*(list(r) for pair in zip(DECIDED, UNDECIDED) for r in pair))
    got, want, counts = both_paths(mixed)
    assert same_bits(got, want)
    assert counts == {"certified": len(UNDECIDED), "limbs": len(UNDECIDED)}
    assert same_bits(got[::2], both_paths(DECIDED[:len(UNDECIDED)])[1])


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_terms_are_refused_on_both_paths(bad):
    terms = backend.asarray(np.array([[1.0, bad]]), f64)
    with pytest.raises(ValueError, match="finite terms"):
        round_to_odd_sum(terms)
    with forced_limbs(), pytest.raises(ValueError, match="finite terms"):
        round_to_odd_sum(terms)


def random_rows(rng, kind: str, rows: int, width: int) -> np.ndarray:
    normal = rng.standard_normal((rows, width))
    if kind == "fp16":
        return normal.astype(np.float16).astype(np.float64)
    if kind == "squares":                        # layer norm's variance terms
        d = normal.astype(np.float32).astype(np.float64)
        d -= d.mean(axis=1, keepdims=True)
        return d * d
    if kind == "wide":
        return normal * 2.0 ** rng.integers(-300, 300, (rows, width))
    if kind == "cancelling":                     # each row's terms and their negatives
        half = normal[:, :width // 2] * 2.0 ** rng.integers(-40, 40, (rows, 1))
        out = np.concatenate([half, -half, normal[:, :width % 2] * 2.0 ** -80], axis=1)
        out[::2, -1] += 2.0 ** -70 * rng.integers(-3, 4, rows // 2 + rows % 2)
        return rng.permuted(out, axis=1)
    if kind == "subnormal":
        return normal * 2.0 ** rng.integers(-1090, -930, (rows, width))
    return normal * 2.0 ** rng.integers(950, 1012, (rows, width))        # "huge"


@pytest.mark.parametrize("width", [1, 2, 3, 64, 301])
@pytest.mark.parametrize("kind", ["fp16", "squares", "wide", "cancelling", "subnormal",
                                  "huge"])
def test_random_rows_match_the_limbs(kind, width):
    rng = np.random.default_rng(width * 7 + len(kind))
    rows = random_rows(rng, kind, 200, width)
    got, want, counts = both_paths(rows)
    assert same_bits(got, want), kind
    if kind in ("fp16", "squares", "wide"):
        assert counts == {"certified": 200, "limbs": 0}
    for row, value in zip(rows[:20], got[:20]):
        if abs(value) >= 2.0 ** -1022 and np.isfinite(value):
            assert float(value) == rodd(row)


def test_chunked_rows_match_the_limbs():
    rows = random_rows(np.random.default_rng(5), "wide", 50, 40)
    with backend.use_tuning(sums_chunk=97):       # two rows per chunk
        got, want, counts = both_paths(rows)
    assert same_bits(got, want) and counts["certified"] == 50


def norm_outputs(data):
    """layer_norm over the last axis and training batch_norm over axis 1 of ``data``, with
    every gradient (the upstream gradient: fixed values), as host arrays."""
    out = []
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for op in (lambda x, w, b: layer_norm(x, data.shape[-1], w, b),
                   lambda x, w, b: batch_norm(x, None, None, w, b, training=True)):
            size = data.shape[-1] if len(out) == 0 else data.shape[1]
            x = Tensor(data, requires_grad=True)
            w = Tensor(np.linspace(0.5, 2.0, size).astype(np.float32), requires_grad=True)
            b = Tensor(np.linspace(-1.0, 1.0, size).astype(np.float32), requires_grad=True)
            y = op(x, w, b)
            (y * Tensor(np.cos(np.arange(data.size, dtype=np.float32)).reshape(data.shape))
             ).sum().backward()
            out += [t.numpy() for t in (y, x.grad, w.grad, b.grad)]
    return out


def test_norms_give_the_limbs_bits_with_inf_and_nan_rows():
    rng = np.random.default_rng(9)
    data = (rng.standard_normal((6, 5, 8)) * 2.0 ** rng.integers(-20, 20, (6, 5, 8))
            ).astype(np.float32)
    data[0, 0, 3] = np.inf
    data[1, 2, 0] = np.nan
    data[2, 1] = 7.0                                   # a constant row: zero variance
    data[3, 3, :4], data[3, 3, 4:] = 2.0 ** 20, -(2.0 ** 20)
    before = SUM_ROWS["certified"]
    got = norm_outputs(data)
    assert SUM_ROWS["certified"] > before
    with forced_limbs():
        want = norm_outputs(data)
    assert all(same_bits(g, w) for g, w in zip(got, want))
    assert np.isnan(got[0][0, 0]).all() and np.isfinite(got[0][0, 1]).all()


def with_and_without_limbs(compute):
    """(compute() by default, the rows it certified, compute() with the limbs forced)."""
    before = SUM_ROWS["certified"]
    got = compute()
    certified = SUM_ROWS["certified"] - before
    with forced_limbs():
        return got, certified, compute()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_mse_loss_gives_the_limbs_bits(reduction):
    rng = np.random.default_rng(3)
    pred = (rng.standard_normal((37, 5)) * 2.0 ** rng.integers(-30, 30, (37, 5))
            ).astype(np.float32)
    target = pred + np.float32(2.0 ** -12)               # squares near fp32 ties
    target[::3] = rng.standard_normal((13, 5)).astype(np.float32)
    got, certified, want = with_and_without_limbs(
        lambda: mse_loss(Tensor(pred), Tensor(target), reduction).numpy())
    assert same_bits(got, want)
    assert certified == {"none": 185, "sum": 0, "mean": 2}[reduction]     # sum: its own bound


def test_scatter_sums_give_the_limbs_bits():
    rng = np.random.default_rng(4)
    positions = rng.integers(0, 40, 600)
    values = rng.standard_normal(600) * 2.0 ** rng.integers(-60, 60, 600)
    values[:20] = -values[20:40]
    positions[:20] = positions[20:40]                     # pairs that cancel where alone
    got, certified, want = with_and_without_limbs(
        lambda: host(scatter_sum(backend.asarray(positions, backend.xp.int64),
                                 backend.asarray(values, f64), 40)))
    assert same_bits(got, want) and certified == 40
