"""The fused kernel ``certified_row_sums`` (``fpsim.backend.numba_sums``, Numba) against the
integer limbs of ``fpsim.exact.sums`` (``forced_limbs``) and the NumPy certificate, bit for bit:
each of its tiers (split, compensated, cascade, expansion) alone and all together, on rows
built for each tier and rule, which the tiers before it cannot settle (float64 ties and the
values one ulp and half an ulp around them, cancellation of pairs with tiny remainders, exact
zeros of both signs, sums that are floats after inexact steps, subnormal sums, sums near
overflow), and on random rows of widths 1 to 300 and magnitudes from 2**-1074 to 2**1000;
the end-to-end users (layer norm, batch norm, mse loss under 16-mixed) give the same bits with
the compiled loops on and off. Planted bugs (a plain float64 sum, a compensated sum taken
without its error bound) are caught by these rows; the rows marked for a rule are there
because a weakened version of that rule gets them wrong. Without Numba these tests skip."""
from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("numba", reason="Numba is not installed (pip install 'fpsim[fast]'); "
                    "round_to_odd_sum runs the NumPy certificate")

from fpsim import backend  # noqa: E402
from fpsim.autograd import Tensor, batch_norm, layer_norm, mse_loss, use_policy  # noqa: E402
from fpsim.backend.numba_sums import TIERS, certified_row_sums, row_sums_by  # noqa: E402
from fpsim.exact.sums import SUM_ROWS, forced_limbs, round_to_odd_sum  # noqa: E402
from fpsim.rounding import use_compiled  # noqa: E402

from bit_patterns import host, same_bits  # noqa: E402
from odd_sums import CANCELLING_LAYERS, rodd, rows_of  # noqa: E402

P = 2.0                                   # P ** k reads as a power of two below


@pytest.fixture
def restore_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def limbs(rows) -> np.ndarray:
    """The reference: every row summed in integer limbs."""
    with forced_limbs(), np.errstate(over="ignore"):
        return host(round_to_odd_sum(backend.asarray(np.asarray(rows, np.float64),
                                                     backend.xp.float64)))


def by_default(rows, compiled: bool) -> tuple[np.ndarray, dict]:
    """round_to_odd_sum with the compiled loops on or off, and the rows each path took."""
    use_compiled(compiled)
    before = dict(SUM_ROWS)
    with np.errstate(over="ignore"):
        got = host(round_to_odd_sum(backend.asarray(np.asarray(rows, np.float64),
                                                    backend.xp.float64)))
    return got, {k: SUM_ROWS[k] - before[k] for k in before}


def agree_where_decided(rows, tiers=TIERS) -> np.ndarray:
    """Assert the kernel's decided rows carry the limbs' bits; return the decided mask."""
    values, decided = row_sums_by(rows, tiers)
    want = limbs(rows)
    assert same_bits(values[decided], want[decided]), tiers
    return decided


