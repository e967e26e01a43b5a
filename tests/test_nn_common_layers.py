"""The common layers of issue 43 without state of their own (Identity, AdaptiveAvgPool2d,
LeakyReLU, ELU, Softmax, LogSoftmax, Unflatten, Conv1d): each against PyTorch under
"32-true" (bit for bit where the op is exact or the data make its sums exact, else within
the bound its docstring derives), its formats under "16-mixed" / "16-true" against torch's
half kernels where CPU torch has them, and ``from_torch`` of a Sequential using it. The
gradient checks (central finite differences, float64 and fp32) are cases of
``test_autograd_gradcheck.py``; GroupNorm, Embedding's padding_idx, the stacked LSTM and
BatchNorm2d's num_batches_tracked are in ``test_nn_stateful_layers.py``.
"""
import math

import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import nn
from fpsim.autograd import Tensor, use_policy

from layer_oracles import (U, as_array, run_ours, run_torch, same_function_float64,
                           sparse_exponents, ulps)

torch = pytest.importorskip("torch")


# --- Identity, AdaptiveAvgPool2d ------------------------------------------------------------

def test_identity_returns_its_input_itself():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    assert nn.Identity()(x) is x
    assert nn.Identity()(x, "ignored", key=1) is x


@pytest.mark.parametrize("size", [(1, 1), 1, (2, 3), (3, 4), (5, 7), (4, 2)])
def test_adaptive_avg_pool_equals_torch_fp32_where_sums_are_exact(size):
    """5 x 7 into (2, 3), (3, 4), (4, 2): overlapping windows of unequal sizes. Forward: the
    exact window sum divided by kh then kw in fp32, as torch's kernel (mean for (1, 1)): bit
    for bit. Backward: ours is the exact sum of g / (kh kw) rounded once, torch's the fp32
    sum of g / kh / kw: equal for (1, 1) (mean's g / (H W)), else within
    (m + 2) u of the sum of the shares' magnitudes (m <= 4 windows hold an element)."""
    rng = np.random.default_rng(7)
    x = sparse_exponents(rng, (2, 3, 5, 7))
    with ag.no_grad():
        shape = nn.AdaptiveAvgPool2d(size)(Tensor(x)).shape
    gy = sparse_exponents(rng, shape)
    y, dx, fmt = run_ours(nn.AdaptiveAvgPool2d(size), x, gy, "32-true")
    layer = torch.nn.AdaptiveAvgPool2d(size)
    t_y, t_dx = run_torch(layer, x, gy, torch.float32)
    assert fmt == "fp32"
    np.testing.assert_array_equal(y, t_y)
    if size in ((1, 1), 1, (5, 7)):
        np.testing.assert_array_equal(dx, t_dx)
    else:
        shares = run_torch(layer, x, np.abs(gy), torch.float64)[1]
        assert np.all(np.abs(dx - t_dx) <= 6 * U * shares)


def test_adaptive_avg_pool_sequential_sum_is_torchs_kernel():
    """On any data, a sequential fp32 sum of each window (torch's loop) gives torch's bits:
    the windows, their order and the two divisions are PyTorch's."""
    x = np.random.default_rng(3).standard_normal((2, 3, 9, 11)).astype(np.float32)
    for size in ((2, 3), (4, 5), (7, 3)):
        with use_policy("32-true"):
            y = ag.adaptive_avg_pool2d(Tensor(x), size, accumulation="sequential:fp32")
        t_y = torch.nn.functional.adaptive_avg_pool2d(torch.tensor(x), size)
        np.testing.assert_array_equal(as_array(y), t_y.numpy())


@pytest.mark.parametrize("policy", ["16-mixed", "16-true"])
@pytest.mark.parametrize("size", [(1, 1), (3, 4)])
def test_adaptive_avg_pool_fp16_equals_torch_half(policy, size):
    """On neither autocast list: fp16 in, fp16 out (torch's half kernel: float sum, divide,
    cast), bit for bit where the sums are exact."""
    rng = np.random.default_rng(11)
    x = sparse_exponents(rng, (2, 2, 5, 7))
    with ag.no_grad():
        shape = nn.AdaptiveAvgPool2d(size)(Tensor(x)).shape
    gy = sparse_exponents(rng, shape)
    y, _, fmt = run_ours(nn.AdaptiveAvgPool2d(size), x, gy, policy, "fp16")
    t_y, _ = run_torch(torch.nn.AdaptiveAvgPool2d(size), x, gy, torch.float16)
    assert fmt == "fp16"
    np.testing.assert_array_equal(y, t_y)


