"""max_pool2d, avg_pool2d and Flatten: bit-exact where PyTorch's kernel is exact or the data
make every sum exact, within a derived bound where PyTorch's fp32 summation rounds; the
formats under "16-mixed".

Bounds against PyTorch (u = 2**-24, gamma_k = k u / (1 - k u), S = sum of magnitudes):
PyTorch sums a window's m values (or an input's m gradient shares) in fp32 in some order,
|error| <= gamma_(m-1) S, and one division (or a multiplication by a rounded reciprocal,
two roundings) adds at most 2 u: together <= gamma_(m+1) S / m for avg pool's forward,
<= gamma_(m+1) S for the m shares g / (kh kw) of its backward. Ours is the exact sum
rounded to fp32 and divided in fp32 (forward: gamma_2 S / m), or the exact sum of shares
rounded once (backward, kh kw a power of two here: u S). Max pool's forward selects (no
error); its backward sums m gradients exactly and rounds once (u S) where PyTorch's
sequential fp32 sum is within gamma_(m-1) S.
"""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy

U = 2.0 ** -24

# (input shape, kernel, stride, padding)
POOLS = [
    ((2, 3, 6, 7), 2, None, 0),
    ((2, 2, 7, 7), 3, 2, 1),
    ((1, 2, 5, 6), (2, 4), 1, (1, 2)),
    ((1, 1, 4, 4), 2, 1, 0),
]
OPS = ["max_pool2d", "avg_pool2d"]


def gamma(k: int) -> float:
    return k * U / (1 - k * U)


def _pairs(value):
    return value if isinstance(value, tuple) else (value, value)


def _ours(op, x, gy, pool, policy="32-true"):
    _, kernel, stride, padding = pool
    with use_policy(policy):
        t = Tensor(x, requires_grad=True)
        y = getattr(ag, op)(t, kernel, stride, padding)
        y.backward(Tensor(gy, y.fmt))
    return backend.to_numpy(y.data), backend.to_numpy(t.grad.data), y.fmt.name


def _torch(op, x, gy, pool, dtype):
    torch = pytest.importorskip("torch")
    _, kernel, stride, padding = pool
    t = torch.tensor(x, dtype=dtype, requires_grad=True)
    y = getattr(torch.nn.functional, op)(t, kernel, stride, padding)
    y.backward(torch.tensor(gy, dtype=dtype))
    return y.detach().double().numpy(), t.grad.double().numpy()


def _output_shape(op, x, pool):
    with ag.no_grad():
        return getattr(ag, op)(Tensor(x), *pool[1:]).shape