# Settled by the split: the sum within its two levels, or its residual t above their bound.
SPLIT = rows_of(
    [1.0, P ** -53],                            # a float64 tie: rodd is 1 + 2**-52
    [1.0, P ** -53, P ** -200],                 # just above it (below the two levels)
    [1.0, P ** -53, -P ** -200],                # just below it
    [1.0, -P ** -54],                           # a tie below a power of two (half-size gap)
    [1.0, -P ** -54, P ** -300],
    [1.0, P ** -52],                            # one ulp above: exact
    [1.0, -P ** -53],                           # one ulp below (the smaller gap): exact
    [3.0, P ** -52, P ** -105],                 # a midpoint plus a far bit
    [P ** -900, P ** -959],                     # small, normal, inexact
    [1.0, P ** -24],                            # an fp32 tie, exact in float64
    [1.0, P ** -60, -P ** -60],                 # cancels within the levels: exactly 1
    [0.1, 0.2, 0.3, -0.6],                      # decimal fractions, a tiny remainder
)
# Not settled by the split (t = 0 or below its bound, or sums too large for its levels), by
# the compensated tier: the sum is a float, or its TwoSum residual clears the bound.
COMPENSATED = rows_of(
    [P ** 100, P ** -100],                      # 200 binades apart: the split's t is 0
    [1.0, P ** -102, P ** -300],                # 2**-102 below the split's levels
    [P ** 1017, P ** 1016],                     # the largest sums taken
    [-P ** 1017, P ** 1016, P ** -20],
    # the split's remainder (below its two levels) outweighs its t, of the other sign: a bound
    # on that remainder 128 times smaller than n q2 / 2 would settle these wrongly
    [1.0, P ** -93, 1.5 * P ** -95, -1.5 * P ** -95, -1.75 * P ** -95, P ** -97,
     -1.75 * P ** -95, -P ** -95],
)
# Settled by neither, by the cascade (sums that are floats, or nearly, after inexact steps):
CASCADE = rows_of(
    [P ** 100, P ** -100, -P ** 100],           # cancels to 2**-100, exactly
    [1e300, 1e-300, -1e300, -1e-300],           # exactly 0: +0
    [1.0, P ** -53, P ** -53, P ** -53, P ** -53, P ** -120],    # t = 0, residual c2 > 0:
    [1.0, P ** -53, P ** -53, P ** -53, P ** -53, -P ** -120],   # S1 = 1 + 2**-51 is even,
    #                                             the odd neighbour is on c2's side
    [1.0, P ** -53, P ** -53, P ** -53, P ** -53, P ** -101, P ** -160],  # |t| above c2
    [1.0, P ** -60, P ** -109 - P ** -60] + [-3 * P ** -112] * 3,      # 1 - 2**-112
    [1.0, -P ** -93, P ** -95, 1.75 * P ** -95, 1.5 * P ** -95, -P ** -97],  # as the last
    #                                             of COMPENSATED
)
# Settled by neither (odd_sums.CANCELLING_LAYERS).
EXPANSION = rows_of(*CANCELLING_LAYERS)
# Left to the limbs: subnormal or tiny sums, possible overflow.
UNDECIDED = rows_of(
    [P ** -1070, P ** -1073],                   # a subnormal result
    [1e-310, -1e-311],
    [1.0, -1.0, P ** -1000],                    # cancels to below 2**-960
    [1.7e308, 1.7e308],                         # overflows to inf
    [P ** 1018, P ** 1018],                     # sum |x| reaches 2**1019
    [1.7976931348623157e308, -1.7976931348623157e308],   # sum |x| overflows; S = 0
)
BUILT = (SPLIT, COMPENSATED, CASCADE, EXPANSION)          # in the order of TIERS
ALL_BUILT = rows_of(*SPLIT, *COMPENSATED, *CASCADE, *EXPANSION, *UNDECIDED)


@pytest.mark.parametrize("tiers", [TIERS] + [(tier,) for tier in TIERS])
def test_built_rows_give_the_limbs_bits_on_every_tier(tiers):
    decided = agree_where_decided(ALL_BUILT, tiers)
    values = row_sums_by(ALL_BUILT, tiers)[0]
    for row, value in zip(ALL_BUILT[decided], values[decided]):
        assert value == rodd(row) or value == 0 == rodd(row)


def test_each_tier_settles_the_rows_built_for_it():
    def settled(rows, tiers):
        return row_sums_by(rows, tiers)[1]
    for position, rows in enumerate(BUILT):
        assert settled(rows, (TIERS[position],)).all(), TIERS[position]
        assert not settled(rows, TIERS[:position]).any(), TIERS[position]
    for tiers in [TIERS] + [(tier,) for tier in TIERS]:
        assert not settled(UNDECIDED, tiers).any()
    assert certified_row_sums(rows_of(*SPLIT, *COMPENSATED, *CASCADE, *EXPANSION))[1].all()


@pytest.mark.parametrize("row, negative", [
    ([-0.0, -0.0, -0.0], True), ([-0.0], True), ([0.0, -0.0], False), ([5.0, -5.0], False),
    ([-0.0, P ** 90, 1.5, -P ** 90, -1.5], False), ([P ** -1074, -P ** -1074], False),
    ([1e300, 1e-300, -1e300, -1e-300], False), ([-P ** -900, P ** -900, -0.0], False)])
@pytest.mark.parametrize("tier", TIERS)
def test_exact_zero_sums_take_the_ieee_sign(row, negative, tier):
    values, decided = row_sums_by([row], TIERS[TIERS.index(tier):])
    assert decided[0] and values[0] == 0 and np.signbit(values[0]) == negative
    assert same_bits(values, limbs([row]))


def test_arrays_of_another_library_are_declined():
    assert certified_row_sums([[1.0, 2.0]]) is None


