"""where, masked_fill and the tanh GELU (``gelu(x, "tanh")``, ``nn.GELU("tanh")``).

where / masked_fill move values without arithmetic, so they equal PyTorch bit for bit,
forward and backward (NaN payloads and signed zeros included).

The tanh GELU is the real number 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))), with the
real constants, rounded once: checked against MPFR (gmpy2 at 300 bits). Against PyTorch's
fp32 CPU kernel (Activation.cpp, GeluKernelImpl / GeluBackwardKernelImpl with
approximate="tanh"), which evaluates, each step an fp32 operation::

    forward:  inner = kBeta * (x + kKappa * (x * x * x));  y = (0.5 * x) * (1 + tanh(inner))
    backward: x_sq = x * x; inner = kBeta * (x + kKappa * (x_sq * x)); t = tanh(inner)
              d = 0.5 * (1 + t) + ((0.5 * x) * (1 - t * t)) * (kBeta * (1 + 3 * kKappa * x_sq))
              dx = dy * d

with kBeta = float32(sqrt(2/pi)), kKappa = float32(0.044715) and tanh within 2 ulps (glibc's
stated maximum for tanhf on x86_64; SLEEF's u10 vector tanh, 1 ulp), the bound is the
first-order running error bound of those steps (``Running``: every fp32 rounding adds
u (|value| + error), u = 2**-24; tanh carries its input's error times the largest sech**2 on
the input's interval, plus 2 ulps <= 4u |t|), times 1 + 2**-10 for second-order terms, plus
our own rounding (u |exact|) and 2**-40 of the magnitudes for the float64 evaluations.
"""
import math

import numpy as np
import pytest

import fpsim.autograd as ag
from fpsim import backend, nn
from fpsim.autograd import Tensor, use_policy

U = 2.0 ** -24
SECOND_ORDER = 1 + 2.0 ** -10
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
KAPPA = 0.044715


def _np(t):
    return backend.to_numpy(t.data)


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


# --- where / masked_fill -------------------------------------------------------------------