def _overlap(pool):
    """How many windows can hold one input element."""
    _, kernel, stride, _ = pool
    stride = _pairs(kernel if stride is None else stride)
    return int(np.prod([-(-k // s) for k, s in zip(_pairs(kernel), stride)]))


def _sparse_exponents(rng, shape):
    """fp32 values with exponents in [-3, 3]: float64 sums of a few of them are exact."""
    return (rng.uniform(1, 2, shape) * 2.0 ** rng.integers(-3, 4, shape)
            * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("op", OPS)
def test_pooling_is_the_exact_result_rounded_once(op, pool):
    """On values whose float64 window sums are exact, ours is that sum rounded to fp32 (and,
    for avg pool, divided by kh kw in fp32: exact for power-of-two counts, one correct
    rounding otherwise, as the float64 quotient rounded to fp32 is here)."""
    rng = np.random.default_rng(len(str((op, pool))))
    x = _sparse_exponents(rng, pool[0])
    x.reshape(-1)[1] = x.reshape(-1)[0]                  # a tie: the first maximum wins
    gy = _sparse_exponents(rng, _output_shape(op, x, pool))
    y, dx, fmt = _ours(op, x, gy, pool)
    exact_y, exact_dx = _torch(op, x, gy, pool, _float64())
    assert fmt == "fp32" and y.dtype == dx.dtype == np.float32
    if op == "avg_pool2d":     # ours: fl32(fl32(sum) / count)
        count = np.float32(np.prod(_pairs(pool[1])))
        exact_y = (exact_y * float(count)).astype(np.float32) / count
    np.testing.assert_array_equal(y, exact_y.astype(np.float32))
    np.testing.assert_array_equal(dx, exact_dx.astype(np.float32))


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("op", OPS)
def test_pooling_equals_torch_fp32_where_its_sums_are_exact(op, pool):
    """PyTorch's fp32 kernels give our bits where their own arithmetic cannot round: max
    pool's forward always; on small multiples of 2**-8 (fp32 sums exact) everything else,
    the one division by kh kw being IEEE in both, except avg pool's backward with a count
    that is not a power of two: PyTorch rounds each share g / 9 before adding them, ours
    divides the exact sum once (the bound test covers it)."""
    rng = np.random.default_rng(5 + len(str((op, pool))))
    x = (rng.integers(-2 ** 10, 2 ** 10, pool[0]) * 2.0 ** -8).astype(np.float32)
    gy = (rng.integers(-2 ** 10, 2 ** 10, _output_shape(op, x, pool)) * 2.0 ** -8)
    y, dx, _ = _ours(op, x, gy.astype(np.float32), pool)
    torch_y, torch_dx = _torch(op, x, gy, pool, _float32())
    np.testing.assert_array_equal(y, torch_y)
    count = int(np.prod(_pairs(pool[1])))
    if op == "max_pool2d" or count & (count - 1) == 0:
        np.testing.assert_array_equal(dx, torch_dx)
    else:
        assert not np.array_equal(dx, torch_dx)          # the double rounding shows


def _float64():
    return pytest.importorskip("torch").float64


def _float32():
    return pytest.importorskip("torch").float32


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("op", OPS)
def test_pooling_matches_torch_fp32_within_the_derived_bound(op, pool):
    rng = np.random.default_rng(3 + len(str((op, pool))))
    x = rng.standard_normal(pool[0]).astype(np.float32)
    gy = rng.standard_normal(_output_shape(op, x, pool)).astype(np.float32)
    y, dx, _ = _ours(op, x, gy, pool)
    torch_y, torch_dx = _torch(op, x, gy, pool, _float32())
    m = _overlap(pool)
    if op == "max_pool2d":
        np.testing.assert_array_equal(y, torch_y)                       # it only selects
        chosen = _torch(op, x, abs(gy), pool, _float64())[1]        # S: the same choices
        bound = (gamma(m - 1) + U) * chosen
    else:
        count = int(np.prod(_pairs(pool[1])))
        window_sums = _torch(op, abs(x), gy, pool, _float64())[0] * count
        bound_y = (gamma(count + 1) + gamma(2)) * window_sums / count * (1 + 1e-12)
        assert np.all(np.abs(y - torch_y) <= bound_y)
        shares = _torch(op, x, abs(gy), pool, _float64())[1]
        bound = (gamma(m + 1) + U) * shares * (1 + 1e-12)
    assert np.all(np.abs(dx - torch_dx) <= bound)


def test_max_pool_gradient_goes_to_the_first_maximum_or_the_last_nan():
    x = np.array([[[[2.0, 2.0, 1.0, 2.0, 1.0, np.nan, 3.0, np.nan]]]])
    t = Tensor(x, requires_grad=True)
    y = ag.max_pool2d(t, (1, 4))
    y.backward(Tensor(np.ones(y.shape)))
    out = backend.to_numpy(y.data)
    assert out[0, 0, 0, 0] == 2.0 and np.isnan(out[0, 0, 0, 1])
    assert backend.to_numpy(t.grad.data).tolist() == [[[[1, 0, 0, 0, 0, 0, 0, 1]]]]


def test_max_pool_of_all_minus_inf_sends_the_gradient_to_the_first_input_element():
    """PyTorch's search starts at the window's first element inside the input: padding
    (also -inf) never takes the gradient."""
    torch = pytest.importorskip("torch")
    x = np.full((1, 1, 2, 3), -np.inf, np.float32)
    y, dx, _ = _ours("max_pool2d", x, np.ones((1, 1, 3, 4), np.float32),
                     (x.shape, 2, 1, 1))
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(tx, 2, 1, 1).backward(torch.ones((1, 1, 3, 4)))
    assert np.all(y == -np.inf)
    np.testing.assert_array_equal(dx, tx.grad.numpy())


def test_pooling_formats_under_16_mixed():
    """Pools are on neither autocast list: an fp16 input (a conv output) stays fp16, an fp32
    input stays fp32; avg pool rounds its fp32 mean once to fp16."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, (1, 2, 4, 4))
    with use_policy("16-mixed"):
        half = ag.cast(Tensor(x), "fp16")
        assert ag.max_pool2d(half, 2).fmt.name == "fp16"
        assert ag.max_pool2d(Tensor(x), 2).fmt.name == "fp32"
        avg = ag.avg_pool2d(half, 2)
    x16 = x.astype(np.float16).astype(np.float64)
    exact = x16.reshape(1, 2, 2, 2, 2, 2).sum(axis=(3, 5)) / 4      # exact in float64
    assert avg.fmt.name == "fp16"
    np.testing.assert_array_equal(backend.to_numpy(avg.data),
                                  exact.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("call,message", [
    (lambda: ag.max_pool2d(Tensor(np.ones((1, 1, 4, 4))), 2, padding=2), "at most half"),
    (lambda: ag.avg_pool2d(Tensor(np.ones((1, 4, 4))), 2), r"\(N, C, H, W\)"),
    (lambda: ag.avg_pool2d(Tensor(np.ones((1, 1, 2, 2))), 3), "smaller than"),
    (lambda: ag.max_pool2d(Tensor(np.ones((1, 1, 4, 4))), 0), "positive integer"),
])
def test_pooling_refuses_bad_geometry(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_pool_and_flatten_layers():
    x = Tensor(np.arange(2 * 3 * 4 * 4, dtype=float).reshape(2, 3, 4, 4))
    assert nn.MaxPool2d(2)(x).shape == (2, 3, 2, 2)
    assert nn.AvgPool2d(3, stride=1, padding=1)(x).shape == (2, 3, 4, 4)
    assert nn.MaxPool2d(2).stride == (2, 2) and list(nn.MaxPool2d(2).parameters()) == []
    flat = nn.Flatten()(x)
    assert flat.shape == (2, 48)
    assert np.array_equal(backend.to_numpy(flat.data), backend.to_numpy(x.data).reshape(2, 48))
    assert nn.Flatten(2)(x).shape == (2, 3, 16)
    with pytest.raises(ValueError, match="more than"):
        nn.Flatten(4)(x)


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("policy", ["32-true", "16-mixed"])
@pytest.mark.parametrize("op", OPS)
def test_pool_gradient_without_overlap_skips_the_scatter_sort(op, pool, policy, monkeypatch):
    """Windows that never overlap (stride >= kernel) send each input at most one gradient:
    the backward places them without ``scatter_sum``'s sort, the same bits as with it (max:
    the windows' first maxima, NaN windows, all -inf windows; both: -0 gradients to +0, NaN
    and inf gradients, fp16 subnormals); overlapping windows still sum by ``scatter_sum``."""
    from fpsim.autograd import ops_pool
    rng = np.random.default_rng(len(str(pool)))
    x = rng.standard_normal(pool[0]).astype(np.float32)
    x.reshape(-1)[1] = x.reshape(-1)[0]
    x[0, 0, 0, :] = -np.inf
    x[0, 0, 1, :] = -np.inf
    x.reshape(-1)[-3] = np.nan
    gy = rng.standard_normal(_output_shape(op, x, pool)).astype(np.float32)
    gy.reshape(-1)[::3] = -0.0
    gy.reshape(-1)[1], gy.reshape(-1)[2], gy.reshape(-1)[4] = np.nan, -np.inf, 2.0 ** -20
    original = ops_pool._scatter_back
    sorted_calls = []

    def always_sorted(positions, values, padded_shape, padding, in_hw, distinct=False):
        sorted_calls.append(distinct)
        return original(positions, values, padded_shape, padding, in_hw)

    with np.errstate(invalid="ignore", over="ignore"):   # avg pool's sums of inf and NaN
        _, dx, _ = _ours(op, x, gy, pool, policy)
        monkeypatch.setattr(ops_pool, "_scatter_back", always_sorted)
        _, expected, _ = _ours(op, x, gy, pool, policy)
    np.testing.assert_array_equal(dx.view(np.uint32), expected.view(np.uint32))
    assert sorted_calls == [_overlap(pool) == 1]


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("nan", [False, True])
def test_max_pool_plain_argmax_rule_picks_the_same_elements(pool, nan, monkeypatch):
    """Without padding and NaN, max pooling takes argmax's first maximum; the same values and
    gradients (bits) as the general rule (``_first_max_index``) on ties, +0 against -0,
    windows of -inf only and inf; with NaN or padding the general rule runs."""
    from fpsim.autograd import ops_pool
    rng = np.random.default_rng(len(str(pool)) + 1)
    x = rng.integers(-2, 3, pool[0]).astype(np.float32)      # many ties
    x[x == 0] = np.where(rng.random(int(np.sum(x == 0))) < 0.5, 0.0, -0.0)
    x[0, 0, :2, :] = -np.inf
    x[-1, -1, -1, -1] = np.inf
    if nan:
        x[0, -1, 0, 0] = np.nan
    gy = rng.standard_normal(_output_shape("max_pool2d", x, pool)).astype(np.float32)
    general = []
    original = ops_pool._first_max_index
    monkeypatch.setattr(ops_pool, "_first_max_index",
                        lambda *args: general.append(1) or original(*args))
    y, dx, _ = _ours("max_pool2d", x, gy, pool)
    assert bool(general) == (nan or _pairs(pool[3]) != (0, 0))
    monkeypatch.setattr(ops_pool, "_chosen_index", lambda windows, data, kernel, stride,
                        padding, out_hw: original(windows, ops_pool._first_real(
                            data.shape[2:], kernel, stride, padding, out_hw)))
    expected_y, expected_dx, _ = _ours("max_pool2d", x, gy, pool)
    np.testing.assert_array_equal(y.view(np.uint32), expected_y.view(np.uint32))
    np.testing.assert_array_equal(dx.view(np.uint32), expected_dx.view(np.uint32))
