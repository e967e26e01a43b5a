"""First-order error bounds through a model, for comparing fpsim with PyTorch's fp32 CPU
kernels layer by layer (``Bound``), used by test_attention.py and test_from_torch.py.

A ``Bound`` holds ``value``, the float64 evaluation of the exact model on the given inputs,
and ``err``, a bound on |ours - exact| + |torch - exact| elementwise, so |ours - torch| <=
err. Each layer adds its local errors (the two implementations' roundings at this layer, on
their own inputs) to the propagated ones (the exact layer's first-order sensitivity to its
input error, applied to the incoming ``err``); tests compare with ``err * (1 + 2**-10)``,
the margin covering the second-order terms. u = 2**-24, gamma_k = k u / (1 - k u).

Local errors, with K the length of a dot product:

- linear / matmul / conv2d: PyTorch, any summation order (blocked, FMA): gamma_(K+1) of
  sum |a||b| (+ |bias|); fpsim: the exact dot product rounded to fp32, plus the bias in
  fp32: gamma_2 of the same. Propagated: |W| err_x (and err_A |B| + |A| err_B for two
  computed operands).
- softmax along the last axis (PyTorch: s - max (u |s - max|), exp within 1 ulp (2u), the
  sum (gamma_n), the division, or a reciprocal and a product (2u)): p_i (u |s_i - m| + 4u +
  gamma_n + sum_j p_j (u |s_j - m| + 2u)); fpsim correctly rounded: u p_i. Propagated:
  p_i (err_i + sum_j p_j err_j).
- layer_norm: PyTorch, from its own mean m' and rstd r' on its input (taken by a forward
  hook, ``torch.native_layer_norm``): gamma_4 of (|x| + |m'|) r' |w| + |b|, plus
  |y(m', r') - y(m, r)|; fpsim: u |y| (its float64 evaluation rounded once). Propagated:
  |w_i| r (err_i + mean(err) + |x_hat_i| mean(|x_hat| err)).
- elementwise f (relu, max pool: Lipschitz 1, exact in both; silu: PyTorch x / (1 + exp(-x))
  within 4u relative (exp 2u, the addition and the division u each); exact GELU: PyTorch
  x * 0.5 * (1 + erf(x * sqrt(1/2))), erf within 1 ulp: 0.5 |x| ((2/sqrt(pi)) e**(-a*a) |a|
  2u + 2u |erf a| + u |1 + erf a|) + u |y|, a = x / sqrt 2); fpsim correctly rounded: u |y|.
  Propagated: the largest |f'| (1 for relu and max pool, 1.1 for silu, 1.13 for gelu) times
  err.
- avg_pool2d (PyTorch and fpsim: a k-term sum and a division): gamma_(k+1) of the mean of |x|
  each. Propagated: the mean of err.
The float64 evaluation's own errors (2**-53 K of the same magnitudes) are below 2**-29 of
each local term and inside the margin.
"""
from __future__ import annotations

import math

import numpy as np

U = 2.0 ** -24
MARGIN = 1 + 2.0 ** -10


def gamma(k):
    return k * U / (1 - k * U)


class Bound:
    def __init__(self, value, err=None):
        self.value = np.asarray(value, np.float64)
        self.err = np.zeros_like(self.value) if err is None else np.asarray(err, np.float64)

    def map(self, fn):
        """A structural op (reshape, transpose, slicing) on value and err alike."""
        return Bound(fn(self.value), fn(self.err))

    def holds(self, ours, theirs) -> float:
        """The largest |ours - theirs| / bound (<= 1 when the bound holds)."""
        diff = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))
        bound = self.err * MARGIN
        return float(np.max(np.where(diff == 0, 0.0, diff / np.maximum(bound, 1e-300))))


def _t(torch, a):
    return torch.from_numpy(np.ascontiguousarray(a, np.float64))


def linear(x: Bound, w, b=None) -> Bound:
    w = np.asarray(w, np.float64)
    b = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    k = w.shape[1]
    value = x.value @ w.T + b
    terms = np.abs(x.value) @ np.abs(w).T + np.abs(b)
    return Bound(value, x.err @ np.abs(w).T + (gamma(k + 1) + gamma(2)) * terms)


def matmul(a: Bound, b: Bound) -> Bound:
    k = a.value.shape[-1]
    value = a.value @ b.value
    terms = np.abs(a.value) @ np.abs(b.value)
    err = a.err @ np.abs(b.value) + np.abs(a.value) @ b.err + a.err @ b.err
    return Bound(value, err + (gamma(k + 1) + gamma(2)) * terms)


def scale(x: Bound, factor: float) -> Bound:
    """x * factor, factor a power of two: exact in both."""
    assert math.frexp(factor)[0] == 0.5
    return Bound(x.value * factor, x.err * factor)


def masked(x: Bound, drop) -> Bound:
    """masked_fill with -inf: exact in both; a masked element has no error."""
    return Bound(np.where(drop, -np.inf, x.value), np.where(drop, 0.0, x.err))


