"""conv2d (im2col through the exact matmul) and the image layers: exactness against float64
references, agreement with PyTorch's fp32 conv within a derived bound, 16-mixed formats, and
``nn.Conv2d`` / a tiny CNN.

The bound against PyTorch. Every output of conv2d and each of its three gradients is one
dot product of K terms (a bias is one more term, times 1). For any summation order, with or
without FMA, fp32 arithmetic (unit roundoff u = 2**-24) gives
|fl(s) - s| <= gamma_K S, with S the sum of the terms' magnitudes and gamma_K = K u / (1 - K u)
(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.5). Ours is the exact
s rounded once to fp32 (|error| <= u |s| <= gamma_1 S), twice with a bias (the fp32 epilogue:
<= gamma_2 S). So |ours - torch| <= (gamma_K + gamma_2) S, S computed in float64 from the
magnitudes (its own relative error, below 1e-13 here, is covered by a factor 1 + 1e-12).
"""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy

U = 2.0 ** -24

# (N, C, H, W, O, kernel, stride, padding, dilation, groups)
GEOMETRIES = [
    (2, 3, 7, 6, 4, 3, 1, 1, 1, 1),
    (2, 4, 9, 8, 6, 3, 2, 2, 1, 2),
    (1, 2, 10, 9, 4, (2, 3), (2, 3), (3, 0), (2, 1), 2),
    (2, 3, 5, 5, 3, 1, 1, 0, 1, 1),
    (1, 1, 6, 6, 2, 2, 3, 4, 2, 1),   # padding > d (k - 1): gradient rows land on padding
]


def gamma(k: int) -> float:
    return k * U / (1 - k * U)


def _pairs(value):
    return value if isinstance(value, tuple) else (value, value)


