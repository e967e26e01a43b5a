"""The fused kernel ``exact_dots`` (``fpsim.backend.numba_dots``, Numba) against exact integer
sums and against ``exact_elements``' own NumPy code (``use_compiled(False)``), bit for bit:
each element's exact dot product rounded once to fp32. Inputs built for every branch: random
data, exact fp32 ties and their neighbours (25+ significant bits), cancelling pairs with tiny
remainders and exact zeros of nonzero terms, zero products of every sign combination (the -0
rule), fp32 subnormal products, sums and ties, sums at and beyond fp32's overflow threshold,
K = 1 and K = 65,536, C- and F-ordered operands, float32 arrays and their float64 copies,
repeated elements; float64 operands beyond float32's range, which the kernel leaves undecided
(sums near float64 overflow, sums below 2**-960) or rounds exactly. Each tier alone decides
only exact values; all together decide every element of float32 values. End to end:
``matmul_2d``, ``matmul_batched``, ``matmul_in_parts`` and conv2d forward and backward give
the same bits with the compiled loops on and off, the kernel being called. Planted bugs (a
plain float64 sum, a correctly rounded float64 sum rounded again, +0 for every zero sum) are
caught by these inputs. Without Numba these tests skip."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("numba", reason="Numba is not installed (pip install 'fpsim[fast]'); "
                    "exact_elements runs its NumPy code")

import fpsim.autograd as ag  # noqa: E402
from fpsim import backend  # noqa: E402
from fpsim.autograd import Tensor, use_policy  # noqa: E402
from fpsim.backend.numba_dots import dots_by, exact_dots  # noqa: E402
from fpsim.backend.numba_sums import TIERS  # noqa: E402
from fpsim.exact import open_elements  # noqa: E402
from fpsim.exact.fast_matmul import matmul_2d, matmul_batched  # noqa: E402
from fpsim.exact.open_elements import exact_elements  # noqa: E402
from fpsim.exact.product_parts import matmul_in_parts  # noqa: E402
from fpsim.formats import FP16, FP32  # noqa: E402
from fpsim.rounding import use_compiled  # noqa: E402

from bit_patterns import host, same_bits  # noqa: E402
from fused_paths import both  # noqa: E402
from odd_sums import CANCELLING_LAYERS  # noqa: E402
from test_fastpaths import adversarial  # noqa: E402

P = 2.0                                   # P ** k reads as a power of two below
SCALE = 2 ** 1074                         # every float64 is an integer multiple of 2**-1074
ODD_MAX = P ** 128 - P ** 103             # the midpoint above fp32's largest value: inf
TIE = P ** 24                             # fp32's unit is 2 from here up
NEAR_MAX = float(np.float32(3e38))


@pytest.fixture(autouse=True)
def restore_choice():
    previous = use_compiled(True)
    yield
    use_compiled(previous)


def products_of(a, b, i, j) -> np.ndarray:
    return np.asarray(a, np.float64)[i] * np.asarray(b, np.float64)[:, j]


def fp32_nearest_even(value: Fraction, negative_zero: bool) -> np.float32:
    """``value`` rounded once to fp32, nearest even (inf from the midpoint above the largest
    finite value); a zero ``value`` is -0 where ``negative_zero``."""
    if value == 0:
        return np.float32(-0.0 if negative_zero else 0.0)
    size = abs(value)
    e = size.numerator.bit_length() - size.denominator.bit_length()
    e -= Fraction(2) ** e > size                       # 2**e <= size < 2**(e + 1)
    quantum = Fraction(2) ** (max(e, -126) - 23)       # fp32's, subnormals included
    units = math.floor(size / quantum)
    rest = size / quantum - units
    units += rest > Fraction(1, 2) or (rest == Fraction(1, 2) and units % 2 == 1)
    rounded = math.inf if units * quantum >= 2 ** 128 else float(units * quantum)
    return np.float32(-rounded if value < 0 else rounded)


def test_the_reference_rounds_as_numpy_casts_a_float64():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(2000) * P ** rng.integers(-160, 130, 2000)
    x = np.concatenate([x, [0.0, -0.0, ODD_MAX, -ODD_MAX, ODD_MAX - P ** 70, P ** -150,
                            -P ** -150, 1.5 * P ** -149, TIE + 1, TIE + 3, 1 + P ** -24]])
    got = [fp32_nearest_even(Fraction(float(v)), bool(np.signbit(v))) for v in x]
    with np.errstate(over="ignore"):
        assert same_bits(np.array(got, np.float32), x.astype(np.float32))


def exact_sum(terms) -> Fraction:
    return Fraction(sum(int(Fraction(float(t)) * SCALE) for t in terms), SCALE)


def reference(a, b, rows, cols) -> np.ndarray:
    """Each element's float64 products summed as integers, rounded once to fp32."""
    out = []
    for i, j in zip(rows, cols):
        terms = products_of(a, b, i, j)
        negative_zero = bool(np.all((terms == 0) & np.signbit(terms)))
        out.append(fp32_nearest_even(exact_sum(terms), negative_zero))
    return np.array(out, np.float32)