def softmax(s: Bound) -> Bound:
    n = s.value.shape[-1]
    m = np.max(s.value, -1, keepdims=True)
    e = np.exp(s.value - m)
    p = e / e.sum(-1, keepdims=True)
    shift = np.where(np.isinf(s.value), 0.0, np.abs(s.value - m))
    per = U * shift + 2 * U
    local = p * (per + 2 * U + gamma(n) + (p * per).sum(-1, keepdims=True)) + U * p
    err = np.where(np.isinf(s.value), 0.0, s.err)
    return Bound(p, p * (err + (p * err).sum(-1, keepdims=True)) + local)


def layer_norm(x: Bound, w, b, torch_input, eps=1e-5) -> Bound:
    """Over the last axis; ``torch_input``: the fp32 values PyTorch's layer received."""
    import torch

    n = x.value.shape[-1]
    w, b = np.asarray(w, np.float64), np.asarray(b, np.float64)
    m = x.value.mean(-1, keepdims=True)
    r = 1 / np.sqrt(((x.value - m) ** 2).mean(-1, keepdims=True) + eps)
    x_hat = (x.value - m) * r
    value = x_hat * w + b
    err = np.abs(w) * r * (x.err + x.err.mean(-1, keepdims=True)
                           + np.abs(x_hat) * (np.abs(x_hat) * x.err).mean(-1, keepdims=True))
    xt = np.asarray(torch_input, np.float64)
    _, tm, tr = torch.native_layer_norm(torch.from_numpy(np.asarray(torch_input, np.float32)),
                                        (n,), None, None, eps)
    tm = tm.double().numpy().reshape(m.shape)
    tr = tr.double().numpy().reshape(m.shape)
    mt = xt.mean(-1, keepdims=True)
    rt = 1 / np.sqrt(((xt - mt) ** 2).mean(-1, keepdims=True) + eps)
    local = (gamma(4) * ((np.abs(xt) + np.abs(tm)) * tr * np.abs(w) + np.abs(b))
             + np.abs((xt - tm) * tr - (xt - mt) * rt) * np.abs(w) + U * np.abs(value))
    return Bound(value, err + local)


def relu(x: Bound) -> Bound:
    return Bound(np.maximum(x.value, 0.0), x.err)


def silu(x: Bound) -> Bound:
    value = x.value / (1 + np.exp(-x.value))
    return Bound(value, 1.1 * x.err + 5 * U * np.abs(value))


def gelu(x: Bound) -> Bound:
    erf = np.vectorize(math.erf)
    a = x.value / math.sqrt(2)
    value = 0.5 * x.value * (1 + erf(a))
    local = 0.5 * np.abs(x.value) * (2 / math.sqrt(math.pi) * np.exp(-a * a) * np.abs(a) * 2 * U
                                     + 2 * U * np.abs(erf(a)) + U * np.abs(1 + erf(a)))
    return Bound(value, 1.13 * x.err + local + U * np.abs(value))


def add(a: Bound, c: Bound) -> Bound:
    value = a.value + c.value
    return Bound(value, a.err + c.err + 2 * U * np.abs(value))


def conv2d(x: Bound, w, b, stride, padding, dilation, groups) -> Bound:
    import torch
    import torch.nn.functional as F

    w = np.asarray(w, np.float64)
    b = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64)
    k = int(np.prod(w.shape[1:]))

    def conv(a, weights, bias):
        return F.conv2d(_t(torch, a), _t(torch, weights), _t(torch, bias), stride, padding,
                        dilation, groups).numpy()

    value = conv(x.value, w, b)
    terms = conv(np.abs(x.value), np.abs(w), np.abs(b))
    return Bound(value, conv(x.err, np.abs(w), np.zeros_like(b))
                 + (gamma(k + 1) + gamma(2)) * terms)


def max_pool2d(x: Bound, kernel, stride, padding) -> Bound:
    import torch
    import torch.nn.functional as F

    def pool(a):
        return F.max_pool2d(_t(torch, a), kernel, stride, padding).numpy()

    return Bound(pool(x.value), pool(x.err))


def avg_pool2d(x: Bound, kernel, stride, padding) -> Bound:
    import torch
    import torch.nn.functional as F

    def pool(a):
        return F.avg_pool2d(_t(torch, a), kernel, stride, padding).numpy()

    k = int(np.prod(np.broadcast_to(kernel, (2,))))
    return Bound(pool(x.value), pool(x.err) + 2 * gamma(k + 1) * pool(np.abs(x.value)))


def batch_norm_eval(x: Bound, mean, var, w, b, eps=1e-5) -> Bound:
    """Eval mode: an affine map per channel. PyTorch: r' = 1/sqrt(var + eps) (gamma_3), then
    4 roundings on (|x| + |mean|) r |w| + |b|; fpsim u |y|."""
    shape = (1, -1, 1, 1)
    mean, var, w, b = (np.asarray(a, np.float64).reshape(shape) for a in (mean, var, w, b))
    r = 1 / np.sqrt(var + eps)
    value = (x.value - mean) * r * w + b
    terms = (np.abs(x.value) + np.abs(mean)) * r * np.abs(w) + np.abs(b)
    return Bound(value, np.abs(w) * r * x.err + (gamma(4) + gamma(3)) * terms
                 + U * np.abs(value))