def test_where_and_masked_fill_equal_torch_bit_for_bit():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    a[0, 0], a[1, 1] = -0.0, np.float32(np.nan)
    b = rng.standard_normal((4,)).astype(np.float32)
    cond = rng.random((3, 4)) < 0.5
    g = rng.standard_normal((3, 4)).astype(np.float32)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    fa, fb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
    y = ag.where(cond, fa, fb)
    ty = torch.where(torch.tensor(cond), ta, tb)
    np.testing.assert_array_equal(_bits(_np(y)), _bits(ty.detach().numpy()))
    y.backward(Tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_array_equal(_bits(_np(fa.grad)), _bits(ta.grad.numpy()))
    np.testing.assert_array_equal(_bits(_np(fb.grad)), _bits(tb.grad.numpy()))

    mask = np.array([True, False, False, True])
    fx, tx = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    y = fx.masked_fill(mask, -np.inf)
    ty = tx.masked_fill(torch.tensor(mask), float("-inf"))
    np.testing.assert_array_equal(_bits(_np(y)), _bits(ty.detach().numpy()))
    y.backward(Tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_array_equal(_bits(_np(fx.grad)), _bits(tx.grad.numpy()))


def test_scalars_round_into_the_output_format_as_torch():
    torch = pytest.importorskip("torch")
    x = np.array([1.0, 2.0, 3.0], np.float32)
    cond = np.array([True, False, True])
    half = torch.tensor(x, dtype=torch.float16)
    for value in (0.1, 1e6, -1e-8):
        ours = ag.where(cond, Tensor(x, "fp16"), value)
        theirs = torch.where(torch.tensor(cond), half, value).float().numpy()
        assert ours.fmt.name == "fp16"
        np.testing.assert_array_equal(_np(ours), theirs)
    ours = Tensor(x, "fp16").masked_fill(cond, 0.1)
    np.testing.assert_array_equal(_np(ours), half.masked_fill(torch.tensor(cond), 0.1).float())
    with pytest.raises(ValueError, match="without overflow"):
        Tensor(x, "fp16").masked_fill(cond, 1e6)
    with pytest.raises(RuntimeError, match="without overflow"):
        half.masked_fill(torch.tensor(cond), 1e6)


def test_select_formats_follow_promotion_and_policy():
    cond = np.array([True, False])
    low = Tensor([1.0, 2.0], "fp16")
    wide = Tensor([3.0, 4.0], "fp32")
    with use_policy("16-mixed"):
        assert ag.where(cond, low, wide).fmt.name == "fp32"     # promote, as torch.where
        assert ag.where(cond, low, low).fmt.name == "fp16"
        assert ag.masked_fill(low, cond, 0.5).fmt.name == "fp16"
    with use_policy("params=fp32,compute=bf16,output=fp32"):     # jmp: everything in bf16
        assert ag.where(cond, low, wide).fmt.name == "bf16"


def test_select_errors():
    x = Tensor(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="boolean"):
        ag.where(np.array([1, 0, 1]), x, x)
    with pytest.raises(ValueError, match="broadcast"):
        ag.where(np.array([True, False]), x, x)
    with pytest.raises(ValueError, match="does not broadcast"):
        x.masked_fill(np.ones((3, 3), bool), 0.0)
    with pytest.raises(TypeError, match="real scalar"):
        x.masked_fill(np.ones(3, bool), x)
    with pytest.raises(TypeError, match="tensor"):
        ag.where(np.ones(3, bool), 1.0, 2.0)


# --- the tanh GELU -------------------------------------------------------------------------

def test_gelu_tanh_is_the_exact_formula_rounded_once():
    gmpy2 = pytest.importorskip("gmpy2")
    from mpfr_oracle import mpfr_rounded

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(300) * 3, rng.uniform(-17, 9, 200),
                        [2.0 ** -140, -(2.0 ** -30), 1e-3, -5.0, -12.0, -16.0, 20.0, 3e38,
                         -3e38, 0.0, -0.0]])
    for fmt in ("fp32", "fp16", "bf16"):
        t = Tensor(x, fmt)
        out = ag.gelu(t, approximate="tanh")
        assert out.fmt.name == fmt
        with gmpy2.context(precision=300):
            c = gmpy2.sqrt(2 / gmpy2.const_pi())
            k = gmpy2.mpfr("0.044715")
            exact = [v * (1 + gmpy2.tanh(c * (v + k * v * v * v))) / 2
                     for v in (gmpy2.mpfr(float(a)) for a in _np(t))]
        np.testing.assert_array_equal(_bits(_np(out)), _bits(mpfr_rounded(exact, fmt)))


class Running:
    """A float64 value of an exact quantity and a bound on the error of PyTorch's fp32
    evaluation of it (see the module doc)."""

    def __init__(self, value, err):
        self.value, self.err = np.asarray(value, np.float64), np.asarray(err, np.float64)

    @classmethod
    def rounded(cls, value, err):
        return cls(value, err + U * (np.abs(value) + err))

    @classmethod
    def constant(cls, exact):
        return cls(exact, abs(float(np.float32(exact)) - exact))

    def __add__(self, other):
        other = other if isinstance(other, Running) else Running(other, 0.0)
        return Running.rounded(self.value + other.value, self.err + other.err)

    def __rsub__(self, one):
        return Running.rounded(one - self.value, self.err)

    def __mul__(self, other):
        other = other if isinstance(other, Running) else Running(other, 0.0)
        err = (np.abs(self.value) * other.err + np.abs(other.value) * self.err
               + self.err * other.err)
        return Running.rounded(self.value * other.value, err)

    def half(self):                       # 0.5 * x: exact in the normal range
        return Running(0.5 * self.value, 0.5 * self.err)

    def tanh(self):
        t = np.tanh(self.value)
        nearest = np.maximum(np.abs(self.value) - self.err, 0.0)   # largest sech**2 there
        err = self.err / np.cosh(nearest) ** 2
        return Running(t, err + 4 * U * (np.abs(t) + err))


def _torch_gelu_tanh_running(x):
    x = Running(x, 0.0)
    beta, kappa = Running.constant(SQRT_2_OVER_PI), Running.constant(KAPPA)
    x_sq = x * x
    inner = beta * (x + kappa * (x_sq * x))
    t = inner.tanh()
    forward = x.half() * (t + 1.0)
    three_kappa = kappa * 3.0
    derivative = ((t + 1.0).half()
                  + (x.half() * (1.0 - t * t)) * (beta * (three_kappa * x_sq + 1.0)))
    return forward, derivative


