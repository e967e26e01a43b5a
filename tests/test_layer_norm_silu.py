"""layer_norm, silu and their layers (``nn.LayerNorm``, ``nn.SiLU``), ``nn.ModuleList``.

Exactness: against MPFR (gmpy2 at 300 bits, rounded once by MPFR to the format). silu is
certified correctly rounded; layer_norm is a float64 evaluation rounded once (its module
doc), so the MPFR comparison shows it correctly rounded on these data, not in general.

Bounds against PyTorch's fp32 CPU kernels (u = 2**-24, gamma_k = k u / (1 - k u)), first
order in u with a relative margin of 2**-10 for the second-order terms; each bound adds our
own error (the exact value rounded once: u |exact|) and 2**-40 of the magnitudes for the
float64 evaluations of the reference and of the bound itself:

- layer_norm forward: from PyTorch's own mean m' and rstd r' (``torch.native_layer_norm``
  returns them), any of its forms, (x r' + (-m' r')) w + b or (x - m') r' w + b, rounds at most
  4 times on terms bounded by (|x| + |m'|) r' |w| and |b|: gamma_4 of their sum; plus
  |y(m', r') - y(m, r)|, computed.
- layer_norm backward (PyTorch's CPU formula: ds = sum dy w x, db = sum dy w,
  b' = (db m' - ds) r'**3 / N, c' = -b' m' - db r' / N, dx = r' dy w + b' x + c'): the
  running error bound of those steps (``_torch_dx_bound``), plus |dx(m', r') - dx(m, r)|;
  dw = sum dy (x r' + (-m' r')): gamma_(R+4) of sum |dy| (|x| + |m'|) r', plus the effect of
  m', r'; db = sum dy: gamma_R of sum |dy|.
- silu, PyTorch's x / (1 + exp(-x)) and dy s (1 + x (1 - s)), s = 1 / (1 + exp(-x)), with its
  exp within 1 ulp (SLEEF's u10 functions, or glibc's expf): the running error bound of those
  steps (``_torch_silu_bounds``), for |x| <= 80 (beyond, PyTorch's exp(-x) overflows to inf and
  it returns -0 for silu values fp32 still holds as subnormals).
"""
import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy

gmpy2 = pytest.importorskip("gmpy2")

from mpfr_oracle import mpfr_rounded  # noqa: E402 (it imports gmpy2: after the skip)

U = 2.0 ** -24
SECOND_ORDER = 1 + 2.0 ** -10
EPS = 1e-5


def gamma(k: int) -> float:
    return k * U / (1 - k * U)


def _ours_layer_norm(policy, x, w, b, g, shape):
    with use_policy(policy):
        tensors = [Tensor(v, requires_grad=True) for v in (x, w, b)]
        y = ag.layer_norm(tensors[0], shape, tensors[1], tensors[2], eps=EPS)
        y.backward(Tensor(g))
    return y.fmt.name, [backend.to_numpy(t.data) for t in [y] + [t.grad for t in tensors]]


def _exact_layer_norm(x, w, b, g, n):
    """y, dx, dw, db at 300 bits (flat lists of mpfr, C order)."""
    rows_x, rows_g = x.reshape(-1, n).tolist(), g.reshape(-1, n).tolist()
    w, b = w.reshape(-1).tolist(), b.reshape(-1).tolist()
    ys, dxs, dw, db = [], [], [0] * n, [0] * n
    with gmpy2.context(precision=300):
        for xr, gr in zip(rows_x, rows_g):
            xr = [gmpy2.mpfr(v) for v in xr]
            m = gmpy2.fsum(xr) / n
            d = [v - m for v in xr]
            r = 1 / gmpy2.sqrt(gmpy2.fsum([v * v for v in d]) / n + gmpy2.mpfr(EPS))
            x_hat = [v * r for v in d]
            ys += [h * wi + bi for h, wi, bi in zip(x_hat, w, b)]
            gw = [gmpy2.mpfr(gi) * wi for gi, wi in zip(gr, w)]
            mean_gw = gmpy2.fsum(gw) / n
            mean_gwx = gmpy2.fsum([a * h for a, h in zip(gw, x_hat)]) / n
            dxs += [r * (a - mean_gw - h * mean_gwx) for a, h in zip(gw, x_hat)]
            dw = [acc + gmpy2.mpfr(gi) * h for acc, gi, h in zip(dw, gr, x_hat)]
            db = [acc + gmpy2.mpfr(gi) for acc, gi in zip(db, gr)]
    return ys, dxs, dw, db