def test_adaptive_avg_pool_refuses_bad_sizes_by_name():
    with pytest.raises(ValueError, match="output_size"):
        nn.AdaptiveAvgPool2d(0)
    with pytest.raises(ValueError, match="output_size takes an int or a pair"):
        nn.AdaptiveAvgPool2d((1, 2, 3))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        nn.AdaptiveAvgPool2d(1)(Tensor(np.ones((2, 3))))
    with pytest.raises(ValueError, match=r"output_size \(None, 2\): None \(keep"):
        nn.from_torch(torch.nn.AdaptiveAvgPool2d((None, 2)))


def test_resnet_style_head_converts():
    """Conv, ReLU, an Identity shortcut placeholder, global pooling, Flatten, Linear."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Identity(), torch.nn.AdaptiveAvgPool2d((1, 1)),
                                torch.nn.Flatten(), torch.nn.Linear(4, 3))
    ours = nn.from_torch(model)
    assert [type(m).__name__ for m in ours][2:4] == ["Identity", "AdaptiveAvgPool2d"]
    x = np.random.default_rng(1).standard_normal((3, 2, 6, 5))
    same_function_float64(model, nn.from_torch, x)
    pooled = nn.from_torch(torch.nn.AdaptiveAvgPool2d(3))
    assert pooled.output_size == (3, 3)


# --- LeakyReLU, ELU, Softmax, LogSoftmax, Unflatten -----------------------------------------

def _specials(rng, shape):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[:5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    return x


@pytest.mark.parametrize("slope", [0.01, 0.2, -1.5])
def test_leaky_relu_equals_torch_fp32_bit_for_bit(slope):
    """One float32 product, as torch's kernel: the same bits, NaN, +-0 and +-inf included,
    forward and backward."""
    rng = np.random.default_rng(5)
    x = _specials(rng, (4, 9))
    gy = rng.standard_normal((4, 9)).astype(np.float32)
    y, dx, fmt = run_ours(nn.LeakyReLU(slope), x, gy, "32-true")
    t_y, t_dx = run_torch(torch.nn.LeakyReLU(slope), x, gy, torch.float32)
    assert fmt == "fp32"
    np.testing.assert_array_equal(y.view(np.uint32)[~np.isnan(y)],
                                  t_y.view(np.uint32)[~np.isnan(t_y)])
    assert np.array_equal(np.isnan(y), np.isnan(t_y))
    np.testing.assert_array_equal(dx, t_dx)


@pytest.mark.parametrize("policy", ["16-mixed", "16-true"])
def test_leaky_relu_fp16_equals_torch_half(policy):
    """On neither autocast list: fp16 stays fp16, torch's half kernel (float product, cast)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 7)).astype(np.float16).astype(np.float32)
    gy = rng.standard_normal((3, 7)).astype(np.float16).astype(np.float32)
    y, dx, fmt = run_ours(nn.LeakyReLU(0.1), x, gy, policy, "fp16")
    t_y, t_dx = run_torch(torch.nn.LeakyReLU(0.1), x, gy, torch.float16)
    assert fmt == "fp16"
    np.testing.assert_array_equal(y, t_y)
    np.testing.assert_array_equal(dx, t_dx)


@pytest.mark.parametrize("alpha,bound", [(1.0, 1), (1.5, 2)])
def test_elu_matches_torch_fp32_within_its_bound(alpha, bound):
    """Ours: alpha expm1(x) in float64, rounded once; torch's: expm1 rounded, then times
    alpha (exact for alpha = 1): within 1 (alpha = 1) or 2 fp32 ulps; x >= 0, NaN, -0.0 and
    +-inf exactly. Gradients: ours g alpha e**x rounded once, torch's three fp32 products:
    within 3 ulps."""
    rng = np.random.default_rng(8)
    x = _specials(rng, (6, 50))
    gy = rng.standard_normal((6, 50)).astype(np.float32)
    y, dx, fmt = run_ours(nn.ELU(alpha), x, gy, "32-true")
    t_y, t_dx = run_torch(torch.nn.ELU(alpha), x, gy, torch.float32)
    assert fmt == "fp32"
    assert ulps(y, t_y).max() <= bound
    exact = ~(x < 0)
    np.testing.assert_array_equal(y[exact].view(np.uint32)[~np.isnan(y[exact])],
                                  t_y[exact].view(np.uint32)[~np.isnan(t_y[exact])])
    assert ulps(dx, t_dx).max() <= 3