def test_empty_rows_and_no_rows():
    values, decided = certified_row_sums(np.zeros((3, 0)))
    assert decided.all() and same_bits(values, np.zeros(3)) and same_bits(values, limbs(
        np.zeros((3, 0))))
    values, decided = certified_row_sums(np.zeros((0, 5)))
    assert values.shape == decided.shape == (0,)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_rows_with_inf_or_nan_are_undecided_and_refused(bad, restore_choice):
    rows = np.array([[1.0, 2.0], [bad, 1.0], [3.0, -0.0]])
    values, decided = certified_row_sums(rows)
    assert decided.tolist() == [True, False, True] and values[[0, 2]].tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match="finite terms"):
        round_to_odd_sum(backend.asarray(rows, backend.xp.float64))


def layered_rows(rng, rows: int) -> np.ndarray:
    """Rows of a few small-integer multiples of powers of two, some with their negatives, and
    a lone tiny term: sums that are floats, or nearly, after inexact steps (every tier)."""
    out = []
    for _ in range(rows):
        k = int(rng.integers(2, 6))
        base = [float(rng.integers(-8, 9)) * P ** int(rng.integers(-170, 1)) for _ in range(k)]
        row = base + [-b for b in base[:int(rng.integers(0, k + 1))]]
        row.append(float(rng.integers(-3, 4)) * P ** int(rng.integers(-300, -100)))
        out.append(rng.permutation(row))
    return rows_of(*out)