def _data(seed, shape, n_shape, shift=0.0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) + shift).astype(np.float32)
    w, b = (rng.standard_normal(n_shape).astype(np.float32) for _ in range(2))
    return x, w, b, rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("shape,n_shape,shift", [((3, 16), (16,), 0.0), ((2, 2, 3, 5), (3, 5), 0.0),
                                                ((4, 12), (12,), 1000.0)])
def test_layer_norm_is_the_exact_value_rounded_once(shape, n_shape, shift):
    """32-true, forward and the three gradients equal to MPFR's rounding of the exact values
    (the last case: a mean 1000 times the spread, where the float64 error grows 1000-fold)."""
    x, w, b, g = _data(len(shape) + int(shift), shape, n_shape, shift)
    fmt, ours = _ours_layer_norm("32-true", x, w, b, g, n_shape)
    assert fmt == "fp32"
    exact = _exact_layer_norm(x, w, b, g, int(np.prod(n_shape)))
    for mine, values, target in zip(ours, exact, (x, x, w, b)):
        expected = mpfr_rounded(values, "fp32").reshape(target.shape)
        np.testing.assert_array_equal(mine.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("policy,fmt", [("16-mixed", "fp32"), ("16-true", "fp16"),
                                        ("bf16-mixed", "fp32")])
def test_layer_norm_format_follows_autocast(policy, fmt):
    """Autocast runs layer_norm in fp32 (mixed policies: fp32 out of an fp16 input); with
    "16-true" (no autocast) fp16 in gives fp16 out. Values: MPFR's rounding of the exact
    layer norm of the inputs as they are in that format."""
    x, w, b, g = _data(3, (4, 8), (8,))
    low = "fp16" if policy != "bf16-mixed" else "bf16"
    x_low = ag.cast(Tensor(x), low)
    with use_policy(policy):
        params = [Tensor(v, requires_grad=True) for v in (w, b)]
        y = ag.layer_norm(x_low, 8, *params, eps=EPS)
    assert y.fmt.name == fmt
    exact, *_ = _exact_layer_norm(backend.to_numpy(x_low.data), backend.to_numpy(params[0].data),
                                  backend.to_numpy(params[1].data), g, 8)
    np.testing.assert_array_equal(backend.to_numpy(y.data),
                                  mpfr_rounded(exact, fmt).reshape(x.shape))


def _torch_dx_bound(x, w, g, m, r, n):
    """First-order running error bound of PyTorch's CPU layer-norm input gradient, row by
    row, from its own mean m and rstd r (float64 arrays (R, 1))."""
    gw = np.abs(g * w)
    ds, db = (g * w * x).sum(1, keepdims=True), (g * w).sum(1, keepdims=True)
    e_ds = gamma(n + 1) * (gw * np.abs(x)).sum(1, keepdims=True)
    e_db = gamma(n) * gw.sum(1, keepdims=True)
    p = db * m - ds
    e_p = e_db * np.abs(m) + e_ds + gamma(2) * (np.abs(db * m) + np.abs(ds))
    bb = p * r ** 3 / n
    e_b = e_p * r ** 3 / n + gamma(5) * np.abs(bb)
    c = -bb * m - db * r / n
    e_c = e_b * np.abs(m) + e_db * r / n + gamma(4) * (np.abs(bb * m) + np.abs(db) * r / n)
    return (gamma(4) * (r * gw + np.abs(bb * x) + np.abs(c)) + e_b * np.abs(x) + e_c), \
        r * g * w + bb * x + c


def test_layer_norm_matches_torch_fp32_within_the_derived_bound():
    torch = pytest.importorskip("torch")
    n = 24
    x, w, b, g = _data(11, (6, n), (n,))
    _, (y, dx, dw, db) = _ours_layer_norm("32-true", x, w, b, g, (n,))
    ts = [torch.tensor(v, requires_grad=True) for v in (x, w, b)]
    ty, tm, tr = torch.native_layer_norm(ts[0], (n,), ts[1], ts[2], EPS)
    ty.backward(torch.tensor(g))
    m, r = tm.detach().double().numpy(), tr.detach().double().numpy()
    x64, w64, b64, g64 = (v.astype(np.float64) for v in (x, w, b, g))
    true_m = x64.mean(1, keepdims=True)
    true_r = 1 / np.sqrt(((x64 - true_m) ** 2).mean(1, keepdims=True) + EPS)
    slack = 2.0 ** -40
    # forward
    exact = (x64 - true_m) * true_r * w64 + b64
    terms = (np.abs(x64) + np.abs(m)) * r * np.abs(w64) + np.abs(b64)
    bound = (gamma(4) * terms * SECOND_ORDER + np.abs((x64 - m) * r * w64 + b64 - exact)
             + U * np.abs(exact) + slack * terms)
    assert np.all(np.abs(y - ty.detach().double().numpy()) <= bound)
    # dx
    x_hat = (x64 - true_m) * true_r
    gw = g64 * w64
    exact_dx = true_r * (gw - gw.mean(1, keepdims=True)
                         - x_hat * (gw * x_hat).mean(1, keepdims=True))
    e_torch, torch_formula = _torch_dx_bound(x64, w64, g64, m, r, n)
    magnitude = true_r * np.abs(gw).sum(1, keepdims=True) * (1 + np.abs(m) * true_r)
    bound = (e_torch * SECOND_ORDER + np.abs(torch_formula - exact_dx) + U * np.abs(exact_dx)
             + slack * magnitude)
    assert np.all(np.abs(dx - ts[0].grad.double().numpy()) <= bound)
    # dw, db
    exact_dw = (g64 * x_hat).sum(0)
    terms = (np.abs(g64) * (np.abs(x64) + np.abs(m)) * r).sum(0)
    bound = (gamma(x.shape[0] + 4) * terms * SECOND_ORDER + U * np.abs(exact_dw)
             + np.abs((g64 * (x64 - m) * r).sum(0) - exact_dw) + slack * terms)
    assert np.all(np.abs(dw - ts[1].grad.double().numpy()) <= bound)
    bound = (gamma(x.shape[0]) + U) * np.abs(g64).sum(0)
    assert np.all(np.abs(db - ts[2].grad.double().numpy()) <= bound)


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "bf16"])
def test_silu_is_correctly_rounded(fmt):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(300) * 4, rng.uniform(-110, 40, 100),
                        [2.0 ** -140, -2.0 ** -30, 1e-3, -17.5, -100.0, 88.0, 3e38]])
    t = Tensor(x, fmt)                     # silu of an fmt tensor is fmt (promote)
    out = ag.silu(t)
    assert out.fmt.name == fmt
    ours = backend.to_numpy(out.data)
    with gmpy2.context(precision=300):
        exact = [v / (1 + gmpy2.exp(-v))
                 for v in (gmpy2.mpfr(float(a)) for a in backend.to_numpy(t.data))]
    np.testing.assert_array_equal(ours.view(np.uint32), mpfr_rounded(exact, fmt).view(np.uint32))