@pytest.mark.parametrize("policy", ["16-mixed", "16-true"])
def test_elu_fp16_matches_torch_half(policy):
    """fp16 stays fp16; torch's half kernel rounds its float result once more: the same bits
    but where its float value lay within 2 fp32 ulps of an fp16 rounding boundary."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((8, 64)) * 3).astype(np.float16).astype(np.float32)
    gy = np.ones_like(x)
    y, dx, fmt = run_ours(nn.ELU(), x, gy, policy, "fp16")
    t_y, t_dx = run_torch(torch.nn.ELU(), x, gy, torch.float16)
    assert fmt == "fp16"
    differ = y != t_y
    assert differ.mean() < 0.01
    assert np.all(np.abs(y - t_y)[differ] <= np.spacing(np.abs(t_y[differ]).astype(np.float16)))


@pytest.mark.parametrize("cls", ["Softmax", "LogSoftmax"])
def test_softmax_modules_are_the_ops_along_dim(cls):
    """The modules call the correctly rounded ops along ``dim``: torch's fp32 softmax is
    within 2 ulps (its exp and sum round), its log_softmax within its cancellation's bound;
    under "16-mixed" (autocast's float32 list) an fp16 input gives an fp32 output."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    op = ag.softmax if cls == "Softmax" else ag.log_softmax
    for dim in (0, 1, -1):
        ours = getattr(nn, cls)(dim)
        with use_policy("32-true"):
            y = ours(Tensor(x))
            np.testing.assert_array_equal(as_array(y), as_array(op(Tensor(x), dim)))
        t_y = getattr(torch.nn, cls)(dim)(torch.tensor(x)).numpy()
        if cls == "Softmax":
            assert ulps(as_array(y), t_y).max() <= 2
        else:       # torch: x - (m + L), L the log of a rounded sum of rounded exps
            top = x.max(dim, keepdims=True).astype(np.float64)
            log_sum = np.log(np.exp(x - top).sum(dim, keepdims=True))
            bound = 4 * U * (np.abs(x) + np.abs(top) + 2 * log_sum + np.abs(t_y))
            assert np.all(np.abs(as_array(y).astype(np.float64) - t_y) <= bound)
    with use_policy("16-mixed"):
        assert getattr(nn, cls)(1)(Tensor(x, "fp16")).fmt.name == "fp32"
    with pytest.raises(TypeError, match="dim must be an integer axis such as -1, got"):
        getattr(nn, cls)(None)
    with pytest.raises(ValueError, match="dim=None"):
        nn.from_torch(getattr(torch.nn, cls)())


@pytest.mark.parametrize("cls", ["Softmax", "LogSoftmax"])
def test_softmax_modules_fp16_within_one_ulp_of_torch_half(cls):
    """"16-true": fp16 in, fp16 out, correctly rounded; torch's half kernel computes in
    float and rounds once more: within one fp16 ulp."""
    x = np.random.default_rng(27).standard_normal((4, 9)).astype(np.float16).astype(np.float32)
    with use_policy("16-true"):
        y = getattr(nn, cls)(-1)(Tensor(x, "fp16"))
    assert y.fmt.name == "fp16"
    t_y = getattr(torch.nn, cls)(-1)(torch.tensor(x).half()).float().numpy()
    spacing = np.spacing(np.abs(t_y).astype(np.float16)).astype(np.float32)
    assert np.all(np.abs(as_array(y) - t_y) <= spacing)


def test_unflatten_is_torchs_reshape():
    x = np.arange(2 * 12 * 5, dtype=np.float32).reshape(2, 12, 5)
    for dim, sizes in ((1, (3, 4)), (-2, (2, -1)), (-1, (5, 1))):
        y = nn.Unflatten(dim, sizes)(Tensor(x))
        t_y = torch.nn.Unflatten(dim, sizes)(torch.tensor(x)).numpy()
        assert y.shape == t_y.shape
        np.testing.assert_array_equal(as_array(y), t_y)
    with pytest.raises(ValueError, match="at most one -1"):
        nn.Unflatten(1, (-1, -1))
    with pytest.raises(TypeError, match="unflattened_size must be a tuple of sizes"):
        nn.Unflatten(1, 3)
    with pytest.raises(ValueError, match="unflattened_size must be a positive integer"):
        nn.Unflatten(1, (0, 3))
    with pytest.raises(ValueError, match=r"Unflatten\(dim=3\) is out of range"):
        nn.Unflatten(3, (1, 1))(Tensor(x))


def test_activation_sequential_converts():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LeakyReLU(0.05),
                                torch.nn.Linear(8, 8), torch.nn.ELU(0.7),
                                torch.nn.Unflatten(1, (2, 4)), torch.nn.Softmax(-1),
                                torch.nn.Flatten(), torch.nn.LogSoftmax(1))
    ours = nn.from_torch(model)
    assert [type(m).__name__ for m in ours] == ["Linear", "LeakyReLU", "Linear", "ELU",
                                                 "Unflatten", "Softmax", "Flatten",
                                                 "LogSoftmax"]
    assert (ours[1].negative_slope, ours[3].alpha, ours[4].unflattened_size) == \
        (0.05, 0.7, (2, 4))
    x = np.random.default_rng(2).standard_normal((5, 6))
    same_function_float64(model, nn.from_torch, x)
    with pytest.raises(ValueError, match="ELU at '0': inplace=True"):
        nn.from_torch(torch.nn.Sequential(torch.nn.ELU(inplace=True)))