def elements(r: int, c: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Every element of an (r, c) product once, and a few again, in a shuffled order."""
    rows, cols = np.divmod(np.arange(r * c), c)
    again = rng.integers(0, r * c, min(5, r * c))
    order = rng.permutation(r * c + again.shape[0])
    return np.concatenate([rows, rows[again]])[order], np.concatenate([cols, cols[again]])[order]


def column_of_terms(*rows, shift=0, scales=(1.0, -1.0, P ** -40, P ** 30, -P ** -90)):
    """(a, b) whose products a_ik * b_k0 are the ``rows`` of terms (a holds them times
    2**shift, b's column 0 is 2**-shift; its other columns scale them by ``scales``: the same
    ties in other binades, and their negatives)."""
    width = max(len(r) for r in rows)
    a = np.array([list(r) + [0.0] * (width - len(r)) for r in rows]) * P ** shift
    b = np.ones((width, 1)) * np.array(scales) * P ** -shift
    assert np.all(a.astype(np.float32) == a) and np.all(b.astype(np.float32) == b)
    return a.astype(np.float32), b.astype(np.float32)


BUILT = {
    "fp32 ties": column_of_terms(
        [TIE, 1.0], [TIE, 3.0], [TIE, 1.0, P ** -30], [TIE, 1.0, -P ** -30],
        [TIE, 2.0, -1.0], [TIE, 0.5, 0.5, P ** -60], [-TIE, -1.0, P ** -40],
        [1.0, P ** -24], [1.0, 3 * P ** -24], [1.0, P ** -24, P ** -80], [1.0, -P ** -25],
        [1.0, -P ** -25, -P ** -90], [P ** 23, 0.5, 0.25, 0.125, P ** -3, P ** -70],
        [3.0] * 5 + [TIE],
        # at a tie, t one unit of the split's second level, the terms below that level
        # outweighing it with the other sign: a third level's bound without |K3| misreads them
        [1.0, P ** -24, P ** -93] + [-3 * P ** -96] * 4,
        [1.0, P ** -24, -P ** -93] + [3 * P ** -96] * 4),
    "cancellation": column_of_terms(
        [1.5 * P ** 40, -1.5 * P ** 40, P ** -100], [P ** 60, 3.0, -P ** 60, -3.0],
        [-1.0, 1.0], [1.0, -1.0, -0.0], [P ** 100, 1.0, -P ** 100, P ** -24, -1.0],
        [P ** 70, P ** -70, -P ** 70, P ** -93], np.float32([0.1, 0.2, 0.3, -0.6]).tolist(),
        [P ** 90, 1.0, P ** -24, -P ** 90, P ** -60]),
    "fp32 overflow": column_of_terms(
        [P ** 127, ODD_MAX - P ** 127], [P ** 127, ODD_MAX - P ** 127, -P ** -20],
        [P ** 127, ODD_MAX - P ** 127, P ** -20], [P ** 127] * 9, [-P ** 127] * 3,
        [P ** 127, P ** 127, -P ** 127, -P ** 127, 1.0], [NEAR_MAX, NEAR_MAX, -NEAR_MAX]),
    # three layers of cancelling pairs below a lone tiny term; pairs whose errors cancel in
    # the cascade's second error sum too (``odd_sums.CANCELLING_LAYERS``)
    "cancelling layers": column_of_terms(
        *CANCELLING_LAYERS, shift=120, scales=(1.0, -1.0, 0.5, P ** -3, -P ** 2)),
    "fp32 subnormal": column_of_terms(
        [P ** -150], [-P ** -150], [P ** -150, P ** -200], [-P ** -150, -P ** -200],
        [1.5 * P ** -149], [2.5 * P ** -149], [P ** -127, P ** -149], [P ** -126, -P ** -149],
        [P ** -130, P ** -131, P ** -140, P ** -170], shift=100,
        scales=(1.0, -1.0, 0.5, P ** 20, -P ** -3)),
}


def zero_signs():
    """K = 2, every row and column of {+0, -0, 1, -1}: every sign combination of zero
    products, beside zero sums of nonzero terms and nonzero sums."""
    values = np.array([0.0, -0.0, 1.0, -1.0], np.float32)
    pairs = np.array([[x, y] for x in values for y in values], np.float32)
    return pairs, np.ascontiguousarray(pairs.T)


def random_cases(rng):
    yield "random", rng.standard_normal((4, 37)).astype(np.float32), \
        rng.standard_normal((37, 5)).astype(np.float32)
    for kind in ("fp16", "wide", "tiny", "huge", "ints"):
        yield kind, *adversarial(rng, 6, 40, 7, kind)[:2]
    yield "K = 1", *adversarial(rng, 5, 1, 6, "wide")[:2]
    yield "zero signs", *zero_signs()
    for name, (a, b) in BUILT.items():
        yield name, a, b


def cases():
    return list(random_cases(np.random.default_rng(7)))


def layouts(a, b):
    """(a, b) as float32 and float64 arrays, C- and F-ordered."""
    for dtype in (np.float32, np.float64):
        for order in ("C", "F"):
            yield np.asarray(a, dtype, order=order), np.asarray(b, dtype, order=order)


def elements_both_ways(a, b, rows, cols) -> tuple[np.ndarray, np.ndarray]:
    """``exact_elements`` with the fused kernel, then with its own NumPy code; the norms and
    BLAS values as ``fast_matmul`` makes them."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        row_norm, col_norm = np.sqrt(np.einsum("ik,ik->i", a64, a64)), \
            np.sqrt(np.einsum("kj,kj->j", b64, b64))
        approx = (a64 @ b64)[rows, cols]
    return both("exact_dots", lambda: host(exact_elements(a, b, row_norm, col_norm, rows, cols,
                                                          approx)))


@pytest.mark.parametrize("name, a, b", cases(), ids=[c[0] for c in cases()])
def test_every_element_is_the_exact_sum_rounded_once(name, a, b):
    rows, cols = elements(a.shape[0], b.shape[1], np.random.default_rng(3))
    want = reference(a, b, rows, cols)
    for x, y in layouts(a, b):
        values, decided = exact_dots(x, y, rows, cols)
        assert decided.all() and same_bits(values, want), (name, x.dtype, x.flags.f_contiguous)
        for path, got in zip(("fused", "numpy"), elements_both_ways(x, y, rows, cols)):
            assert same_bits(got, want), (name, path, x.dtype, x.flags.f_contiguous)


@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_alone_decides_only_exact_values(tier):
    settled = 0
    for name, a, b in cases():
        rows, cols = elements(a.shape[0], b.shape[1], np.random.default_rng(3))
        values, decided = dots_by(a, b, rows, cols, (tier,))
        assert same_bits(values[decided], reference(a, b, rows[decided], cols[decided])), name
        settled += int(decided.sum())
    assert settled > 0


def test_sixty_five_thousand_products():
    k, rng = 1 << 16, np.random.default_rng(11)
    a = rng.standard_normal((3, k)).astype(np.float32)
    b = rng.standard_normal((k, 2)).astype(np.float32)
    a[1] = P ** -16                                   # 2**24 + 1 - 2**-16: below the tie
    a[1, 0], b[:, 1] = TIE, 1.0
    a[2, : k // 2], a[2, k // 2:] = a[0, : k // 2], -a[0, : k // 2]   # pairs x, -x ...
    b[:, 0] = np.concatenate([b[: k // 2, 1], b[: k // 2, 1]])
    a[2, 5] += P ** -20                               # ... and one term left over
    rows, cols = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 0, 1, 0, 1])
    want = reference(a, b, rows, cols)
    assert want[3] == TIE
    for x, y in ((a, b), (np.asfortranarray(a), np.asfortranarray(b))):
        values, decided = exact_dots(x, y, rows, cols)
        assert decided.all() and same_bits(values, want)
    assert same_bits(*elements_both_ways(a, b, rows, cols))


def test_float64_operands_beyond_float32_are_undecided_or_exact():
    values = [P ** 510, P ** 500, P ** -500, 1.0 + P ** -40, 3.0, -P ** 509]
    a = np.array([[x, x] for x in values] + [[P ** 510, -P ** 510]])
    b = np.ascontiguousarray(a[:, ::-1].T)
    rows, cols = elements(a.shape[0], b.shape[1], np.random.default_rng(5))
    got, decided = exact_dots(a, b, rows, cols)
    with np.errstate(over="ignore"):
        magnitude = np.array([np.abs(products_of(a, b, i, j)).sum()
                              for i, j in zip(rows, cols)])
    assert not decided[magnitude >= P ** 1019].any()        # partial sums could overflow
    tiny = (magnitude > 0) & (magnitude < P ** -960)
    assert not decided[tiny].any() and decided[(magnitude < P ** 1000) & ~tiny].all()
    assert same_bits(got[decided], reference(a, b, rows[decided], cols[decided]))
    assert same_bits(*elements_both_ways(a, b, rows, cols))


@pytest.mark.parametrize("call", [
    lambda a, b, r, c: exact_dots(a.tolist(), b, r, c),
    lambda a, b, r, c: exact_dots(a.astype(np.float16), b, r, c),
    lambda a, b, r, c: exact_dots(a[None], b, r, c),
    lambda a, b, r, c: exact_dots(a, b[1:], r, c),
    lambda a, b, r, c: exact_dots(a[:, :0], b[:0], r, c),
    lambda a, b, r, c: exact_dots(a, b, r + 3, c),
    lambda a, b, r, c: exact_dots(a, b, r, c - 4),
    lambda a, b, r, c: exact_dots(a, b, r, c[:2]),
    lambda a, b, r, c: exact_dots(a, b, r.astype(np.float64), c)])
def test_inputs_it_does_not_take_are_declined(call):
    a, b = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    assert call(a, b, np.array([0, 2, 1]), np.array([1, 0, 1])) is None


def test_no_elements():
    values, decided = exact_dots(np.ones((3, 4)), np.ones((4, 2)), np.zeros(0, int),
                                 np.zeros(0, int))
    assert values.shape == decided.shape == (0,) and values.dtype == np.float32


PLANTED = {
    "plain float64 sum": lambda terms: np.float32(np.sum(terms)),
    "rounded to nearest at 53 bits, then to fp32": lambda terms: np.float32(math.fsum(terms)),
    "+0 for every zero sum": lambda terms: fp32_nearest_even(exact_sum(terms), False),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_planted_bugs_are_caught(bug):
    caught = False
    with np.errstate(over="ignore"):
        for _, a, b in cases():
            rows, cols = elements(a.shape[0], b.shape[1], np.random.default_rng(3))
            wrong = np.array([PLANTED[bug](products_of(a, b, i, j))
                              for i, j in zip(rows, cols)], np.float32)
            caught = caught or not same_bits(wrong, reference(a, b, rows, cols))
    assert caught


@pytest.fixture
def kernel_calls(monkeypatch):
    """How often exact_elements ran the fused kernel (with the compiled loops on)."""
    calls, offered = [0], open_elements.fused

    def counting(kernel):
        found = offered(kernel)
        if kernel != "exact_dots" or found is None:
            return found

        def counted(*args):
            calls[0] += 1
            return found(*args)
        return counted
    monkeypatch.setattr(open_elements, "fused", counting)
    return calls


def both_ways(run) -> tuple[list, list]:
    """``run()``'s arrays with the fused kernels, then with the exact layer's own code."""
    return both("exact_dots", lambda: [host(x) for x in run()])


@pytest.mark.parametrize("kind", ["fp16", "wide", "tiny", "huge", "ints"])
def test_certified_products_give_the_same_bits_both_ways(kind, kernel_calls):
    rng = np.random.default_rng(len(kind))
    a, b, _ = adversarial(rng, 9, 50, 11, kind)
    stack = [adversarial(rng, 5, 24, 6, kind)[:2] for _ in range(3)]
    a3, b3 = np.stack([x for x, _ in stack]), np.stack([y for _, y in stack])

    def run():
        for fmt in (FP32, FP16):
            yield matmul_2d(a, b, fmt)
            yield matmul_2d(np.asfortranarray(a), np.asfortranarray(b), fmt)
            yield matmul_batched(a3, b3, fmt)
            yield matmul_in_parts([(a[:, :20], b[:20]), (a[:, 20:], b[20:])], (9, 11), fmt,
                                  lambda rows: a[rows], lambda cols: b[:, cols], 100)
    fused, numpy = both_ways(run)
    assert all(same_bits(x, y) for x, y in zip(fused, numpy))
    assert kernel_calls[0] > 0


@pytest.mark.parametrize("policy", ["32-true", "16-mixed"])
def test_conv2d_forward_and_backward_give_the_same_bits_both_ways(policy, kernel_calls):
    rng = np.random.default_rng(2)
    # small integers times powers of two: exact sums and fp32 ties leave elements open under
    # 32-true (16-mixed's narrow products are settled by exact rows: no open elements)
    x, w, bias, gy = (rng.integers(-3, 4, s) * P ** rng.integers(-6, 7, s)
                      for s in ((4, 8, 12, 12), (8, 8, 3, 3), (8,), (4, 8, 12, 12)))
    x[0, 0] = -0.0

    def run():
        with use_policy(policy):
            tensors = [Tensor(v, requires_grad=True) for v in (x, w, bias)]
            y = ag.conv2d(*tensors, padding=1)
            y.backward(Tensor(gy, y.fmt))
        return [backend.to_numpy(t) for t in [y.data] + [t.grad.data for t in tensors]]
    fused, numpy = both_ways(run)
    assert all(same_bits(a, b) for a, b in zip(fused, numpy))
    assert kernel_calls[0] > 0 or policy != "32-true"