def test_silu_special_values_as_pytorch():
    x = np.array([-np.inf, np.inf, np.nan, -0.0, 0.0], np.float32)
    out = backend.to_numpy(ag.silu(Tensor(x)).data)
    assert np.isnan(out[0]) and out[1] == np.inf and np.isnan(out[2])
    assert out[3] == 0 and np.signbit(out[3]) and not np.signbit(out[4])


def _torch_silu_bounds(x, dy):
    """First-order running error bounds of PyTorch's fp32 silu and its gradient, exp within
    1 ulp (relative 2u)."""
    e = np.exp(-x)
    s = 1 / (1 + e)
    e_denominator = 2 * U * e + U * (1 + e)           # exp, then the addition
    e_s = s * (e_denominator / (1 + e) + U)            # relative, then the division
    forward = np.abs(x) * s * (e_denominator / (1 + e) + U)
    e_t = e_s + U * (1 - s)
    q = x * (1 - s)
    e_q = np.abs(x) * e_t + U * np.abs(q)
    e_p = e_q + U * np.abs(1 + q)
    e_m = e_s * np.abs(1 + q) + s * e_p + U * s * np.abs(1 + q)
    backward = np.abs(dy) * e_m + U * np.abs(dy * s * (1 + q))
    return forward, backward


def test_silu_matches_torch_fp32_within_the_derived_bound():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(500) * 5, rng.uniform(-80, 80, 500)])
    x = x.astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    y = ag.silu(t)
    y.backward(Tensor(dy))
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.silu(tx)
    ty.backward(torch.tensor(dy))
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    s = 1 / (1 + np.exp(-x64))
    e_forward, e_backward = _torch_silu_bounds(x64, dy64)
    slack = 2.0 ** -40 * np.abs(x64) * s
    bound = e_forward * SECOND_ORDER + U * np.abs(x64 * s) + slack
    assert np.all(np.abs(backend.to_numpy(y.data) - ty.detach().double().numpy()) <= bound)
    exact_grad = dy64 * s * (1 + x64 * (1 - s))
    slack = 2.0 ** -40 * np.abs(dy64) * (1 + np.abs(x64))
    bound = e_backward * SECOND_ORDER + U * np.abs(exact_grad) + slack
    assert np.all(np.abs(backend.to_numpy(t.grad.data) - tx.grad.double().numpy()) <= bound)


