"""``product_parts.matmul_in_parts``: the certified product with its reduction in parts gives
``fast_matmul.matmul_2d``'s bits on the whole operands, for any split of K and any size of the
exact step's groups, on inputs built so that the certificate leaves elements open (exact fp32
ties, cancellation to zero and to tiny sums, signed zeros, subnormal sums, overflow of the
output format) and where it does not apply (NaN, inf: None, as ``matmul_2d``)."""
import numpy as np
import pytest

from fpsim.exact.fast_matmul import matmul_2d
from fpsim.exact.product_count import count_products
from fpsim.exact.product_parts import matmul_in_parts
from fpsim.formats import BF16, FP16, FP32

M, K, N = 7, 96, 9


def _operands(case, rng):
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    if case == "ties":                 # small integers and halves: exact sums, fp32/fp16 ties
        a, b = np.round(a * 4), np.round(b * 4) / 2 ** 12
        a[:, 0] = 2.0 ** 24             # sums beyond 2**24: half-integers are fp32 ties
    elif case == "cancellation":       # b's second half cancels the first: zeros and tiny sums
        a[:, 0] *= 2.0 ** 40            # products far above the sum: float64 loses it
        b[K // 2:] = -b[:K // 2]
        a[:, K // 2:] = a[:, :K // 2]
        a[:, 3] += 2.0 ** -20           # one term left over: a tiny exact sum
    elif case == "signed zeros":
        a[:, ::2], b[1::2] = -0.0, -0.0
        a[0], b[:, 0] = -0.0, 0.0       # an all -0 row, an all +0 column
    elif case == "subnormal":          # fp32 subnormal products and sums
        a, b = a * 2.0 ** -70, b * 2.0 ** -70
    elif case == "overflow":           # fp16 and bf16 outputs overflow, fp32 does not
        a, b = a * 2.0 ** 60, b * 2.0 ** 60
    return a.astype(np.float32), b.astype(np.float32)


def _parts(a, b, bounds):
    return [(a[:, lo:hi], b[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _in_parts(a, b, fmt, bounds, exact_budget):
    with count_products() as counts:
        out = matmul_in_parts(_parts(a, b, bounds), (a.shape[0], b.shape[1]), fmt,
                              lambda rows: a[rows], lambda cols: b[:, cols], exact_budget)
    return out, counts


SPLITS = {"one part": [0, K], "two parts": [0, 40, K], "one term each": list(range(K + 1))}


@pytest.mark.parametrize("case", ["random", "ties", "cancellation", "signed zeros",
                                  "subnormal", "overflow"])
@pytest.mark.parametrize("fmt", [FP32, FP16, BF16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("split", list(SPLITS))
def test_parts_give_the_whole_products_bits(case, fmt, split):
    a, b = _operands(case, np.random.default_rng(len(case)))
    with np.errstate(over="ignore"):
        expected = matmul_2d(a, b, fmt)
    for exact_budget in (1, 10 ** 9):     # one open element at a time, all at once
        out, counts = _in_parts(a, b, fmt, SPLITS[split], exact_budget)
        np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32),
                                      err_msg=f"{case} {split} budget {exact_budget}")
    if case in ("ties", "cancellation", "signed zeros"):
        assert counts.open, "inputs built to leave elements open left none"
        assert counts.exact or fmt != FP32, "fp32 outputs of these inputs need the exact step"


@pytest.mark.parametrize("case", ["cancellation", "signed zeros"])
def test_a_wrong_exact_step_is_caught(case, monkeypatch):
    """The exact step decides bits on these inputs: settled with the float64 BLAS value
    cast to fp32 (what a certificate-free product would give) instead of the exact sums,
    the result differs from ``matmul_2d``'s."""
    from fpsim.exact import product_parts
    a, b = _operands(case, np.random.default_rng(len(case)))
    expected = matmul_2d(a, b, FP32)
    monkeypatch.setattr(product_parts, "exact_elements",
                        lambda *args: args[-1].astype(np.float32))
    out, counts = _in_parts(a, b, FP32, SPLITS["one term each"], 10 ** 9)
    assert counts.exact and not np.array_equal(out.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_parts_leave_the_product_to_the_general_path(value):
    a, b = _operands("random", np.random.default_rng(5))
    a[2, 50] = value
    with np.errstate(invalid="ignore"):
        assert matmul_2d(a, b, FP32) is None
        assert _in_parts(a, b, FP32, SPLITS["two parts"], 100)[0] is None


def test_no_parts_is_none():
    assert matmul_in_parts([], (2, 3), FP32, None, None, 10) is None