# --- Conv1d ---------------------------------------------------------------------------------

def _direct_conv1d(x, weight, bias, stride, padding, dilation, accumulation):
    """A 1-D convolution written directly: each output position's (channel, tap) column
    gathered, one ``linear`` with the (out, C k) weight (no conv2d anywhere)."""
    n, c, length = x.shape
    out, _, k = weight.shape
    if padding:
        zeros = Tensor(np.zeros((n, c, padding)), x.fmt)
        x = ag.concatenate([zeros, x, zeros], axis=2)
    positions = (length + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    taps = np.array([[t * stride + j * dilation for j in range(k)] for t in range(positions)])
    columns = x[:, :, taps].transpose(0, 2, 1, 3).reshape(n, positions, c * k)
    y = ag.linear(columns, weight.reshape(out, c * k), bias, accumulation=accumulation)
    return y.transpose(0, 2, 1)


@pytest.mark.parametrize("policy", ["32-true", "16-mixed", "16-true", "bf16-mixed"])
@pytest.mark.parametrize("accumulation", [None, "sequential:fp32", "blocked:4:fp32"])
def test_conv1d_has_the_bits_of_a_direct_conv1d(policy, accumulation):
    """Conv1d runs conv2d on a height-1 image: its output and its weight and bias gradients
    (one GEMM each) equal, bit for bit, a direct 1-D convolution's under each policy and
    accumulation model. (The direct form's input gradient rounds each column's share, then
    their sum: conv2d's rounds once, as the next test shows.)"""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 3, 11))
    gy = rng.standard_normal((2, 4, 5))
    results = []
    for direct in (False, True):
        with use_policy(policy):
            layer = nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2, rng=1,
                              accumulation=accumulation)
            t = Tensor(x, requires_grad=True)
            y = (_direct_conv1d(t, layer.weight, layer.bias, 2, 1, 2, accumulation) if direct
                 else layer(t))
            y.backward(Tensor(gy, y.fmt))
        results.append([y.fmt.name] + [as_array(v) for v in (y, layer.weight.grad,
                                                       layer.bias.grad)])
    ours, direct = results
    assert ours[0] == direct[0]
    for a, b in zip(ours[1:], direct[1:]):
        np.testing.assert_array_equal(a, b)