def _shapes(geometry):
    n, c, h, w, o, kernel, _, _, _, groups = geometry
    return (n, c, h, w), (o, c // groups) + _pairs(kernel), (o,)


def _options(geometry):
    stride, padding, dilation, groups = geometry[6:]
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


def _ours(policy, x, w, b, gy, geometry):
    """conv2d under ``policy``: output, dx, dW, db as host arrays, and the output format."""
    with use_policy(policy):
        tensors = [Tensor(v, requires_grad=True) for v in (x, w, b)]
        y = ag.conv2d(*tensors, **_options(geometry))
        y.backward(Tensor(gy, y.fmt))
    return [backend.to_numpy(t.data) for t in [y] + [t.grad for t in tensors]], y.fmt.name


def _torch(x, w, b, gy, geometry, dtype, *, bias=True):
    """PyTorch's conv2d and its gradients in ``dtype``, as float64 host arrays."""
    torch = pytest.importorskip("torch")
    tensors = [torch.tensor(v, dtype=dtype, requires_grad=True) for v in (x, w, b)]
    y = torch.nn.functional.conv2d(tensors[0], tensors[1], tensors[2] if bias else None,
                                   **_options(geometry))
    y.backward(torch.tensor(gy, dtype=dtype))
    grads = [t.grad.double().numpy() if t.grad is not None else None for t in tensors]
    return [y.detach().double().numpy()] + grads


def _dyadic(rng, shape, bits, scale):
    """Integers of ``bits`` bits times 2**-scale: float64 sums of their products are exact."""
    return rng.integers(-2 ** bits, 2 ** bits, shape) * 2.0 ** -scale


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_conv2d_is_the_exact_dot_product_rounded_once(geometry):
    """32-true: every value (forward and the three gradients) is the exact float64 result
    (torch float64 on dyadic data: every partial sum is exact) rounded to fp32, the bias
    added in fp32 after that rounding. The data need ~30 bits (at most 2**44 units), so fp32
    rounds."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(len(str(geometry)))
    xs, ws, bs = _shapes(geometry)
    x, w, b = _dyadic(rng, xs, 14, 6), _dyadic(rng, ws, 14, 9), _dyadic(rng, bs, 14, 3)
    with use_policy("32-true"), ag.no_grad():
        y_shape = ag.conv2d(Tensor(x), Tensor(w), **_options(geometry)).shape
    gy = _dyadic(rng, y_shape, 14, 3)
    (y, dx, dw, db), fmt = _ours("32-true", x, w, b, gy, geometry)
    exact_y, exact_dx, exact_dw, _ = _torch(x, w, b, gy, geometry, _float64(),
                                                   bias=False)
    assert fmt == "fp32"
    expected_y = (exact_y.astype(np.float32) + b.astype(np.float32)[None, :, None, None])
    for ours, expected in [(y, expected_y), (dx, exact_dx), (dw, exact_dw),
                           (db, gy.sum(axis=(0, 2, 3)))]:
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours.view(np.uint32),
                                      expected.astype(np.float32).view(np.uint32))
    assert not np.array_equal(exact_y, exact_y.astype(np.float32))   # fp32 did round


def _float64():
    return pytest.importorskip("torch").float64


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_conv2d_matches_torch_fp32_within_the_derived_bound(geometry):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7 + len(str(geometry)))
    xs, ws, bs = _shapes(geometry)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (xs, ws, bs))
    with use_policy("32-true"), ag.no_grad():
        y_shape = ag.conv2d(Tensor(x), Tensor(w), **_options(geometry)).shape
    gy = rng.standard_normal(y_shape).astype(np.float32)
    ours, _ = _ours("32-true", x, w, b, gy, geometry)
    theirs = _torch(x, w, b, gy, geometry, torch.float32)
    # S: the same dot products on the magnitudes, in float64 (bias: one more term)
    sums = _torch(abs(x), abs(w), abs(b), abs(gy), geometry, torch.float64)
    sums[3] = abs(gy).sum(axis=(0, 2, 3))
    o, cg, kh, kw = ws
    groups = geometry[9]
    terms = [cg * kh * kw + 1, o // groups * kh * kw, gy[:, 0].size, gy[:, 0].size]
    for name, a, t, s, k in zip(["y", "dx", "dW", "db"], ours, theirs, sums, terms):
        bound = (gamma(k) + gamma(2)) * s * (1 + 1e-12)
        error = np.abs(a.astype(np.float64) - t)
        assert np.all(error <= bound), (name, float(np.max(error / bound)))


def _away_from_zero(rng, shape, low, high):
    """Magnitudes in [low, high], random signs: their fp16 values have bits no lower than
    2**-12 here, so float64 sums of their products are exact."""
    return rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape)


def test_conv2d_16_mixed_rounds_to_fp16_after_the_fp32_epilogue():
    """Under "16-mixed" x, w, b are cast to fp16 (autocast's float16 list), the exact dot
    product is rounded to fp32, the fp16 bias added in fp32, then one rounding to fp16; the
    gradients are fp16 values, widened into the fp32 leaves' gradients."""
    rng = np.random.default_rng(16)
    geometry = GEOMETRIES[1]
    xs, ws, bs = _shapes(geometry)
    x, w, b = (_away_from_zero(rng, s, 0.25, 2.0) for s in (xs, ws, bs))
    x16, w16, b16 = (v.astype(np.float16).astype(np.float64) for v in (x, w, b))
    with use_policy("64-true"), ag.no_grad():   # float64 of fp16 values: exact sums here
        exact = backend.to_numpy(ag.conv2d(Tensor(x16), Tensor(w16), **_options(geometry)).data)
    gy = _away_from_zero(rng, exact.shape, 0.25, 1.0).astype(np.float16).astype(np.float64)
    (y, dx, dw, db), fmt = _ours("16-mixed", x, w, b, gy, geometry)
    assert fmt == "fp16"
    expected = (exact.astype(np.float32) + b16.astype(np.float32)[None, :, None, None])
    np.testing.assert_array_equal(y, expected.astype(np.float16).astype(np.float32))
    with use_policy("64-true"):
        tensors = [Tensor(v, requires_grad=True) for v in (x16, w16, b16)]
        ag.conv2d(*tensors, **_options(geometry)).backward(Tensor(gy))
    for ours, t in zip((dx, dw, db), tensors):
        exact_grad = backend.to_numpy(t.grad.data)
        np.testing.assert_array_equal(
            ours, exact_grad.astype(np.float32).astype(np.float16).astype(np.float32))


def test_conv2d_in_sequential_fp16_accumulation_stalls():
    """The accumulation model decides every sum: 4096 ones in an fp16 accumulator stop at
    2048 (the exact model gives 4096)."""
    x = Tensor(np.ones((1, 1024, 2, 2)))
    w = Tensor(np.ones((1, 1024, 2, 2)))
    assert float(backend.to_numpy(ag.conv2d(x, w).data)[0, 0, 0, 0]) == 4096.0
    stalled = ag.conv2d(x, w, accumulation="sequential:fp16")
    assert float(backend.to_numpy(stalled.data)[0, 0, 0, 0]) == 2048.0


@pytest.mark.parametrize("call,message", [
    (lambda: ag.conv2d(Tensor(np.ones((1, 3, 4, 4))), Tensor(np.ones((2, 2, 3, 3)))),
     "channels per group"),
    (lambda: ag.conv2d(Tensor(np.ones((1, 3, 4, 4))), Tensor(np.ones((2, 1, 3, 3))),
                       groups=3), "must divide"),
    (lambda: ag.conv2d(Tensor(np.ones((3, 4, 4))), Tensor(np.ones((2, 3, 3, 3)))),
     r"\(N, C, H, W\)"),
    (lambda: ag.conv2d(Tensor(np.ones((1, 1, 2, 2))), Tensor(np.ones((1, 1, 3, 3)))),
     "smaller than"),
    (lambda: ag.conv2d(Tensor(np.ones((1, 1, 4, 4))), Tensor(np.ones((2, 1, 3, 3))),
                       Tensor(np.ones(3))), "bias shape"),
    (lambda: ag.conv2d(Tensor(np.ones((1, 1, 4, 4))), Tensor(np.ones((2, 1, 3, 3))),
                       stride=0), "stride must be a positive integer"),
])
def test_conv2d_refuses_bad_shapes_with_a_clear_message(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_conv2d_layer_parameters_and_pytorch_init_bound():
    layer = nn.Conv2d(6, 4, (3, 2), groups=2, rng=5)
    params = dict(layer.named_parameters())
    assert list(params) == ["weight", "bias"]
    assert params["weight"].shape == (4, 3, 3, 2) and params["bias"].shape == (4,)
    bound = 1 / np.sqrt(3 * 3 * 2)                  # fan_in = in/groups * kh * kw
    for p in params.values():
        values = backend.to_numpy(p.data)
        assert p.fmt.name == "fp32" and np.all(np.abs(values) <= bound)
        assert np.max(np.abs(values)) > 0.6 * bound
    again = nn.Conv2d(6, 4, (3, 2), groups=2, rng=5)
    assert np.array_equal(backend.to_numpy(again.weight.data), backend.to_numpy(layer.weight.data))
    assert nn.Conv2d(2, 3, 1, bias=False).bias is None
    with pytest.raises(ValueError, match="must divide"):
        nn.Conv2d(3, 4, 3, groups=2)
    with use_policy("16-true"):
        assert nn.Conv2d(1, 1, 3).weight.fmt.name == "fp16"


def test_tiny_cnn_trains_under_16_mixed():
    """Conv2d -> ReLU -> MaxPool2d -> Flatten -> Linear: the loss falls over SGD steps."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((16, 1, 6, 6))
    labels = (images[:, 0, :3].sum(axis=(1, 2)) > images[:, 0, 3:].sum(axis=(1, 2))).astype(int)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(36, 2, rng=2))
    losses = []
    for _ in range(15):
        model.zero_grad()
        with use_policy("16-mixed"):
            loss = ag.cross_entropy(model(Tensor(images)), labels)
            loss.backward()
        losses.append(loss.item())
        for p in model.parameters():
            step = backend.scalar(0.2, backend.xp.float32) * p.grad.data
            p.data = backend.round_to(p.data - step, p.fmt)
    assert losses[-1] < 0.6 * losses[0]


@pytest.mark.numpy_only
def test_conv2d_forward_unfolds_in_bands_of_at_most_the_input():
    """The forward pass's peak memory beyond its output stays under 4 times the input (the
    whole im2col would be 9 times, 18 in the float64 copy the exact matmul makes); tracemalloc
    sees NumPy's allocations."""
    import tracemalloc

    rng = np.random.default_rng(4)
    x = Tensor(rng.standard_normal((16, 16, 32, 32)))
    w = Tensor(rng.standard_normal((16, 16, 3, 3)))
    ag.conv2d(x, w, padding=1)                       # work buffers the matmul keeps
    tracemalloc.start()
    try:
        y = ag.conv2d(x, w, padding=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    input_bytes = backend.to_numpy(x.data).nbytes
    assert (peak - backend.to_numpy(y.data).nbytes) < 4 * input_bytes