def test_layer_norm_and_silu_layers():
    norm = nn.LayerNorm((2, 3))
    assert [(k, p.shape) for k, p in norm.named_parameters()] == [("weight", (2, 3)),
                                                                  ("bias", (2, 3))]
    assert np.all(backend.to_numpy(norm.weight.data) == 1)
    assert np.all(backend.to_numpy(norm.bias.data) == 0)
    assert nn.LayerNorm(4, elementwise_affine=False).parameters() == []
    assert [k for k, _ in nn.LayerNorm(4, bias=False).named_parameters()] == ["weight"]
    x = Tensor(np.arange(12.0).reshape(2, 2, 3))
    plain = backend.to_numpy(nn.LayerNorm((2, 3), elementwise_affine=False)(x).data)
    np.testing.assert_array_equal(plain, backend.to_numpy(norm(x).data))
    with pytest.raises(ValueError, match="does not end in"):
        nn.LayerNorm(5)(x)
    with pytest.raises(ValueError, match="positive integer"):
        nn.LayerNorm(0)
    silu = nn.SiLU()
    np.testing.assert_array_equal(backend.to_numpy(silu(x).data),
                                  backend.to_numpy(ag.silu(x).data))


def test_module_list_registers_its_modules():
    layers = nn.ModuleList([nn.Linear(3, 4, rng=0), nn.SiLU()])
    layers.append(nn.LayerNorm(4)).extend([nn.Linear(4, 2, rng=1)])
    assert len(layers) == 4 and isinstance(layers[-1], nn.Linear)
    assert [k for k, _ in layers.named_parameters()] == [
        "0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"]
    assert [type(m).__name__ for m in layers] == ["Linear", "SiLU", "LayerNorm", "Linear"]
    with pytest.raises(TypeError, match="takes Modules"):
        layers.append(ag.silu)
    with pytest.raises(NotImplementedError):
        layers(Tensor(np.ones((1, 3))))
    x = Tensor(np.ones((2, 3)))
    for layer in layers:
        x = layer(x)
    assert x.shape == (2, 2)