def test_gelu_tanh_matches_torch_fp32_within_the_derived_bound():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal(1000) * 3, rng.uniform(-10, 10, 1000)])
    x = x[np.abs(x) > 2.0 ** -60].astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    y = ag.gelu(t, "tanh")
    y.backward(Tensor(dy))
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.gelu(tx, approximate="tanh")
    ty.backward(torch.tensor(dy))

    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    forward, derivative = _torch_gelu_tanh_running(x64)
    exact = forward.value
    slack = 2.0 ** -40 * np.abs(x64)
    bound = forward.err * SECOND_ORDER + U * np.abs(exact) + slack
    diff = np.abs(_np(y) - ty.detach().double().numpy())
    assert np.all(diff <= bound)
    grad = Running(dy64, 0.0) * derivative
    slack = 2.0 ** -40 * np.abs(dy64) * (1 + x64 * x64)
    bound = grad.err * SECOND_ORDER + U * np.abs(grad.value) + slack
    diff = np.abs(_np(t.grad) - tx.grad.double().numpy())
    assert np.all(diff <= bound)


def test_gelu_tanh_under_16_mixed_and_the_layer():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6))
    layer = nn.GELU(approximate="tanh")
    assert repr(layer) == "GELU(approximate='tanh')"
    with use_policy("16-mixed"):
        h = ag.linear(Tensor(x), Tensor(np.eye(6)))        # fp16, as autocast's linear
        y = layer(h)
    assert (h.fmt.name, y.fmt.name) == ("fp16", "fp16")    # gelu is on neither autocast list
    np.testing.assert_array_equal(_np(y), _np(ag.gelu(Tensor(_np(h), "fp16"), "tanh")))
    with pytest.raises(ValueError, match="approximate"):
        ag.gelu(Tensor(x), "erf")
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("erf")
    np.testing.assert_array_equal(_np(nn.GELU()(Tensor(x))), _np(ag.gelu(Tensor(x))))


def test_gelu_tanh_fallback_and_hard_cases_against_mpfr():
    """The Decimal fallback (``forced_fallback``: every element the proxies do not decide
    goes there) and the inputs the float64 certificate cannot decide (x an odd float32
    subnormal: x/2 is an fp32 midpoint, the value a relative 0.8 x above it; fp16 midpoints
    beyond y = 40, where the value lies a relative e**-y below x) give MPFR's rounding."""
    gmpy2 = pytest.importorskip("gmpy2")
    from mpfr_oracle import mpfr_rounded

    import fpsim.exact as fx
    from fpsim.formats import get
    from fpsim.rounding import round_to

    rng = np.random.default_rng(6)
    odd_bits = np.array([1, 3, 0x80000005, 12345], np.uint32).view(np.float32)
    cases = {"fp32": np.concatenate([odd_bits, rng.standard_normal(40).astype(np.float32) * 4]),
             "fp16": np.array([25.0078125, -3.0009765625, 2.0 ** -25 * 3, 7.00390625],
                              np.float32),
             "bf16": rng.uniform(-15, 9, 40).astype(np.float32)}
    for fmt, x in cases.items():
        with gmpy2.context(precision=300):
            c = gmpy2.sqrt(2 / gmpy2.const_pi())
            k = gmpy2.mpfr("0.044715")
            exact = [v * (1 + gmpy2.tanh(c * (v + k * v * v * v))) / 2
                     for v in (gmpy2.mpfr(float(a)) for a in x)]
        want = _bits(mpfr_rounded(exact, fmt))
        before = fx.FALLBACK_COUNT["elements"]
        got = round_to(fx.cr_gelu_tanh(x, get(fmt)), get(fmt)).astype(np.float32)
        np.testing.assert_array_equal(_bits(got), want)
        if fmt == "fp32":
            assert fx.FALLBACK_COUNT["elements"] - before >= 4     # the subnormals settled
        with fx.forced_fallback():
            forced = round_to(fx.cr_gelu_tanh(x, get(fmt)), get(fmt)).astype(np.float32)
        np.testing.assert_array_equal(_bits(forced), want)