def random_rows(rng, kind: str, rows: int, width: int) -> np.ndarray:
    normal = rng.standard_normal((rows, width))
    if kind == "fp32":
        return normal.astype(np.float32).astype(np.float64)
    if kind == "squares":                        # layer norm's variance terms
        d = normal.astype(np.float32).astype(np.float64)
        d -= d.mean(axis=1, keepdims=True)
        return d * d
    if kind == "mixed":                          # 2**-1074 .. 2**1000, subnormal terms too
        return normal * P ** rng.integers(-1074, 1000, (rows, width))
    if kind == "cancelling":                     # each row's terms and their negatives
        half = normal[:, :width // 2] * P ** rng.integers(-40, 40, (rows, 1))
        out = np.concatenate([half, -half, normal[:, :width % 2] * P ** -80], axis=1)
        out[::2, -1] += P ** -70 * rng.integers(-3, 4, rows // 2 + rows % 2)
        return rng.permuted(out, axis=1)
    if kind == "subnormal":
        return normal * P ** rng.integers(-1090, -930, (rows, width))
    return normal * P ** rng.integers(950, 1012, (rows, width))        # "huge"


@pytest.mark.parametrize("width", [1, 2, 3, 7, 64, 256, 300])
@pytest.mark.parametrize("kind", ["fp32", "squares", "mixed", "cancelling", "subnormal",
                                  "huge"])
def test_random_rows_match_the_limbs_and_the_numpy_certificate(kind, width, restore_choice):
    rng = np.random.default_rng(width * 11 + len(kind))
    rows = random_rows(rng, kind, 120, width)
    for tiers in [TIERS] + [(tier,) for tier in TIERS]:
        agree_where_decided(rows, tiers)
    compiled, counts = by_default(rows, True)
    reference, _ = by_default(rows, False)
    assert same_bits(compiled, reference) and same_bits(compiled, limbs(rows))
    if backend.fused("certified_row_sums") is not None:    # (numpy-strict offers none)
        assert counts["certified"] == int(certified_row_sums(rows)[1].sum())
        if kind in ("fp32", "squares", "cancelling"):
            assert counts == {"certified": 120, "limbs": 0}


def test_every_width_up_to_300():
    rng = np.random.default_rng(12)
    for width in range(1, 301):
        rows = np.concatenate([random_rows(rng, kind, 2, width)
                               for kind in ("squares", "mixed", "cancelling")])
        assert agree_where_decided(rows)[:2].all()          # the squares


def test_layered_rows_match_the_limbs_on_every_tier():
    rows = layered_rows(np.random.default_rng(3), 1500)
    for tiers in [TIERS] + [(tier,) for tier in TIERS]:
        decided = agree_where_decided(rows, tiers)
        if tiers == ("expansion",) or tiers == TIERS:
            assert decided.all()
    for tier in TIERS:                           # each tier settles some rows, not all
        assert row_sums_by(rows, (tier,))[1].any()
    for last in range(1, len(TIERS)):
        assert not row_sums_by(rows, TIERS[:last])[1].all()


def test_any_memory_layout_gives_the_same_bits():
    rows = random_rows(np.random.default_rng(8), "mixed", 40, 30)
    want = certified_row_sums(rows)
    for view in (np.asfortranarray(rows), np.ascontiguousarray(rows.T).T,
                 np.repeat(rows, 2, axis=1)[:, ::2], np.repeat(rows, 2, axis=0)[::2]):
        got = certified_row_sums(view)
        assert same_bits(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_forced_limbs_still_forces_the_limbs(restore_choice):
    rows = random_rows(np.random.default_rng(2), "squares", 30, 16)
    before = dict(SUM_ROWS)
    limbs(rows)
    assert SUM_ROWS["limbs"] - before["limbs"] == 30
    assert SUM_ROWS["certified"] == before["certified"]


def test_chunked_rows_match(restore_choice):
    rows = random_rows(np.random.default_rng(5), "mixed", 50, 40)
    with backend.use_tuning(sums_chunk=97):       # two rows per chunk
        got, counts = by_default(rows, True)
    assert same_bits(got, limbs(rows)) and counts["certified"] == 50


def test_planted_bugs_are_caught():
    """A plain float64 sum, and a compensated sum taken as decided without its error bound,
    each give wrong bits on these rows."""
    rows = rows_of(*SPLIT, *COMPENSATED, *CASCADE, *EXPANSION)
    want = limbs(rows)
    plain = rows.sum(axis=1)
    assert np.count_nonzero(plain.view(np.uint64) != want.view(np.uint64)) >= 10

    s = np.zeros(len(rows))
    c = np.zeros(len(rows))
    for x in rows.T:                              # Sum2: TwoSum along the row, errors summed
        total = s + x
        virtual = total - s
        c += (s - (total - virtual)) + (x - virtual)
        s = total
    near = s + c
    virtual = near - s
    t = (s - (near - virtual)) + (c - virtual)
    pattern = near.view(np.int64) - ((t != 0) & (np.signbit(t) != np.signbit(near)))
    unbounded = np.where(t != 0, (pattern | 1).view(np.float64), near)
    wrong = unbounded.view(np.uint64) != want.view(np.uint64)
    first = len(SPLIT)                            # the rows its bound settles come out right
    assert wrong.any() and not wrong[first:first + len(COMPENSATED)].any()


def norm_and_loss_outputs(data):
    """layer_norm (last axis) and training batch_norm (axis 1) forward and every gradient,
    and mse_loss, under 16-mixed, as host arrays."""
    out = []
    with use_policy("16-mixed"), np.errstate(invalid="ignore", over="ignore",
                                             divide="ignore"):
        for op in (lambda x, w, b: layer_norm(x, data.shape[-1], w, b),
                   lambda x, w, b: batch_norm(x, None, None, w, b, training=True)):
            size = data.shape[-1] if not out else data.shape[1]
            x = Tensor(data, requires_grad=True)
            w = Tensor(np.linspace(0.5, 2.0, size).astype(np.float32), requires_grad=True)
            b = Tensor(np.linspace(-1.0, 1.0, size).astype(np.float32), requires_grad=True)
            y = op(x, w, b)
            (y * Tensor(np.cos(np.arange(data.size, dtype=np.float32)).reshape(data.shape))
             ).sum().backward()
            out += [t.numpy() for t in (y, x.grad, w.grad, b.grad)]
        target = Tensor(data + np.float32(2.0 ** -12))
        for reduction in ("none", "mean"):
            out.append(mse_loss(Tensor(data), target, reduction).numpy())
    return out


def test_norms_and_losses_give_the_same_bits_either_way(restore_choice):
    rng = np.random.default_rng(9)
    data = (rng.standard_normal((6, 5, 64)) * P ** rng.integers(-12, 12, (6, 5, 64))
            ).astype(np.float32)
    data[0, 0, 3] = np.inf
    data[1, 2, 0] = np.nan
    data[2, 1] = 7.0                                    # a constant row: zero variance
    data[3, 3, :32], data[3, 3, 32:] = P ** 20, -P ** 20
    use_compiled(True)
    before = SUM_ROWS["certified"]
    compiled = norm_and_loss_outputs(data)
    assert SUM_ROWS["certified"] > before
    use_compiled(False)
    reference = norm_and_loss_outputs(data)
    with forced_limbs():
        in_limbs = norm_and_loss_outputs(data)
    assert all(same_bits(a, b) for a, b in zip(compiled, reference))
    assert all(same_bits(a, b) for a, b in zip(compiled, in_limbs))