def test_conv1d_input_gradient_is_the_exact_sum_rounded_once():
    """Each input's gradient sums g w over the (output, tap) pairs that read it: under
    "32-true" with exact accumulation, that exact sum rounded once to fp32."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 3, 11))
    gy = rng.standard_normal((2, 4, 5)).astype(np.float32)
    with use_policy("32-true"):
        layer = nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2, rng=1)
        t = Tensor(x, requires_grad=True)
        layer(t).backward(Tensor(gy))
    w = as_array(layer.weight).astype(np.float64)
    expected = np.zeros(x.shape, np.float32)
    for n, c, i in np.ndindex(*x.shape):
        terms = [float(gy[n, o, pos]) * w[o, c, j] for o in range(4) for j in range(3)
                 for pos in range(5) if pos * 2 + j * 2 - 1 == i]
        expected[n, c, i] = np.float32(math.fsum(terms))     # products exact in float64
    np.testing.assert_array_equal(as_array(t.grad), expected)


@pytest.mark.parametrize("groups", [1, 2])
def test_conv1d_equals_torch_fp32_where_sums_are_exact(groups):
    """Small integers: every product and sum is exact in fp32, so torch's bits are ours."""
    rng = np.random.default_rng(13)

    def integers(shape):
        return rng.integers(-8, 9, shape).astype(np.float32)

    x = integers((2, 4, 9))
    theirs = torch.nn.Conv1d(4, 6, 3, stride=1, padding=2, dilation=2, groups=groups)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(integers(theirs.weight.shape)))
        theirs.bias.copy_(torch.tensor(integers((6,))))
    with use_policy("32-true"):
        ours = nn.from_torch(theirs)
    assert isinstance(ours, nn.Conv1d) and ours.weight.shape == (6, 4 // groups, 3)
    gy = integers((2, 6, 9))
    y, dx, _ = run_ours(ours, x, gy, "32-true")
    t_y, t_dx = run_torch(theirs, x, gy, torch.float32)
    np.testing.assert_array_equal(y, t_y)
    np.testing.assert_array_equal(dx, t_dx)
    np.testing.assert_array_equal(as_array(ours.weight.grad), theirs.weight.grad.numpy())
    np.testing.assert_array_equal(as_array(ours.bias.grad), theirs.bias.grad.numpy())


@pytest.mark.parametrize("policy", ["16-true", "16-mixed"])
def test_conv1d_fp16_equals_torch_half_where_sums_are_exact(policy):
    """fp16 operands (the `matmul` category), fp16 out; small integers keep every sum
    exact, so torch's half kernel gives the same bits."""
    rng = np.random.default_rng(26)
    x = rng.integers(-4, 5, (2, 4, 9)).astype(np.float32)
    theirs = torch.nn.Conv1d(4, 6, 3, padding=1, groups=2)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(rng.integers(-4, 5, (6, 2, 3)).astype(np.float32)))
        theirs.bias.copy_(torch.tensor(rng.integers(-4, 5, 6).astype(np.float32)))
    gy = rng.integers(-4, 5, (2, 6, 9)).astype(np.float32)
    with use_policy(policy):
        ours = nn.from_torch(theirs)
    y, dx, fmt = run_ours(ours, x, gy, policy, "fp16")
    t_y, t_dx = run_torch(theirs.half(), x, gy, torch.float16)
    assert fmt == "fp16"
    np.testing.assert_array_equal(y, t_y)
    np.testing.assert_array_equal(dx, t_dx)


def test_conv1d_init_and_refusals():
    layer = nn.Conv1d(4, 2, 5, rng=3)
    bound = 1 / np.sqrt(4 * 5)
    assert np.all(np.abs(as_array(layer.weight)) <= bound) and layer.weight.shape == (2, 4, 5)
    assert nn.Conv1d(4, 2, (5,), stride=(2,)).stride == 2
    with pytest.raises(ValueError, match=r"Conv1d expects input \(N, 4, L\), got shape"):
        layer(Tensor(np.ones((4, 7))))
    with pytest.raises(ValueError, match="kernel_size takes an int or a tuple of one int"):
        nn.Conv1d(4, 2, (3, 3))
    with pytest.raises(ValueError, match="groups=3 must divide"):
        nn.Conv1d(4, 2, 3, groups=3)
    with pytest.raises(ValueError, match="only numeric zero padding"):
        nn.from_torch(torch.nn.Conv1d(2, 2, 3, padding="same"))
